//! End-to-end test harness for dlock.
//!
//! Every test that needs Redis starts its own `redis-server` ([`RedisServer::start`]) on a free
//! loopback port in a fresh temp dir, without persistence, and the server is killed when the
//! handle drops. If the test is failing at that point, the server log is printed to stderr.
//! [`RedisServer::start_tls`] starts a TLS-only one (`rediss://`, a self-signed certificate made
//! with the `openssl` CLI).
//!
//! [`Backend`] pairs a [`Runtime`] with the server it talks to (none for `memory://`), and
//! [`on_both_backends!`] turns one `async fn test(b: Backend)` into two tests,
//! `on_memory::test` and `on_redis::test`, so the behavioural suite runs on both engines.
//!
//! [`HolderProcess`] drives the `dlock-holder` binary of this package: a separate OS process
//! that takes locks, for exclusion across processes and for kill -9 of a holder.

use std::future::Future;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use dlock_runtime::{LockError, LockGuard, Runtime};
pub mod cluster;
pub mod etcd;
pub mod zookeeper;

/// How long a freshly spawned `redis-server` may take to answer `PING`.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// The environment variable naming the `redis-server` binary (default: `redis-server` on `PATH`).
pub const REDIS_SERVER_ENV: &str = "DLOCK_REDIS_SERVER";

/// A `redis-server` process owned by one test: loopback only, a free port, no persistence.
///
/// Killed (SIGKILL) and reaped on drop; prints its log to stderr when dropped during a panic.
#[derive(Debug)]
pub struct RedisServer {
    bin: PathBuf,
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    paused: bool,
    /// Serves TLS only (`--port 0 --tls-port <port>`), with a self-signed certificate in `dir`.
    tls: bool,
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers `PING`.
    ///
    /// Panics with installation advice when the binary is missing.
    pub fn start() -> RedisServer {
        let bin = redis_server_binary();
        let dir = tempfile::Builder::new()
            .prefix("dlock-redis-")
            .tempdir()
            .expect("create a temp dir for redis-server");
        let mut last_error = String::new();
        for _ in 0..20 {
            let port = free_port();
            match spawn_ready(&bin, port, dir.path()) {
                Ok(child) => {
                    return RedisServer {
                        bin,
                        port,
                        dir,
                        child: Some(child),
                        paused: false,
                        tls: false,
                    };
                }
                Err(StartError::PortTaken) => continue,
                Err(StartError::Failed(why)) => last_error = why,
            }
            if !last_error.is_empty() {
                break;
            }
        }
        panic!("could not start redis-server: {last_error}");
    }

    /// Starts a TLS-only server (no plaintext port) on a free loopback port, with a self-signed
    /// certificate for `127.0.0.1` made by the `openssl` CLI in its temp dir, and waits until it
    /// answers `INFO` over TLS. Clients are not asked for a certificate.
    ///
    /// [`url`](RedisServer::url) is then `rediss://127.0.0.1:<port>/#insecure` (certificate
    /// verification off; [`tls_url_verified`](RedisServer::tls_url_verified) keeps it on).
    /// Panics with installation advice when `redis-server` or `openssl` is missing.
    pub fn start_tls() -> RedisServer {
        let bin = redis_server_binary();
        let dir = tempfile::Builder::new()
            .prefix("dlock-redis-tls-")
            .tempdir()
            .expect("create a temp dir for redis-server");
        make_self_signed_cert(dir.path());
        let mut last_error = String::new();
        for _ in 0..20 {
            let port = free_port();
            match spawn_ready_tls(&bin, port, dir.path()) {
                Ok(child) => {
                    return RedisServer {
                        bin,
                        port,
                        dir,
                        child: Some(child),
                        paused: false,
                        tls: true,
                    };
                }
                Err(StartError::PortTaken) => continue,
                Err(StartError::Failed(why)) => last_error = why,
            }
            if !last_error.is_empty() {
                break;
            }
        }
        panic!("could not start redis-server with TLS: {last_error}");
    }

