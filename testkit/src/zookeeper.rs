//! ZooKeeper for one test: [`ZooKeeperServer::start`] runs a standalone ZooKeeper (the Debian
//! package's jars under `java`, class `ZooKeeperServerMain`) on a free loopback port (never
//! 2181) with its config, data and log in a fresh temp dir. It is killed (SIGKILL, by PID) when
//! the handle drops; if the test is failing then, the server log is printed.
//!
//! The config (`zoo.cfg`): `tickTime` = [`TICK_TIME_MS`] so that sessions may be short
//! (ZooKeeper allows session timeouts from [`MIN_SESSION_TIMEOUT`] = 2 ticks up to
//! [`MAX_SESSION_TIMEOUT`], set explicitly because the default maximum is only 20 ticks = 4 s),
//! admin server off, four-letter words `srvr ruok stat conf cons dump mntr` allowed, small
//! transaction-log preallocation, no fsync (the tests kill processes, not the machine: the
//! page cache survives kill -9, so [`restart`](ZooKeeperServer::restart) keeps every znode).
//!
//! The server answers `ruok` before it serves requests, so readiness is `srvr` saying
//! `Mode: standalone` and `conf` naming this server's own data dir (a neighbour's server on a
//! reused port cannot pass for it). Startup is a JVM start: about 0.3–0.5 s on 2 cores.
//!
//! Faults: [`kill9`](ZooKeeperServer::kill9), [`stop`](ZooKeeperServer::stop),
//! [`pause`](ZooKeeperServer::pause) / [`resume`](ZooKeeperServer::resume) (SIGSTOP / SIGCONT),
//! [`restart`](ZooKeeperServer::restart). Inspection: [`four_letter`](ZooKeeperServer::four_letter)
//! (`dump` lists ephemeral nodes per session, `cons` the connections).
//!
//! Binaries: `java` on `PATH` or [`JAVA_ENV`] (`DLOCK_JAVA`); the classpath is the Debian
//! `zookeeper` package's `/usr/share/java/zookeeper.jar` (its manifest lists its dependencies)
//! plus `slf4j-simple.jar` for a log, or [`ZOOKEEPER_CLASSPATH_ENV`]
//! (`DLOCK_ZOOKEEPER_CLASSPATH`), passed to `java -cp` as is (e.g.
//! `/opt/apache-zookeeper-3.8.4-bin/lib/*`).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::process::{
    Binary, Probe, StartError, TestProcess, find_binary, start_on_free_ports, temp_dir,
};

/// The environment variable with the server's classpath (default: the Debian package's jars).
pub const ZOOKEEPER_CLASSPATH_ENV: &str = "DLOCK_ZOOKEEPER_CLASSPATH";

/// The environment variable naming the `java` binary (default: `java` on `PATH`).
pub const JAVA_ENV: &str = "DLOCK_JAVA";

/// `tickTime` of the test server, in milliseconds.
pub const TICK_TIME_MS: u64 = 200;

/// The shortest session timeout the server grants (2 ticks); shorter requests are raised.
pub const MIN_SESSION_TIMEOUT: Duration = Duration::from_millis(2 * TICK_TIME_MS);

/// The longest session timeout the server grants by default; longer requests are lowered
/// (see [`ZooKeeperServer::start_with_max_session_timeout`] for a smaller limit).
pub const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(60);

/// The Debian `zookeeper` package's server jar; its manifest's `Class-Path` names the rest.
const DEBIAN_SERVER_JAR: &str = "/usr/share/java/zookeeper.jar";

/// An SLF4J binding that logs to stderr (Debian `libslf4j-java`, a dependency of zookeeper).
const DEBIAN_SLF4J_SIMPLE: &str = "/usr/share/java/slf4j-simple.jar";

/// The class that runs one standalone server from a config file.
const MAIN_CLASS: &str = "org.apache.zookeeper.server.ZooKeeperServerMain";

/// Four-letter words the server answers.
const FOUR_LETTER_WORDS: &str = "srvr,ruok,stat,conf,cons,dump,mntr";

/// Bound on a start (JVM start included).
const READY_WITHIN: Duration = Duration::from_secs(30);

