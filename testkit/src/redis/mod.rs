//! `redis-server` for one test: [`RedisServer::start`] runs one on a free loopback port in a
//! fresh temp dir, without persistence; [`RedisServer::start_with_password`] one that requires
//! a password; `RedisServer::start_tls` (feature `tls`) a TLS-only one with a certificate of a
//! test CA, and `RedisServer::start_mutual_tls` one that also requires a client certificate.
//! The Redis Cluster of six such processes is [`crate::cluster`].
//!
//! A server is ready when `INFO server` names its own process id, so a neighbour's server on a
//! reused port cannot pass for it. The raw view of its keys, behind the runtime's back, is
//! [`RedisKeys`], which a `RedisServer` dereferences to (`server.exists(..)`,
//! `server.query(..)`).
//!
//! The binary is `redis-server` on `PATH`, or [`REDIS_SERVER_ENV`] (`DLOCK_REDIS_SERVER`).

use std::ops::Deref;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::process::{Binary, Probe, TestProcess, find_binary, start_on_free_ports, temp_dir};

mod keys;
#[cfg(feature = "tls")]
mod tls;

pub use keys::RedisKeys;
pub(crate) use keys::connect_cluster;

/// The environment variable naming the `redis-server` binary (default: `redis-server` on `PATH`).
pub const REDIS_SERVER_ENV: &str = "DLOCK_REDIS_SERVER";

/// How long a freshly spawned `redis-server` may take to answer.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// Connect and response timeout of the raw connections of [`RedisServer::conn`] (generous: the
/// test box is noisy).
const CONN_TIMEOUT: Duration = Duration::from_secs(5);

/// Connect and read timeout of a readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// A `redis-server` process owned by one test: loopback only, a free port, no persistence.
///
/// Killed (SIGKILL, by PID) and reaped on drop; prints its log to stderr when dropped during a
/// panic.
#[derive(Debug)]
pub struct RedisServer {
    process: TestProcess,
    keys: RedisKeys,
    port: u16,
    access: Access,
    /// Last: deleted after the process is killed.
    dir: tempfile::TempDir,
}