    /// Whether this server speaks TLS only ([`start_tls`](RedisServer::start_tls)).
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// `rediss://127.0.0.1:<port>` without `#insecure`: certificate verification stays on, so a
    /// client that does not trust the self-signed certificate must refuse the server.
    pub fn tls_url_verified(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    /// The self-signed certificate (PEM) of a TLS server.
    pub fn cert_path(&self) -> PathBuf {
        self.dir.path().join("cert.pem")
    }

    /// `redis://127.0.0.1:<port>`, or `rediss://127.0.0.1:<port>/#insecure` for a TLS server.
    pub fn url(&self) -> String {
        if self.tls {
            format!("rediss://127.0.0.1:{}/#insecure", self.port)
        } else {
            format!("redis://127.0.0.1:{}", self.port)
        }
    }

    /// The loopback port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id. Panics if it is not running.
    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .expect("redis-server is not running")
            .id()
    }

    /// The directory holding the server's log (and nothing else: persistence is off).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills the server with SIGKILL and reaps it. The port stays reserved for [`restart`].
    ///
    /// [`restart`]: RedisServer::restart
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL also ends a stopped (SIGSTOP) process.
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    /// Stops the server with SIGTERM (SIGKILL after 5 s) and reaps it.
    pub fn stop(&mut self) {
        if self.paused {
            self.resume();
        }
        let Some(mut child) = self.child.take() else {
            return;
        };
        signal(child.id(), "TERM");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return;
                }
            }
        }
    }

    /// Stops the server and starts a new one on the same port. It comes back empty:
    /// there is no persistence.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let spawned = if self.tls {
                spawn_ready_tls(&self.bin, self.port, self.dir.path())
            } else {
                spawn_ready(&self.bin, self.port, self.dir.path())
            };
            match spawned {
                Ok(child) => {
                    self.child = Some(child);
                    return;
                }
                Err(StartError::PortTaken) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Err(StartError::PortTaken) => {
                    panic!("port {} stayed taken after redis-server stopped", self.port)
                }
                Err(StartError::Failed(why)) => panic!("could not restart redis-server: {why}"),
            }
        }
    }

    /// Freezes the server with SIGSTOP: connections stay open and requests go unanswered.
    pub fn pause(&mut self) {
        signal(self.pid(), "STOP");
        self.paused = true;
    }

    /// Resumes a server frozen by [`pause`](RedisServer::pause) with SIGCONT.
    pub fn resume(&mut self) {
        signal(self.pid(), "CONT");
        self.paused = false;
    }

    /// A raw `redis` client for this server (to inspect keys, or change them behind a holder's back).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("a redis client for the test server")
    }

    /// A raw multiplexed connection with generous timeouts (the test box is noisy).
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(5)));
        self.client()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .expect("connect to the test redis-server")
    }

    /// Runs one raw command and returns its reply.
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let mut conn = self.conn().await;
        cmd.query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("raw redis command failed: {e}"))
    }

    /// `EXISTS key`.
    pub async fn exists(&self, key: &str) -> bool {
        let n: u64 = self.query(redis::cmd("EXISTS").arg(key)).await;
        n == 1
    }

    /// `PTTL key`: milliseconds left, -1 without expiry, -2 when the key is missing.
    pub async fn pttl(&self, key: &str) -> i64 {
        self.query(redis::cmd("PTTL").arg(key)).await
    }

    /// `DEL key`; true if it existed.
    pub async fn del(&self, key: &str) -> bool {
        let n: u64 = self.query(redis::cmd("DEL").arg(key)).await;
        n == 1
    }

    /// How many scripts the server has run so far (`calls` of `evalsha`, `eval`, `fcall` and
    /// their read-only variants in `INFO commandstats`).
    pub async fn script_calls(&self) -> u64 {
        let info: String = self.query(redis::cmd("INFO").arg("commandstats")).await;
        script_calls_in(&info)
    }

    /// `PUBSUB NUMSUB channel`: how many client connections subscribe to the channel.
    pub async fn subscribers(&self, channel: &str) -> u64 {
        let reply: Vec<redis::Value> = self
            .query(redis::cmd("PUBSUB").arg("NUMSUB").arg(channel))
            .await;
        match reply.get(1) {
            Some(redis::Value::Int(n)) => u64::try_from(*n).unwrap_or(0),
            other => panic!("unexpected PUBSUB NUMSUB reply: {other:?}"),
        }
    }

    /// The server log so far.
    pub fn log(&self) -> String {
        let mut out =
            std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
        let stderr =
            std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default();
        if !stderr.is_empty() {
            out.push_str("\n--- stderr ---\n");
            out.push_str(&stderr);
        }
        out
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "==== redis-server log (port {}, {}) ====\n{}\n==== end of redis-server log ====",
                self.port,
                self.dir.path().display(),
                self.log()
            );
        }
        self.kill9();
    }
}