/// Timeout of readiness probes: a probe that races the start may go unanswered (seen with
/// 3.8.0), so keep each one short.
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);

/// Timeout of [`ZooKeeperServer::four_letter`].
const FOUR_LETTER_TIMEOUT: Duration = Duration::from_secs(2);

/// A standalone ZooKeeper server owned by one test.
///
/// Session expiry is the server's own clock: sessions whose timeout passed while it was frozen
/// ([`pause`](ZooKeeperServer::pause)) may expire as soon as it resumes, unless their clients
/// get a ping in first.
#[derive(Debug)]
pub struct ZooKeeperServer {
    process: TestProcess,
    port: u16,
    /// Last: deleted after the process is killed.
    dir: tempfile::TempDir,
}

impl ZooKeeperServer {
    /// Starts a server on a free loopback port and waits until it serves requests.
    ///
    /// Panics with installation advice when `java` or the ZooKeeper jars are missing.
    pub fn start() -> ZooKeeperServer {
        Self::start_with_max_session_timeout(MAX_SESSION_TIMEOUT)
    }

    /// Like [`start`](Self::start), but the server grants sessions of at most `max` (its
    /// `maxSessionTimeout`; ZooKeeper's own default is 20 ticks): a client asking for more
    /// gets `max`. [`restart`](Self::restart) keeps the limit.
    pub fn start_with_max_session_timeout(max: Duration) -> ZooKeeperServer {
        assert!(
            max >= MIN_SESSION_TIMEOUT,
            "maxSessionTimeout {max:?} below minSessionTimeout {MIN_SESSION_TIMEOUT:?}"
        );
        let java = java_binary();
        let classpath = server_classpath();
        let dir = temp_dir("dlock-zookeeper-");
        let (process, port) = start_on_free_ports("zookeeper", 1, |ports| {
            let port = ports[0];
            let mut process = server_process(&java, &classpath, dir.path(), port, max)?;
            process.start().map(|()| (process, port))
        });
        ZooKeeperServer { process, port, dir }
    }

    /// `127.0.0.1:<port>`: the connect string for a ZooKeeper client.
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `zk://127.0.0.1:<port>` for `Runtime::from_url` (append `/chroot` or `?..` as needed).
    pub fn url(&self) -> String {
        format!("zk://127.0.0.1:{}", self.port)
    }

    /// The loopback client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The JVM's process id. Panics if it is not running.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Whether the server process exists (running or paused).
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// The temp dir: `zoo.cfg`, `data/`, `zookeeper.log`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    crate::process::forward_signals!();

    /// Stops the server if it runs (SIGTERM) and starts it again on the same port with the same
    /// data: znodes survive, and so do sessions whose clients reconnect within their timeout.
    pub fn restart(&mut self) {
        self.process.restart();
    }

    /// Sends a four-letter word (`srvr`, `ruok`, `stat`, `conf`, `cons`, `dump`, `mntr`) and
    /// returns the reply.
    pub fn four_letter(&self, word: &str) -> std::io::Result<String> {
        four_letter(self.port, word, FOUR_LETTER_TIMEOUT)
    }

    /// Every ephemeral node the server knows, from the `dump` four-letter word (paths, in dump
    /// order). Panics if the server does not answer.
    pub fn ephemeral_nodes(&self) -> Vec<String> {
        let dump = self
            .four_letter("dump")
            .unwrap_or_else(|e| panic!("zookeeper on port {}: dump: {e}", self.port));
        let section = dump
            .split("ephemeral nodes dump:")
            .nth(1)
            .unwrap_or_else(|| panic!("unexpected dump reply: {dump}"));
        let section = section
            .split("Connections dump:")
            .next()
            .unwrap_or_default();
        section
            .lines()
            .map(str::trim)
            .filter(|line| line.starts_with('/'))
            .map(str::to_owned)
            .collect()
    }

    /// The `srvr` reply (version, mode, node count, ...). Panics if the server does not answer.
    pub fn srvr(&self) -> String {
        self.four_letter("srvr")
            .unwrap_or_else(|e| panic!("zookeeper on port {}: srvr: {e}", self.port))
    }

    /// The server log so far (stdout and stderr of the JVM).
    pub fn log(&self) -> String {
        self.process.log()
    }
}