/// How clients reach a test server.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Access {
    /// Plaintext on `port`, with `requirepass` when there is a password.
    Plain { password: Option<String> },
    /// TLS only (`--port 0 --tls-port <port>`), a certificate signed by a test CA in `dir`.
    #[cfg(feature = "tls")]
    Tls,
    /// TLS on `port` for clients with a certificate of the test CA (`tls-auth-clients yes`),
    /// and a plaintext port on loopback for the kit's own probes and raw views.
    #[cfg(feature = "tls")]
    MutualTls { admin_port: u16 },
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers.
    ///
    /// Panics with installation advice when the binary is missing.
    pub fn start() -> RedisServer {
        RedisServer::launch(
            temp_dir("dlock-redis-"),
            "redis-server",
            1,
            |ports| vec!["--port".to_owned(), ports[0].to_string()],
            |_| Access::Plain { password: None },
        )
    }

    /// Like [`start`](RedisServer::start), with `requirepass <password>`: every client must
    /// authenticate. [`url`](RedisServer::url) carries the password (`redis://:<pw>@…`), and
    /// so do the kit's own connections.
    pub fn start_with_password(password: &str) -> RedisServer {
        RedisServer::launch(
            temp_dir("dlock-redis-"),
            "redis-server (password)",
            1,
            |ports| {
                ["--port", &ports[0].to_string(), "--requirepass", password]
                    .map(str::to_owned)
                    .to_vec()
            },
            |_| Access::Plain {
                password: Some(password.to_owned()),
            },
        )
    }

    /// Starts a server in `dir` on `ports` free ports, with the listening arguments
    /// `listen(ports)`; `access(ports)` says how clients reach it.
    fn launch(
        dir: tempfile::TempDir,
        kind: &str,
        ports: usize,
        listen: impl Fn(&[u16]) -> Vec<String>,
        access: impl Fn(&[u16]) -> Access,
    ) -> RedisServer {
        let bin = redis_server_binary();
        let (process, port, access) = start_on_free_ports(kind, ports, |ports| {
            let (port, access) = (ports[0], access(ports));
            let mut process = server_process(
                &bin,
                dir.path(),
                format!("{kind} on port {port}"),
                &listen(ports),
                raw_url(port, &access),
            );
            process.start().map(|()| (process, port, access))
        });
        RedisServer {
            process,
            keys: RedisKeys::server(raw_url(port, &access)),
            port,
            access,
            dir,
        }
    }

    /// Whether this server speaks TLS (only, on [`port`](RedisServer::port)).
    pub fn is_tls(&self) -> bool {
        !matches!(self.access, Access::Plain { .. })
    }

    /// The URL for a lock runtime: `redis://127.0.0.1:<port>` (`redis://:<pw>@…` with a
    /// password), or for a TLS server `rediss://127.0.0.1:<port>/?ca=<the test CA>` (verified
    /// against the CA that signed it), plus `&cert=…&key=…` (a client certificate of that CA)
    /// when the server requires one.
    pub fn url(&self) -> String {
        #[cfg(feature = "tls")]
        let ca = self.dir.path().join("ca.pem");
        match &self.access {
            Access::Plain { .. } => raw_url(self.port, &self.access),
            #[cfg(feature = "tls")]
            Access::Tls => format!("rediss://127.0.0.1:{}/?ca={}", self.port, ca.display()),
            #[cfg(feature = "tls")]
            Access::MutualTls { .. } => format!(
                "rediss://127.0.0.1:{}/?ca={}&cert={}&key={}",
                self.port,
                ca.display(),
                self.dir.path().join("client.pem").display(),
                self.dir.path().join("client-key.pem").display()
            ),
        }
    }

    /// The loopback port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id. Panics if it is not running.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The directory holding the server's log `redis.log` (and nothing else: persistence is
    /// off), and the certificate of a TLS server.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    crate::process::forward_signals!();

    /// Stops the server and starts a new one on the same port. It comes back empty: there is
    /// no persistence.
    pub fn restart(&mut self) {
        self.process.restart();
    }

    /// A raw `redis` client for this server (to inspect keys, or change them behind a holder's
    /// back).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(raw_url(self.port, &self.access))
            .expect("a redis client for the test server")
    }

    /// A raw multiplexed connection with generous timeouts (the test box is noisy).
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        connect(&raw_url(self.port, &self.access), CONN_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("connect to the test redis-server: {e}"))
    }

    /// How many scripts the server has run so far (`calls` of `evalsha`, `eval`, `fcall` and
    /// their read-only variants in `INFO commandstats`).
    pub async fn script_calls(&self) -> u64 {
        let info: String = self.query(redis::cmd("INFO").arg("commandstats")).await;
        script_calls_in(&info)
    }

    /// How many lock attempts the server ran: every attempt, the first (a pipelined `SET NX`)
    /// or a waiter's (the acquire script), runs exactly one `SET` on the lock (`INFO
    /// commandstats` counts those run inside scripts too). A fence counter restarted at the
    /// clock adds one more.
    pub async fn set_calls(&self) -> u64 {
        self.command_calls("set").await
    }

    /// How many times the server ran `command` (lower case, e.g. `publish`), those run inside
    /// scripts included (`INFO commandstats`).
    pub async fn command_calls(&self, command: &str) -> u64 {
        let info: String = self.query(redis::cmd("INFO").arg("commandstats")).await;
        let prefix = format!("cmdstat_{command}:");
        info.lines()
            .filter_map(|line| line.strip_prefix(prefix.as_str()))
            .filter_map(|fields| fields.split(',').find_map(|f| f.strip_prefix("calls=")))
            .filter_map(|n| n.parse::<u64>().ok())
            .sum()
    }

    /// `INFO commandstats` as command name (lower case) -> calls, those run inside scripts
    /// included.
    pub async fn command_stats(&self) -> std::collections::HashMap<String, u64> {
        let info: String = self.query(redis::cmd("INFO").arg("commandstats")).await;
        info.lines()
            .filter_map(|line| {
                let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = stats.strip_prefix("calls=")?.split(',').next()?;
                Some((name.to_owned(), calls.parse().ok()?))
            })
            .collect()
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

    /// The server log so far (every run of it).
    pub fn log(&self) -> String {
        self.process.log()
    }
}

impl Deref for RedisServer {
    type Target = RedisKeys;

    /// The raw view of this server's keys.
    fn deref(&self) -> &RedisKeys {
        &self.keys
    }
}

