//! Opening the connection: TCP, then the handshake (`HELLO 3`, `AUTH`, `SELECT`), with
//! retries.

use std::io;
use std::time::Duration;

use redis::{ConnectionAddr, ConnectionInfo, RedisError, RedisResult};
use tokio::net::TcpStream;

use super::reply::{ReadBuf, protocol_error};

/// Where to connect, and the handshake to send first.
pub(super) struct Target {
    host: String,
    port: u16,
    /// `HELLO 3` with `AUTH` when the URL has credentials, then `SELECT` when it names a db.
    handshake: Vec<u8>,
    /// How many replies the handshake gets.
    handshake_replies: usize,
    /// The database the handshake selects.
    pub(super) db: i64,
    connect_timeout: Duration,
    /// Connection attempts after a failed one before the waiting requests fail.
    retries: usize,
    max_delay: Duration,
}

impl Target {
    /// The target of the server of `info` if it is a plaintext TCP one.
    pub(super) fn for_server(
        info: &ConnectionInfo,
        connect_timeout: Duration,
        retries: usize,
        max_delay: Duration,
    ) -> Option<Self> {
        let ConnectionAddr::Tcp(host, port) = info.addr() else {
            return None;
        };
        let settings = info.redis_settings();
        let mut handshake = redis::pipe();
        let hello = handshake.cmd("HELLO").arg(3);
        if let Some(password) = settings.password() {
            hello
                .arg("AUTH")
                .arg(settings.username().unwrap_or("default"))
                .arg(password);
        }
        let mut handshake_replies = 1;
        if settings.db() != 0 {
            handshake.cmd("SELECT").arg(settings.db());
            handshake_replies += 1;
        }
        Some(Self {
            host: host.clone(),
            port: *port,
            handshake: handshake.get_packed_pipeline(),
            handshake_replies,
            db: settings.db(),
            connect_timeout,
            retries,
            max_delay,
        })
    }
}

/// Opens the TCP connection and runs the handshake, with the retries of `target`.
pub(super) async fn connect(target: &Target) -> RedisResult<TcpStream> {
    let mut delay = Duration::from_millis(50);
    let mut attempt = 0;
    loop {
        let tried = tokio::time::timeout(target.connect_timeout, connect_once(target)).await;
        let err = match tried {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(e)) => e,
            Err(_) => RedisError::from(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no connection within {:?}", target.connect_timeout),
            )),
        };
        if attempt >= target.retries || err.kind() != redis::ErrorKind::Io {
            return Err(err);
        }
        attempt += 1;
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(target.max_delay);
    }
}

/// TCP keepalive of the command connection: probes after this long idle,
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// every this long,
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// this many unanswered before the kernel closes it.
const KEEPALIVE_PROBES: u32 = 3;

async fn connect_once(target: &Target) -> RedisResult<TcpStream> {
    let stream = TcpStream::connect((target.host.as_str(), target.port)).await?;
    stream.set_nodelay(true)?;
    // A peer gone without a word (a host that vanished, a cut path) is noticed by the kernel
    // within about a minute even while nothing waits on the connection; one that stays
    // silent while requests wait is closed sooner (`Shared::note_timeout`).
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive)?;
    let mut written = 0;
    while written < target.handshake.len() {
        stream.writable().await?;
        match stream.try_write(&target.handshake[written..]) {
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut buf = ReadBuf::new(1024);
    let mut replies = 0;
    while replies < target.handshake_replies {
        match buf.next_reply()? {
            Some(value) => {
                value.extract_error()?;
                replies += 1;
            }
            None => {
                stream.readable().await?;
                match buf.fill(&stream) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    if !buf.is_empty() {
        return Err(protocol_error("bytes after the handshake's replies"));
    }
    Ok(stream)
}