/// A standalone server on `port` with its config `zoo.cfg`, data dir `data/` and log
/// `zookeeper.log` in `dir`; ready when `srvr` says standalone and `conf` names this data dir.
fn server_process(
    java: &Binary,
    classpath: &str,
    dir: &Path,
    port: u16,
    max_session_timeout: Duration,
) -> Result<TestProcess, StartError> {
    let data_dir = dir.join("data");
    let config = format!(
        "tickTime={TICK_TIME_MS}\n\
         minSessionTimeout={}\n\
         maxSessionTimeout={}\n\
         dataDir={}\n\
         clientPort={port}\n\
         clientPortAddress=127.0.0.1\n\
         admin.enableServer=false\n\
         4lw.commands.whitelist={FOUR_LETTER_WORDS}\n\
         preAllocSize=4096\n\
         forceSync=no\n",
        MIN_SESSION_TIMEOUT.as_millis(),
        max_session_timeout.as_millis(),
        data_dir.display(),
    );
    let config_path = dir.join("zoo.cfg");
    std::fs::write(&config_path, config)
        .map_err(|e| StartError::Failed(format!("write {}: {e}", config_path.display())))?;
    let mut command = Command::new(&java.path);
    command
        .args(["-XX:+UseSerialGC", "-Xms32m", "-Xmx512m"])
        .arg("-Djava.awt.headless=true")
        .arg("-Dzookeeper.admin.enableServer=false")
        .arg("-Dzookeeper.jmx.log4j.disable=true")
        .arg("-Dorg.slf4j.simpleLogger.showDateTime=true")
        .arg("-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS")
        // The temp dir goes on the classpath too, where a log4j.properties would be read from.
        .arg("-cp")
        .arg(format!("{classpath}:{}", dir.display()))
        .arg(MAIN_CLASS)
        .arg(&config_path);
    let own_data_dir = data_dir.display().to_string();
    let process = TestProcess::new(
        format!(
            "zookeeper on port {port} (java {}, classpath {classpath})",
            java.path.display()
        ),
        command,
        dir.join("zookeeper.log"),
    )
    .ready_when(READY_WITHIN, move |_, _| {
        let serving =
            four_letter(port, "srvr", PROBE_TIMEOUT).is_ok_and(|r| r.contains("Mode: standalone"));
        if !serving {
            return Probe::NotYet;
        }
        // Ours, not a neighbour's on a reused port: `conf` names our data dir.
        match four_letter(port, "conf", PROBE_TIMEOUT) {
            Ok(conf) if conf.contains(&own_data_dir) => Probe::Ready,
            Ok(conf) if conf.contains("dataDir=") => Probe::Foreign,
            _ => Probe::NotYet,
        }
    });
    Ok(process)
}

/// Sends `word` on a fresh connection and reads until the server closes it.
fn four_letter(port: u16, word: &str, timeout: Duration) -> std::io::Result<String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(word.as_bytes())?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply)?;
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

fn java_binary() -> Binary {
    find_binary(
        JAVA_ENV,
        "java",
        "-version",
        "ZooKeeper needs a Java runtime: install it with `apt-get install -y \
         default-jre-headless` (or run scripts/test as root)",
    )
}

fn server_classpath() -> String {
    if let Some(classpath) = std::env::var_os(ZOOKEEPER_CLASSPATH_ENV) {
        return classpath.to_string_lossy().into_owned();
    }
    if !Path::new(DEBIAN_SERVER_JAR).is_file() {
        panic!(
            "ZooKeeper not found ({DEBIAN_SERVER_JAR} is missing); install it with \
             `apt-get install -y zookeeper` (or run scripts/test as root) or set \
             {ZOOKEEPER_CLASSPATH_ENV} to the server's classpath (e.g. \
             `/opt/apache-zookeeper-3.8.4-bin/lib/*`)"
        );
    }
    if Path::new(DEBIAN_SLF4J_SIMPLE).is_file() {
        format!("{DEBIAN_SERVER_JAR}:{DEBIAN_SLF4J_SIMPLE}")
    } else {
        DEBIAN_SERVER_JAR.to_owned()
    }
}
