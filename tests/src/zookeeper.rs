//! ZooKeeper harness: [`ZooKeeperServer::start`] runs a standalone ZooKeeper (the Debian
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
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The environment variable with the server's classpath (default: the Debian package's jars).
pub const ZOOKEEPER_CLASSPATH_ENV: &str = "DLOCK_ZOOKEEPER_CLASSPATH";

/// The environment variable naming the `java` binary (default: `java` on `PATH`).
pub const JAVA_ENV: &str = "DLOCK_JAVA";

/// `tickTime` of the test server, in milliseconds.
pub const TICK_TIME_MS: u64 = 200;

/// The shortest session timeout the server grants (2 ticks); shorter requests are raised.
pub const MIN_SESSION_TIMEOUT: Duration = Duration::from_millis(2 * TICK_TIME_MS);

/// The longest session timeout the server grants; longer requests are lowered.
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

/// How many fresh ports to try when one is taken between choosing and binding it.
const START_ATTEMPTS: usize = 20;

/// A standalone ZooKeeper server owned by one test.
#[derive(Debug)]
pub struct ZooKeeperServer {
    java: PathBuf,
    classpath: String,
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    paused: bool,
    /// Length of the log when the current process was spawned.
    log_offset: u64,
}

enum StartError {
    PortTaken,
    Failed(String),
}

impl ZooKeeperServer {
    /// Starts a server on a free loopback port and waits until it serves requests.
    ///
    /// Panics with installation advice when `java` or the ZooKeeper jars are missing.
    pub fn start() -> ZooKeeperServer {
        let java = java_binary();
        let classpath = server_classpath();
        let dir = tempfile::Builder::new()
            .prefix("dlock-zookeeper-")
            .tempdir()
            .expect("create a temp dir for zookeeper");
        let mut server = ZooKeeperServer {
            java,
            classpath,
            port: 0,
            dir,
            child: None,
            paused: false,
            log_offset: 0,
        };
        let mut last_error = String::new();
        for _ in 0..START_ATTEMPTS {
            server.port = free_port();
            match server.spawn_ready() {
                Ok(()) => return server,
                Err(StartError::PortTaken) => continue,
                Err(StartError::Failed(why)) => {
                    last_error = why;
                    break;
                }
            }
        }
        if last_error.is_empty() {
            last_error = format!("a port was taken in each of {START_ATTEMPTS} attempts");
        }
        panic!("could not start zookeeper: {last_error}");
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
        self.child.as_ref().expect("zookeeper is not running").id()
    }

    /// Whether the server process exists (running or paused).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The temp dir: `zoo.cfg`, `data/`, `zookeeper.log`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills the server with SIGKILL and reaps it. Port and data stay for
    /// [`restart`](ZooKeeperServer::restart).
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

