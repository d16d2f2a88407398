//! The connection against a scripted server on loopback: these check the connection's own
//! rules (order, reply routing, reconnection); the engine suites run it against real
//! servers.
use super::state::CALLER_BATCH;
use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Counts the connection's reports of a lost connection.
#[derive(Default)]
struct Losses(std::sync::atomic::AtomicUsize);

impl Wakeups for Losses {
    fn wake(&self, _key: &str) {}
    fn wake_all(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Losses {
    fn seen(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

fn wire_to(port: u16, retries: usize) -> Wire {
    wire_telling(port, retries, Arc::new(Losses::default()))
}

fn wire_telling(port: u16, retries: usize, losses: Arc<Losses>) -> Wire {
    use redis::IntoConnectionInfo;
    let info = format!("redis://127.0.0.1:{port}")
        .into_connection_info()
        .unwrap();
    Wire::for_server(
        &info,
        Duration::from_secs(5),
        retries,
        Duration::from_millis(100),
        losses,
    )
    .expect("a TCP address has a wire")
}

/// Accepts one connection, answers the handshake, and returns it.
async fn accept(listener: &TcpListener) -> tokio::net::TcpStream {
    let (mut sock, _) = listener.accept().await.unwrap();
    let hello = redis::cmd("HELLO").arg(3).get_packed_command();
    let mut buf = vec![0; hello.len()];
    sock.read_exact(&mut buf).await.unwrap();
    assert_eq!(buf, hello);
    sock.write_all(b"%1\r\n+server\r\n+redis\r\n")
        .await
        .unwrap();
    sock
}

/// Reads exactly the bytes of `cmds` from `sock`, in that order.
async fn expect_commands(sock: &mut tokio::net::TcpStream, cmds: &[&redis::Cmd]) {
    let want: Vec<u8> = cmds.iter().flat_map(|c| c.get_packed_command()).collect();
    let mut got = vec![0; want.len()];
    sock.read_exact(&mut got).await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(&want)
    );
}

/// While the connection's task has yet to take the queued requests (it yields once
/// first), the caller whose request fills a batch writes the batch itself: on a
/// current-thread runtime, where the task cannot run between the calls, a first request
/// and a full batch behind it reach the server before the runtime runs anything else.
#[test]
fn a_full_batch_is_written_by_the_caller_that_fills_it() {
    let batch = CALLER_BATCH;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let (told, counted) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = TcpListener::from_std(listener).unwrap();
            let mut sock = accept(&listener).await;
            let ping = redis::cmd("PING").get_packed_command();
            let mut first = vec![0; ping.len()];
            sock.read_exact(&mut first).await.unwrap();
            sock.write_all(b"+PONG\r\n").await.unwrap();
            // Then what arrives until the batch is complete, or for a second.
            let mut got = Vec::new();
            let until = tokio::time::Instant::now() + Duration::from_secs(1);
            while got.len() < (batch + 1) * ping.len() {
                let mut buf = [0; 4096];
                match tokio::time::timeout_at(until, sock.read(&mut buf)).await {
                    Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
                    _ => break,
                }
            }
            told.send(got.len() / ping.len()).unwrap();
            let rest = batch + 1 - got.len() / ping.len();
            let mut buf = vec![0; rest * ping.len()];
            sock.read_exact(&mut buf).await.unwrap();
            sock.write_all(&b"+PONG\r\n".repeat(batch + 1))
                .await
                .unwrap();
            let _ = sock.read(&mut [0; 16]).await;
        });
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let wire = wire_to(port, 0);
        wire.ping().await.expect("the first ping");
        let ping = redis::cmd("PING");
        let caller = wire.caller();
        let answers: Vec<_> = (0..=batch)
            .map(|_| caller.send_one(Packed::Cmd(&ping)))
            .collect();
        // Blocks the runtime: only what the callers wrote has gone out.
        let arrived = counted.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(
            arrived,
            batch + 1,
            "the first request and a full batch of {batch} are written by their callers"
        );
        for answer in answers {
            assert_eq!(answer.await.unwrap(), Value::SimpleString("PONG".into()));
        }
        drop(wire);
    });
    // The connection's task (and its socket) goes with the runtime; the server then ends.
    drop(rt);
    server.join().unwrap();
}