/// Sums the `calls` of every script-running command in an `INFO commandstats` reply.
pub fn script_calls_in(info: &str) -> u64 {
    const SCRIPT_COMMANDS: [&str; 6] = [
        "cmdstat_evalsha:",
        "cmdstat_eval:",
        "cmdstat_evalsha_ro:",
        "cmdstat_eval_ro:",
        "cmdstat_fcall:",
        "cmdstat_fcall_ro:",
    ];
    info.lines()
        .filter(|line| SCRIPT_COMMANDS.iter().any(|c| line.starts_with(c)))
        .filter_map(|line| {
            let fields = line.split_once(':')?.1;
            fields
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum()
}

/// The Redis key of the lock hash for `key` with the default prefix: `dlock:{<key>}`.
pub fn lock_key(key: &str) -> String {
    format!("dlock:{{{key}}}")
}

/// The Redis key of the fence counter for `key`: `dlock:{<key>}:fence`.
pub fn fence_key(key: &str) -> String {
    format!("dlock:{{{key}}}:fence")
}

/// The release channel for `key`: `dlock:{<key>}:released`.
pub fn released_channel(key: &str) -> String {
    format!("dlock:{{{key}}}:released")
}

fn redis_server_binary() -> PathBuf {
    let bin = std::env::var_os(REDIS_SERVER_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("redis-server"));
    match Command::new(&bin).arg("--version").output() {
        Ok(out) if out.status.success() => bin,
        Ok(out) => panic!(
            "`{} --version` failed ({}): {}",
            bin.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!(
            "redis-server not found ({}: {e}); install it with `apt-get install -y redis-server` \
             or set {REDIS_SERVER_ENV} to the binary's path",
            bin.display()
        ),
    }
}

/// A loopback port that was free a moment ago (never 6379).
fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a loopback port");
        let port = listener.local_addr().expect("local address").port();
        if port != 6379 {
            return port;
        }
    }
}

enum StartError {
    PortTaken,
    Failed(String),
}

fn spawn_ready(bin: &Path, port: u16, dir: &Path) -> Result<Child, StartError> {
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("stderr.log"))
        .map_err(|e| StartError::Failed(format!("open stderr.log: {e}")))?;
    let log = dir.join("redis.log");
    let mut child = Command::new(bin)
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map_err(|e| StartError::Failed(format!("spawn {}: {e}", bin.display())))?;
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            if log.contains("Address already in use") {
                return Err(StartError::PortTaken);
            }
            return Err(StartError::Failed(format!(
                "redis-server on port {port} exited with {status}; log:\n{log}"
            )));
        }
        // Ready means: our own process answers (a neighbour test's server could hold the port).
        if let Ok(info) = inline_command(port, "INFO server") {
            if info
                .lines()
                .any(|l| l.trim() == format!("process_id:{}", child.id()))
            {
                return Ok(child);
            }
            if child.try_wait().ok().flatten().is_none() && info.contains("process_id:") {
                // Someone else's server answered; ours will fail to bind.
                let _ = child.kill();
                let _ = child.wait();
                return Err(StartError::PortTaken);
            }
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(StartError::Failed(format!(
                "redis-server on port {port} did not answer within {READY_WITHIN:?}; log:\n{log}"
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Writes `cert.pem` and `key.pem` (self-signed, RSA 2048, one day, CN and SAN 127.0.0.1) into
/// `dir` with the `openssl` CLI. Panics with installation advice when `openssl` is missing.
fn make_self_signed_cert(dir: &Path) {
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes"])
        .args(["-keyout", "key.pem", "-out", "cert.pem", "-days", "1"])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .current_dir(dir)
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "openssl req (self-signed certificate) failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!(
            "openssl not found ({e}); the TLS tests need it to make a certificate: \
             install it with `apt-get install -y openssl`"
        ),
    }
}

/// [`spawn_ready`] for a TLS-only server: `--port 0 --tls-port <port>` with the certificate in
/// `dir`; ready when `INFO server` over TLS names our process.
fn spawn_ready_tls(bin: &Path, port: u16, dir: &Path) -> Result<Child, StartError> {
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("stderr.log"))
        .map_err(|e| StartError::Failed(format!("open stderr.log: {e}")))?;
    let log = dir.join("redis.log");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let mut child = Command::new(bin)
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .args(["--port", "0", "--tls-port", &port.to_string()])
        .args(["--bind", "127.0.0.1", "--tls-auth-clients", "no"])
        .arg("--tls-cert-file")
        .arg(&cert)
        .arg("--tls-key-file")
        .arg(&key)
        .arg("--tls-ca-cert-file")
        .arg(&cert)
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map_err(|e| StartError::Failed(format!("spawn {}: {e}", bin.display())))?;
    let url = format!("rediss://127.0.0.1:{port}/#insecure");
    let client = redis::Client::open(url.as_str())
        .map_err(|e| StartError::Failed(format!("a TLS client for {url}: {e}")))?;
    let deadline = Instant::now() + READY_WITHIN;
    let mut last_error = String::new();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            if log.contains("Address already in use") {
                return Err(StartError::PortTaken);
            }
            return Err(StartError::Failed(format!(
                "redis-server (TLS) on port {port} exited with {status}; log:\n{log}"
            )));
        }
        let info = client
            .get_connection_with_timeout(Duration::from_millis(500))
            .and_then(|mut conn| {
                conn.set_read_timeout(Some(Duration::from_millis(500)))?;
                redis::cmd("INFO").arg("server").query::<String>(&mut conn)
            });
        match info {
            Ok(info) => {
                if info
                    .lines()
                    .any(|l| l.trim() == format!("process_id:{}", child.id()))
                {
                    return Ok(child);
                }
                if child.try_wait().ok().flatten().is_none() && info.contains("process_id:") {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(StartError::PortTaken);
                }
            }
            Err(e) if e.kind() == redis::ErrorKind::InvalidClientConfig => {
                // Not a server problem: the client cannot speak `rediss://…#insecure`.
                let _ = child.kill();
                let _ = child.wait();
                return Err(StartError::Failed(format!(
                    "the redis client rejects {url}: {e} (the tests package needs the redis \
                     crate's `tls-rustls-insecure` feature for `#insecure`)"
                )));
            }
            Err(e) => last_error = e.to_string(),
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(StartError::Failed(format!(
                "redis-server (TLS) on port {port} did not answer over TLS within \
                 {READY_WITHIN:?} (last error: {last_error}); log:\n{log}"
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends one inline command over a fresh blocking connection and returns a simple or bulk reply.
fn inline_command(port: u16, command: &str) -> std::io::Result<String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200))?;
    stream.set_read_timeout(Some(Duration::from_millis(500)))?;
    stream.write_all(format!("{command}\r\n").as_bytes())?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(reply) = complete_reply(&buf) {
            return Ok(reply);
        }
    }
    Err(std::io::Error::other(
        "connection closed before a full reply",
    ))
}

fn complete_reply(buf: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(buf);
    let (head, rest) = text.split_once("\r\n")?;
    match head.as_bytes().first()? {
        b'+' | b'-' | b':' => Some(head.to_string()),
        b'$' => {
            let len: usize = head[1..].parse().ok()?;
            (rest.len() >= len).then(|| rest[..len].to_string())
        }
        _ => Some(head.to_string()),
    }
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{sig} {pid} failed: {status}");
}

/// Which engine a [`Backend`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// `memory://`: in-process.
    Memory,
    /// `redis://`: a `redis-server` started for the test.
    Redis,
}