/// The hosts part of a `redlock://` URL over `servers`: `127.0.0.1:p1,127.0.0.1:p2,...`.
pub fn redlock_hosts(servers: &[RedisServer]) -> String {
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    hosts.join(",")
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

/// The Redis key of the lock hash for `key` with the default prefix: `dlock:{<key>}` (the
/// library's naming rule, braces and `%` in the key escaped).
pub fn lock_key(key: &str) -> String {
    let [lock, _, _, _] = dlock_runtime::testing::redis_names(dlock_runtime::DEFAULT_PREFIX, key);
    lock
}

/// The Redis key of the fence counter for `key`: `dlock:{<key>}:fence`.
pub fn fence_key(key: &str) -> String {
    let [_, fence, _, _] = dlock_runtime::testing::redis_names(dlock_runtime::DEFAULT_PREFIX, key);
    fence
}

/// The release channel for `key`: `dlock:{<key>}:released`.
pub fn released_channel(key: &str) -> String {
    let [_, _, channel, _] =
        dlock_runtime::testing::redis_names(dlock_runtime::DEFAULT_PREFIX, key);
    channel
}

/// The line of runtimes waiting for their turn at `key`: `dlock:{<key>}:turns`.
pub fn turns_key(key: &str) -> String {
    let [_, _, _, turns] = dlock_runtime::testing::redis_names(dlock_runtime::DEFAULT_PREFIX, key);
    turns
}

/// The URL the kit's own clients use (the redis crate): with the password if there is one,
/// `#insecure` on a TLS port, the plaintext admin port of a mutual-TLS server.
fn raw_url(port: u16, access: &Access) -> String {
    match access {
        Access::Plain { password: None } => format!("redis://127.0.0.1:{port}"),
        Access::Plain {
            password: Some(password),
        } => format!("redis://:{password}@127.0.0.1:{port}"),
        #[cfg(feature = "tls")]
        Access::Tls => format!("rediss://127.0.0.1:{port}/#insecure"),
        #[cfg(feature = "tls")]
        Access::MutualTls { admin_port } => format!("redis://127.0.0.1:{admin_port}"),
    }
}

/// `redis-server` from [`REDIS_SERVER_ENV`] or `PATH`; panics with installation advice.
pub(crate) fn redis_server_binary() -> Binary {
    find_binary(
        REDIS_SERVER_ENV,
        "redis-server",
        "--version",
        "install it with `apt-get install -y redis-server`",
    )
}

/// A `redis-server` without persistence on loopback, in `dir` (log `redis.log`), listening as
/// `listen` says; ready when `INFO server` at `probe_url` names its own process id.
pub(crate) fn server_process(
    bin: &Binary,
    dir: &Path,
    label: String,
    listen: &[String],
    probe_url: String,
) -> TestProcess {
    let mut command = Command::new(&bin.path);
    command
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .args(["--bind", "127.0.0.1"])
        .args(listen)
        .arg("--dir")
        .arg(dir);
    TestProcess::new(label, command, dir.join("redis.log")).ready_when(
        READY_WITHIN,
        move |pid, _| match query_sync::<String>(
            &probe_url,
            redis::cmd("INFO").arg("server"),
            PROBE_TIMEOUT,
        ) {
            Ok(info)
                if info
                    .lines()
                    .any(|l| l.trim() == format!("process_id:{pid}")) =>
            {
                Probe::Ready
            }
            Ok(info) if info.contains("process_id:") => Probe::Foreign,
            Ok(_) => Probe::NotYet,
            Err(e) if e.kind() == redis::ErrorKind::InvalidClientConfig => Probe::Failed(format!(
                "the redis client rejects {probe_url}: {e} (`rediss://…#insecure` needs the redis \
                 crate's `tls-rustls-insecure` feature)"
            )),
            Err(_) => Probe::NotYet,
        },
    )
}

/// Runs one command over a fresh blocking connection to `url`, bounded by `timeout`.
pub(crate) fn query_sync<T: redis::FromRedisValue>(
    url: &str,
    cmd: &redis::Cmd,
    timeout: Duration,
) -> redis::RedisResult<T> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_connection_with_timeout(timeout)?;
    conn.set_read_timeout(Some(timeout))?;
    conn.set_write_timeout(Some(timeout))?;
    cmd.query(&mut conn)
}

/// A multiplexed connection to `url` with `timeout` to connect and for each response.
pub(crate) async fn connect(
    url: &str,
    timeout: Duration,
) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    redis::Client::open(url)?
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_calls_are_summed_over_script_commands() {
        let info = "# Commandstats\r\n\
                    cmdstat_evalsha:calls=3,usec=10,usec_per_call=3.3\r\n\
                    cmdstat_get:calls=7,usec=1\r\n\
                    cmdstat_fcall_ro:calls=2,usec=1\r\n";
        assert_eq!(script_calls_in(info), 5);
        assert_eq!(lock_key("k"), "dlock:{k}");
        assert_eq!(fence_key("k"), "dlock:{k}:fence");
        assert_eq!(released_channel("k"), "dlock:{k}:released");
    }
}
