//! Each fault of the proxy against a small echo server on the test's runtime.

use std::io::ErrorKind;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// A server on a free loopback port that writes `greeting` to each connection, then echoes
/// what it reads; counts the bytes it received.
struct EchoServer {
    addr: SocketAddr,
    received: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl EchoServer {
    async fn start(greeting: &'static [u8]) -> EchoServer {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(AtomicU64::new(0));
        let counted = received.clone();
        let task = tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                let counted = counted.clone();
                tokio::spawn(async move {
                    let _ = socket.write_all(greeting).await;
                    let mut buf = [0; 4096];
                    loop {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                counted.fetch_add(n as u64, Ordering::SeqCst);
                                if socket.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        EchoServer {
            addr,
            received,
            task,
        }
    }

    fn received(&self) -> u64 {
        self.received.load(Ordering::SeqCst)
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An echo server, a proxy to it, and a connection through the proxy that has made one round
/// trip.
async fn working_link() -> (EchoServer, FaultProxy, TcpStream) {
    let server = EchoServer::start(b"").await;
    let proxy = FaultProxy::start(server.addr);
    let mut stream = connect(&proxy).await;
    round_trip(&mut stream, b"before").await;
    (server, proxy, stream)
}

const SHORT: Duration = Duration::from_secs(1);

async fn connect(proxy: &FaultProxy) -> TcpStream {
    TcpStream::connect(proxy.addr()).await.unwrap()
}

/// Writes `bytes` and reads exactly as many back within 5 s.
async fn round_trip(stream: &mut TcpStream, bytes: &[u8]) {
    stream.write_all(bytes).await.unwrap();
    let mut back = vec![0; bytes.len()];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut back))
        .await
        .expect("an echo within 5 s")
        .expect("read the echo");
    assert_eq!(back, bytes);
}

/// Asserts nothing at all comes back within `period`: no byte, no EOF, no error.
async fn assert_silent(stream: &mut TcpStream, period: Duration, what: &str) {
    let mut buf = [0; 64];
    if let Ok(got) = tokio::time::timeout(period, stream.read(&mut buf)).await {
        panic!("{what}: expected silence for {period:?}, read {got:?}");
    }
}

/// Reads until an error or EOF (within 5 s) and returns which.
async fn read_end(stream: &mut TcpStream) -> std::io::Result<usize> {
    let mut buf = [0; 64];
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) => return Ok(0),
                Ok(_) => continue,
                Err(e) => return Err(e),
            }
        }
    })
    .await
    .expect("the connection ended within 5 s")
}

#[tokio::test]
async fn an_open_link_forwards_both_ways_and_counts_the_bytes() {
    let (_server, proxy, stream) = working_link().await;
    // The proxy counts a write right after it made it: the client may be faster.
    let counts = |s: ProxyStats| (s.accepted, s.open, s.to_server, s.to_client);
    until(|| counts(proxy.stats()) == (1, 1, 6, 6), "the counts").await;
    drop(stream);
    until(
        || proxy.stats().open == 0,
        "the closed connection uncounted",
    )
    .await;
}

/// Waits up to a second for `check`.
async fn until(check: impl Fn() -> bool, what: &str) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < SHORT, "{what}: not within {SHORT:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_black_holed_link_delivers_zero_bytes_in_a_second_and_the_client_sees_no_error() {
    let (server, proxy, mut old) = working_link().await;
    let received = server.received();

    proxy.blackhole();
    old.write_all(&[7; 1000])
        .await
        .expect("writes still succeed");
    assert_silent(&mut old, SHORT, "an open connection in the black hole").await;
    let mut new = connect(&proxy).await;
    new.write_all(b"anyone?")
        .await
        .expect("a new connection is accepted");
    assert_silent(&mut new, Duration::from_millis(300), "a new one").await;
    assert_eq!(server.received(), received, "nothing reached the server");
    assert!(proxy.stats().dropped >= 1007, "{:?}", proxy.stats());

    proxy.heal_after(Duration::from_millis(200));
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(proxy.is_open());
    let mut healed = connect(&proxy).await;
    round_trip(&mut healed, b"after").await;
    old.write_all(b"still there?").await.unwrap();
    assert_silent(
        &mut old,
        Duration::from_millis(300),
        "a black-holed connection after the heal",
    )
    .await;
}

#[tokio::test]
async fn a_reset_gives_the_client_econnreset_and_new_connections_pass() {
    let (_server, proxy, mut stream) = working_link().await;
    proxy.reset();
    let err = read_end(&mut stream).await.expect_err("a reset, not EOF");
    assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
    assert!(proxy.stats().resets >= 1);
    let mut next = connect(&proxy).await;
    round_trip(&mut next, b"y").await;
}