/// A runtime and the server behind it, for tests that run on every engine.
pub struct Backend {
    /// The engine.
    pub engine: Engine,
    /// A runtime on the engine, with default options.
    pub rt: Runtime,
    /// The server (Redis only).
    pub server: Option<RedisServer>,
}

impl Backend {
    /// An in-process `memory://` runtime.
    pub async fn memory() -> Backend {
        let rt = Runtime::builder()
            .memory()
            .build()
            .await
            .expect("build a memory runtime");
        Backend {
            engine: Engine::Memory,
            rt,
            server: None,
        }
    }

    /// A fresh `redis-server` and a runtime connected to it.
    pub async fn redis() -> Backend {
        let server = RedisServer::start();
        let rt = Runtime::builder()
            .redis(server.url())
            .build()
            .await
            .expect("build a redis runtime");
        Backend {
            engine: Engine::Redis,
            rt,
            server: Some(server),
        }
    }

    /// Another runtime on the same engine and state: a second connection to the same server on
    /// Redis; the same runtime on memory (whose state lives in the runtime).
    pub async fn other_runtime(&self) -> Runtime {
        match &self.server {
            Some(server) => Runtime::builder()
                .redis(server.url())
                .build()
                .await
                .expect("build a second redis runtime"),
            None => self.rt.clone(),
        }
    }