    /// Stops the server if it runs (SIGTERM) and starts it again on the same port with the same
    /// data: znodes survive, and so do sessions whose clients reconnect within their timeout.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.spawn_ready() {
                Ok(()) => return,
                Err(StartError::PortTaken) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Err(StartError::PortTaken) => {
                    panic!("port {} stayed taken after zookeeper stopped", self.port)
                }
                Err(StartError::Failed(why)) => panic!("could not restart zookeeper: {why}"),
            }
        }
    }

    /// Freezes the server with SIGSTOP: connections stay open and requests go unanswered.
    /// Session expiry is the server's own clock: sessions whose timeout passed while it was
    /// frozen may expire as soon as it resumes, unless their clients get a ping in first.
    pub fn pause(&mut self) {
        signal(self.pid(), "STOP");
        self.paused = true;
    }

    /// Resumes a server frozen by [`pause`](ZooKeeperServer::pause) with SIGCONT.
    pub fn resume(&mut self) {
        signal(self.pid(), "CONT");
        self.paused = false;
    }

    /// Sends a four-letter word (`srvr`, `ruok`, `stat`, `conf`, `cons`, `dump`, `mntr`) and
    /// returns the reply.
    pub fn four_letter(&self, word: &str) -> std::io::Result<String> {
        four_letter(self.port, word, FOUR_LETTER_TIMEOUT)
    }

    /// The `srvr` reply (version, mode, node count, ...). Panics if the server does not answer.
    pub fn srvr(&self) -> String {
        self.four_letter("srvr")
            .unwrap_or_else(|e| panic!("zookeeper on port {}: srvr: {e}", self.port))
    }

    /// The server log so far (stdout and stderr of the JVM).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("zookeeper.log")
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn write_config(&self) -> Result<PathBuf, StartError> {
        let config = format!(
            "tickTime={TICK_TIME_MS}\n\
             minSessionTimeout={}\n\
             maxSessionTimeout={}\n\
             dataDir={}\n\
             clientPort={}\n\
             clientPortAddress=127.0.0.1\n\
             admin.enableServer=false\n\
             4lw.commands.whitelist={FOUR_LETTER_WORDS}\n\
             preAllocSize=4096\n\
             forceSync=no\n",
            MIN_SESSION_TIMEOUT.as_millis(),
            MAX_SESSION_TIMEOUT.as_millis(),
            self.data_dir().display(),
            self.port,
        );
        let path = self.dir.path().join("zoo.cfg");
        std::fs::write(&path, config)
            .map_err(|e| StartError::Failed(format!("write {}: {e}", path.display())))?;
        Ok(path)
    }

    fn spawn_ready(&mut self) -> Result<(), StartError> {
        let config = self.write_config()?;
        let log_path = self.log_path();
        let open_log = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
                .map_err(|e| StartError::Failed(format!("open {}: {e}", log_path.display())))
        };
        let (stdout, stderr) = (open_log()?, open_log()?);
        self.log_offset = stderr.metadata().map(|m| m.len()).unwrap_or(0);
        // The temp dir goes on the classpath too, the place a log4j.properties would be read from.
        let classpath = format!("{}:{}", self.classpath, self.dir.path().display());
        let child = Command::new(&self.java)
            .args(["-XX:+UseSerialGC", "-Xms32m", "-Xmx512m"])
            .arg("-Djava.awt.headless=true")
            .arg("-Dzookeeper.admin.enableServer=false")
            .arg("-Dzookeeper.jmx.log4j.disable=true")
            .arg("-Dorg.slf4j.simpleLogger.showDateTime=true")
            .arg("-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS")
            .arg("-cp")
            .arg(&classpath)
            .arg(MAIN_CLASS)
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(|e| StartError::Failed(format!("spawn {}: {e}", self.java.display())))?;
        self.child = Some(child);
        self.paused = false;
        let own_data_dir = self.data_dir().display().to_string();
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                let log = self.log_since_spawn();
                if log.contains("Address already in use") {
                    return Err(StartError::PortTaken);
                }
                return Err(StartError::Failed(format!(
                    "zookeeper on port {} (java {}, classpath {}) exited with {status}; log:\n{log}",
                    self.port,
                    self.java.display(),
                    self.classpath
                )));
            }
            let serving = four_letter(self.port, "srvr", PROBE_TIMEOUT)
                .is_ok_and(|r| r.contains("Mode: standalone"));
            if serving {
                // Ours, not a neighbour's on a reused port: `conf` names our data dir.
                match four_letter(self.port, "conf", PROBE_TIMEOUT) {
                    Ok(conf) if conf.contains(&own_data_dir) => return Ok(()),
                    Ok(conf) if conf.contains("dataDir=") => {
                        self.kill9();
                        return Err(StartError::PortTaken);
                    }
                    _ => {}
                }
            }
            if Instant::now() > deadline {
                self.kill9();
                return Err(StartError::Failed(format!(
                    "zookeeper on port {} did not serve within {READY_WITHIN:?}; log:\n{}",
                    self.port,
                    self.log_since_spawn()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_since_spawn(&self) -> String {
        let log = std::fs::read(self.log_path()).unwrap_or_default();
        let from = usize::try_from(self.log_offset).unwrap_or(0).min(log.len());
        String::from_utf8_lossy(&log[from..]).into_owned()
    }
}

impl Drop for ZooKeeperServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "==== zookeeper log (port {}, {}) ====\n{}\n==== end of zookeeper log ====",
                self.port,
                self.dir.path().display(),
                self.log()
            );
        }
        self.kill9();
    }
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

fn java_binary() -> PathBuf {
    let java = std::env::var_os(JAVA_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("java"));
    match Command::new(&java).arg("-version").output() {
        Ok(out) if out.status.success() => java,
        Ok(out) => panic!(
            "`{} -version` failed ({}): {}",
            java.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!(
            "java not found ({}: {e}); ZooKeeper needs a Java runtime: install it with \
             `apt-get install -y default-jre-headless` (or run scripts/test as root) or set \
             {JAVA_ENV} to the binary's path",
            java.display()
        ),
    }
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

/// A loopback port that was free a moment ago (never 2181).
fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a loopback port");
        let port = listener.local_addr().expect("local address").port();
        if port != 2181 {
            return port;
        }
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