#[tokio::test]
async fn latency_adds_at_least_the_delay_each_way_and_keeps_the_order() {
    let (_server, proxy, mut stream) = working_link().await;

    proxy.latency(Duration::from_millis(100), Duration::from_millis(20));
    let start = Instant::now();
    round_trip(&mut stream, b"slow").await;
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(160) && took < Duration::from_secs(2),
        "a round trip at 100 ± 20 ms each way took {took:?}"
    );
    // Many small chunks, each with its own jitter: they still arrive in order.
    let sent: Vec<u8> = (0..200u8).collect();
    for chunk in sent.chunks(4) {
        stream.write_all(chunk).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut back = vec![0; sent.len()];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back, sent);

    proxy.heal();
    proxy.set_latency(
        Direction::ToClient,
        Duration::from_millis(200),
        Duration::ZERO,
    );
    let start = Instant::now();
    round_trip(&mut stream, b"one way").await;
    assert!(start.elapsed() >= Duration::from_millis(200));
}

#[tokio::test]
async fn a_half_close_gives_the_client_eof_while_its_bytes_still_reach_the_server() {
    let (server, proxy, mut stream) = working_link().await;
    proxy.half_close();
    assert_eq!(read_end(&mut stream).await.expect("EOF, not an error"), 0);
    stream
        .write_all(b"0123456789")
        .await
        .expect("the client's side is still open");
    until(|| server.received() == 16, "the bytes after the half-close").await;
    let mut next = connect(&proxy).await;
    round_trip(&mut next, b"y").await;
}

#[tokio::test]
async fn a_cut_resets_open_and_new_connections_until_it_heals() {
    let (_server, proxy, mut open) = working_link().await;

    proxy.cut_for(Duration::from_millis(500));
    let err = read_end(&mut open).await.expect_err("a reset");
    assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
    assert_reset_at_once(&proxy, "a connection during the cut").await;
    assert!(!proxy.is_open());
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(proxy.is_open(), "healed after the cut's period");
    let mut after = connect(&proxy).await;
    round_trip(&mut after, b"z").await;
}

#[tokio::test]
async fn a_server_that_refuses_is_a_reset_and_set_upstream_reroutes_new_connections() {
    let first = EchoServer::start(b"first ").await;
    let second = EchoServer::start(b"second").await;
    let proxy = FaultProxy::start(first.addr);
    let mut stream = connect(&proxy).await;
    let mut greeting = [0; 6];
    stream.read_exact(&mut greeting).await.unwrap();
    assert_eq!(&greeting, b"first ");

    proxy.set_upstream(second.addr);
    let mut rerouted = connect(&proxy).await;
    rerouted.read_exact(&mut greeting).await.unwrap();
    assert_eq!(&greeting, b"second");
    round_trip(&mut stream, b"old path").await;

    // Nobody listens there.
    let gone = StdListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    proxy.set_upstream(gone.local_addr().unwrap());
    drop(gone);
    assert_reset_at_once(&proxy, "a connection to a server that refuses").await;
}

/// A new connection through `proxy` is reset at once: its connect fails with a reset (when the
/// RST beats the handshake's end), or its first read does.
async fn assert_reset_at_once(proxy: &FaultProxy, what: &str) {
    let end = match TcpStream::connect(proxy.addr()).await {
        Ok(mut stream) => {
            let _ = stream.write_all(b"y").await;
            read_end(&mut stream).await
        }
        Err(e) => Err(e),
    };
    assert!(
        matches!(&end, Err(e) if e.kind() == ErrorKind::ConnectionReset),
        "{what}: {end:?}"
    );
}

/// The proxy's thread, by the name it gives it (`proxy-<port>`), among this process's threads.
fn thread_running(port: u16) -> bool {
    let name = format!("proxy-{port}");
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .any(|task| {
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|comm| comm.trim() == name)
        })
}

#[tokio::test]
async fn dropping_the_proxy_closes_its_connections_ends_its_thread_and_frees_its_port() {
    let (_server, proxy, mut stream) = working_link().await;
    let port = proxy.port();
    proxy.latency(Duration::from_secs(60), Duration::ZERO);
    proxy.heal_after(Duration::from_secs(60));
    assert!(thread_running(port));

    drop(proxy);
    assert!(!thread_running(port), "the thread ended with the handle");
    assert!(read_end(&mut stream).await.is_ok_and(|n| n == 0), "closed");
    let refused = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await;
    assert!(
        matches!(&refused, Err(e) if e.kind() == ErrorKind::ConnectionRefused),
        "{refused:?}"
    );
}