    /// The Redis server (panics on the memory engine).
    pub fn redis_server(&self) -> &RedisServer {
        self.server
            .as_ref()
            .expect("this test needs the redis engine")
    }

    /// Whether anyone holds `key`: a raw `EXISTS dlock:{key}` on Redis (not trusting the
    /// runtime), `Runtime::is_locked` on memory.
    pub async fn is_held(&self, key: &str) -> bool {
        match &self.server {
            Some(server) => server.exists(&lock_key(key)).await,
            None => self
                .rt
                .is_locked(key)
                .await
                .expect("is_locked on the memory runtime"),
        }
    }

    /// Waits until nobody holds `key`; panics if it is still held after `within`. Returns how
    /// long it took.
    pub async fn wait_until_free(&self, key: &str, within: Duration) -> Duration {
        let start = Instant::now();
        loop {
            if !self.is_held(key).await {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < within,
                "{:?}: key {key:?} still held {within:?} later",
                self.engine
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Generates `mod on_memory` and `mod on_redis`, each with one
/// `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]` per named
/// `async fn name(b: Backend)` of the calling file.
#[macro_export]
macro_rules! on_both_backends {
    ($($test:ident),+ $(,)?) => {
        mod on_memory {
            $(
                #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test($crate::Backend::memory().await).await;
                }
            )+
        }
        mod on_redis {
            $(
                #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test($crate::Backend::redis().await).await;
                }
            )+
        }
    };
}

/// Polls `check` every 5 ms until it returns true; panics naming `what` if that takes longer than
/// `within`. Returns how long it took.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "{what}: not true within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A small xorshift generator: reproducible from the seed it prints, no dependency.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded from the clock; the seed is printed so a failing run can be replayed.
    pub fn from_clock() -> Rng {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9e37_79b9_7f4a_7c15);
        Rng::seeded(nanos)
    }

    /// A fixed seed.
    pub fn seeded(seed: u64) -> Rng {
        println!("rng seed: {seed}");
        Rng(seed | 1)
    }

    /// The next value in `0..bound` (`bound > 0`).
    pub fn below(&mut self, bound: u64) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x % bound
    }
}

/// A running `dlock-holder` process (the binary of this package).
pub struct HolderProcess {
    child: tokio::process::Child,
    stdout: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl HolderProcess {
    /// Spawns `bin` (pass `env!("CARGO_BIN_EXE_dlock-holder")`) with `args`. The process is
    /// killed if the handle drops.
    pub fn spawn(bin: &str, args: &[&str]) -> HolderProcess {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {bin}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        HolderProcess {
            child,
            stdout: tokio::io::BufReader::new(stdout).lines(),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("holder is running")
    }

    /// The next line the holder prints; panics after `within` or at end of output.
    pub async fn next_line(&mut self, within: Duration) -> String {
        match tokio::time::timeout(within, self.stdout.next_line()).await {
            Ok(Ok(Some(line))) => line,
            Ok(Ok(None)) => panic!("dlock-holder closed its stdout"),
            Ok(Err(e)) => panic!("reading dlock-holder's stdout: {e}"),
            Err(_) => panic!("dlock-holder printed nothing within {within:?}"),
        }
    }

    /// Freezes the holder with SIGSTOP: its watchdog stops renewing.
    pub fn pause(&self) {
        signal(self.pid(), "STOP");
    }

    /// Resumes a holder frozen by [`pause`](HolderProcess::pause) with SIGCONT.
    pub fn resume(&self) {
        signal(self.pid(), "CONT");
    }

    /// SIGKILL, then reap.
    pub async fn kill9(&mut self) {
        self.child.start_kill().expect("kill -9 dlock-holder");
        self.child.wait().await.expect("reap dlock-holder");
    }

    /// Waits for the process to exit, at most `within`.
    pub async fn wait(&mut self, within: Duration) -> ExitStatus {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => status.expect("wait for dlock-holder"),
            Err(_) => panic!("dlock-holder did not exit within {within:?}"),
        }
    }
}

/// Asserts `elapsed` lies in `[min, max]`, naming `what`.
#[track_caller]
pub fn assert_between(what: &str, elapsed: Duration, min: Duration, max: Duration) {
    assert!(
        elapsed >= min && elapsed <= max,
        "{what}: took {elapsed:?}, expected between {min:?} and {max:?}"
    );
}