#[tokio::test]
async fn requests_reach_the_server_in_the_order_they_were_made_not_polled() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let wire = wire_to(listener.local_addr().unwrap().port(), 0);
    let server = tokio::spawn(async move {
        let mut sock = accept(&listener).await;
        let (a, b, c) = (
            redis::cmd("GET").arg("a").clone(),
            redis::cmd("GET").arg("b").clone(),
            redis::cmd("GET").arg("c").clone(),
        );
        expect_commands(&mut sock, &[&a]).await;
        sock.write_all(b"$1\r\nA\r\n").await.unwrap();
        expect_commands(&mut sock, &[&b, &c]).await;
        sock.write_all(b"$1\r\nB\r\n$1\r\nC\r\n").await.unwrap();
        sock
    });
    let caller = wire.caller();
    let first = caller.send(Packed::Cmd(redis::cmd("GET").arg("a")), 1, 1);
    assert_eq!(first.await.unwrap(), vec![Value::BulkString(b"A".to_vec())]);
    // Made in the order b, c; polled c first: the server still sees b first, and each
    // answer goes to its own request.
    let b = caller.send(Packed::Cmd(redis::cmd("GET").arg("b")), 1, 1);
    let c = caller.send(Packed::Cmd(redis::cmd("GET").arg("c")), 1, 1);
    assert_eq!(c.await.unwrap(), vec![Value::BulkString(b"C".to_vec())]);
    assert_eq!(b.await.unwrap(), vec![Value::BulkString(b"B".to_vec())]);
    drop(server.await.unwrap());
}

#[tokio::test]
async fn a_pipeline_answers_its_last_replies_and_server_errors_stay_values() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let wire = wire_to(listener.local_addr().unwrap().port(), 0);
    let server = tokio::spawn(async move {
        let mut sock = accept(&listener).await;
        let mut buf = vec![0; 4096];
        let _ = sock.read(&mut buf).await.unwrap();
        // Split mid-reply: the connection waits for the rest.
        sock.write_all(b"+OK\r\n:4").await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        sock.write_all(b"2\r\n-ERR nope\r\n").await.unwrap();
        sock
    });
    let mut pipe = redis::pipe();
    pipe.cmd("MULTI").cmd("INCR").arg("n").cmd("BAD");
    let replies = wire
        .caller()
        .send(Packed::Pipeline(&pipe), 3, 2)
        .await
        .unwrap();
    assert_eq!(replies[0], Value::Int(42));
    assert!(replies[1].clone().extract_error().is_err());
    drop(server.await.unwrap());
}

#[tokio::test]
async fn a_lost_connection_fails_what_was_in_flight_is_reported_and_the_next_request_reconnects() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let losses = Arc::new(Losses::default());
    let wire = wire_telling(listener.local_addr().unwrap().port(), 0, losses.clone());
    let caller = wire.caller();
    let get = |k: &str| caller.send(Packed::Cmd(redis::cmd("GET").arg(k)), 1, 1);
    let in_flight = get("a");
    let mut sock = accept(&listener).await;
    expect_commands(&mut sock, &[redis::cmd("GET").arg("a")]).await;
    drop(sock);
    let err = in_flight.await.unwrap_err();
    assert!(err.is_connection_dropped(), "{err}");
    // Reported before the requests in flight fail (a Redlock node's run id is read again
    // before the next grant counts).
    assert_eq!(losses.seen(), 1);

    // Made while down, one of them given up before the connection is back: that one is
    // not sent.
    let gone = get("gone");
    drop(gone);
    let kept = get("kept");
    let mut sock = accept(&listener).await;
    expect_commands(&mut sock, &[redis::cmd("GET").arg("kept")]).await;
    sock.write_all(b"$1\r\nK\r\n").await.unwrap();
    assert_eq!(kept.await.unwrap(), vec![Value::BulkString(b"K".to_vec())]);
    drop(sock);
    // An idle connection lost is reported too (nothing was in flight to fail).
    tokio::time::timeout(Duration::from_secs(5), async {
        while losses.seen() < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the idle connection's loss is reported");
    drop(wire);
}

/// A server on a thread of its own that answers the handshake and every `PING`.
fn pong_server() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = TcpListener::from_std(listener).unwrap();
            loop {
                let mut sock = accept(&listener).await;
                tokio::spawn(async move {
                    let ping = redis::cmd("PING").get_packed_command();
                    let mut buf = vec![0; ping.len()];
                    while sock.read_exact(&mut buf).await.is_ok() {
                        assert_eq!(buf, ping);
                        if sock.write_all(b"+PONG\r\n").await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
    });
    port
}

#[test]
fn a_wire_outlives_the_tokio_runtime_its_task_ran_on() {
    let port = pong_server();
    let wire = wire_to(port, 0);
    let first = tokio::runtime::Runtime::new().unwrap();
    first.block_on(wire.ping()).unwrap();
    drop(first);
    // Its task went with the first runtime: the next request starts one on its own.
    let second = tokio::runtime::Runtime::new().unwrap();
    second.block_on(wire.ping()).unwrap();
    drop(second);
    // Outside any tokio runtime a request fails (no panic).
    use futures_util::FutureExt;
    let outside = wire.ping().now_or_never().expect("fails at once");
    assert!(outside.is_err());
}

#[tokio::test]
async fn a_server_that_is_down_fails_the_request() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let wire = wire_to(port, 0);
    let err = wire.ping().await.unwrap_err();
    assert!(err.is_connection_refusal(), "{err}");
}

#[tokio::test]
async fn dropping_the_wire_fails_requests_in_flight() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let wire = wire_to(listener.local_addr().unwrap().port(), 0);
    let caller = wire.caller();
    let in_flight = caller.send(Packed::Cmd(redis::cmd("GET").arg("a")), 1, 1);
    let sock = accept(&listener).await;
    drop(wire);
    assert!(in_flight.await.is_err());
    let err = caller
        .send(Packed::Cmd(redis::cmd("GET").arg("b")), 1, 1)
        .await
        .unwrap_err();
    assert!(err.is_connection_dropped(), "{err}");
    drop(sock);
}

/// A request that timed out on a connection that answered nothing for the timeout closes it:
/// what waits on it fails, and the next request is served over a new connection (a black
/// hole, a frozen server).
#[tokio::test]
async fn a_connection_silent_for_the_request_timeout_is_replaced() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let wire = wire_to(listener.local_addr().unwrap().port(), 0);
    let caller = wire.caller();
    let get = |k: &str| caller.send(Packed::Cmd(redis::cmd("GET").arg(k)), 1, 1);
    let first = get("a");
    let mut silent = accept(&listener).await;
    expect_commands(&mut silent, &[redis::cmd("GET").arg("a")]).await;
    // The caller's bound ran out; the connection delivered nothing meanwhile.
    let timeout = Duration::from_millis(100);
    tokio::time::sleep(timeout).await;
    wire.note_timeout(timeout);
    let err = tokio::time::timeout(Duration::from_secs(5), first)
        .await
        .expect("failed at once, not left waiting")
        .unwrap_err();
    assert!(err.to_string().contains("no reply within"), "{err}");
    let again = get("b");
    let mut sock = accept(&listener).await;
    expect_commands(&mut sock, &[redis::cmd("GET").arg("b")]).await;
    sock.write_all(b"$1\r\nB\r\n").await.unwrap();
    assert_eq!(again.await.unwrap(), vec![Value::BulkString(b"B".to_vec())]);
    drop(silent);
}

/// A connection that delivered a reply within the timeout is kept when another request
/// times out (a slow command is not a dead connection).
#[tokio::test]
async fn a_connection_that_answered_within_the_timeout_is_kept() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let wire = wire_to(listener.local_addr().unwrap().port(), 0);
    let caller = wire.caller();
    let get = |k: &str| caller.send(Packed::Cmd(redis::cmd("GET").arg(k)), 1, 1);
    let first = get("a");
    let mut sock = accept(&listener).await;
    expect_commands(&mut sock, &[redis::cmd("GET").arg("a")]).await;
    sock.write_all(b"$1\r\nA\r\n").await.unwrap();
    first.await.unwrap();
    let slow = get("slow");
    expect_commands(&mut sock, &[redis::cmd("GET").arg("slow")]).await;
    wire.note_timeout(Duration::from_secs(60));
    sock.write_all(b"$1\r\nS\r\n").await.unwrap();
    assert_eq!(slow.await.unwrap(), vec![Value::BulkString(b"S".to_vec())]);
}

/// The command connection's socket has TCP keepalive on.
#[tokio::test]
async fn the_command_connection_has_tcp_keepalive() {
    let server = pong_server();
    let wire = wire_to(server, 0);
    wire.ping().await.unwrap();
    let found = wire.shared.stream().expect("connected");
    let sock = socket2::SockRef::from(&*found);
    assert!(sock.keepalive().unwrap(), "keepalive off");
    assert_eq!(sock.tcp_keepalive_time().unwrap(), Duration::from_secs(30));
}
