//! What starting a server takes besides the process: free loopback ports, the binary, a temp
//! dir, another try on fresh ports when one was taken, and signals by PID.

use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use super::StartError;

/// Ports the kit never hands out: the default ports of Redis, etcd (client and peer) and
/// ZooKeeper, where a developer's own server may be listening.
pub const RESERVED_PORTS: [u16; 4] = [6379, 2379, 2380, 2181];

/// How many fresh port sets [`start_on_free_ports`] tries.
const START_ATTEMPTS: usize = 20;

/// Bound on every thread of a process stopping after SIGSTOP.
const STOPPED_WITHIN: Duration = Duration::from_secs(10);

/// `n` distinct loopback ports that were free a moment ago, none of [`RESERVED_PORTS`]. All
/// listeners are held until every port is chosen, so the ports differ from each other.
pub fn free_ports(n: usize) -> Vec<u16> {
    let mut listeners = Vec::with_capacity(n);
    while listeners.len() < n {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a loopback port");
        let port = listener.local_addr().expect("local address").port();
        if !RESERVED_PORTS.contains(&port) {
            listeners.push((port, listener));
        }
    }
    listeners.into_iter().map(|(port, _)| port).collect()
}

/// A fresh temp dir named `<prefix>…`, deleted when dropped.
pub fn temp_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .unwrap_or_else(|e| panic!("create a temp dir {prefix}…: {e}"))
}

/// A server binary that answered its version flag.
#[derive(Debug, Clone)]
pub struct Binary {
    /// The path (or bare name, found on `PATH`).
    pub path: PathBuf,
    /// What it printed for the version flag (stdout, then stderr).
    pub version: String,
}

/// Finds a server binary: the path in the environment variable `env`, else `default` on
/// `PATH`; checks it by running it with `version_flag`.
///
/// Panics when it is missing, saying `install` (how to install it, e.g. "install it with
/// `apt-get install -y redis-server`") and that `env` may name the binary instead.
pub fn find_binary(env: &str, default: &str, version_flag: &str, install: &str) -> Binary {
    let path = std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default));
    match Command::new(&path).arg(version_flag).output() {
        Ok(out) if out.status.success() => Binary {
            path,
            version: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        },
        Ok(out) => panic!(
            "`{} {version_flag}` failed ({}): {}",
            path.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!(
            "{default} not found ({}: {e}); {install}, or set {env} to the binary's path",
            path.display()
        ),
    }
}

/// Calls `attempt` with `n` fresh [`free_ports`] until it does not report
/// [`StartError::PortTaken`] (20 tries). Panics naming `what` when it fails otherwise.
pub fn start_on_free_ports<T>(
    what: &str,
    n: usize,
    mut attempt: impl FnMut(&[u16]) -> Result<T, StartError>,
) -> T {
    for _ in 0..START_ATTEMPTS {
        match attempt(&free_ports(n)) {
            Ok(started) => return started,
            Err(StartError::PortTaken) => continue,
            Err(StartError::Failed(why)) => panic!("could not start {what}: {why}"),
        }
    }
    panic!("could not start {what}: a port was taken in each of {START_ATTEMPTS} attempts");
}

/// A signal sent by PID with the `kill` command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM: a clean shutdown.
    Term,
    /// SIGSTOP: frozen, connections stay open, nothing is answered.
    Stop,
    /// SIGCONT: resumes a stopped process.
    Cont,
}

impl Signal {
    fn name(self) -> &'static str {
        match self {
            Signal::Term => "TERM",
            Signal::Stop => "STOP",
            Signal::Cont => "CONT",
        }
    }
}

/// Sends `signal` to the process `pid` (never to a name). Panics if `kill` fails.
///
/// A stop takes effect asynchronously, thread by thread: for [`Signal::Stop`] this returns
/// once every thread of the process is stopped (per `/proc`), so that a paused server answers
/// nothing from the moment the test goes on, however loaded the machine is.
pub fn signal(pid: u32, signal: Signal) {
    let status = Command::new("kill")
        .arg(format!("-{}", signal.name()))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(
        status.success(),
        "kill -{} {pid} failed: {status}",
        signal.name()
    );
    if signal == Signal::Stop {
        wait_until_stopped(pid);
    }
}

/// Waits until no thread of `pid` runs: each is stopped (`T`, `t`), or a zombie or dead.
/// Returns at once where `/proc` is missing; panics after 10 s.
fn wait_until_stopped(pid: u32) {
    let deadline = Instant::now() + STOPPED_WITHIN;
    loop {
        let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return;
        };
        let running: Vec<String> = threads
            .flatten()
            .filter(|thread| {
                std::fs::read_to_string(thread.path().join("stat"))
                    .is_ok_and(|stat| !matches!(thread_state(&stat), Some('T' | 't' | 'Z' | 'X')))
            })
            .map(|thread| thread.file_name().to_string_lossy().into_owned())
            .collect();
        if running.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "threads {running:?} of process {pid} still run {STOPPED_WITHIN:?} after SIGSTOP"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The state letter of a `/proc/<pid>/stat` line (the field after the parenthesised name).
fn thread_state(stat: &str) -> Option<char> {
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// `127.0.0.1:<p1>,127.0.0.1:<p2>,...`: the host list of a multi-host URL.
pub fn loopback_hosts(ports: impl IntoIterator<Item = u16>) -> String {
    let hosts: Vec<String> = ports
        .into_iter()
        .map(|port| format!("127.0.0.1:{port}"))
        .collect();
    hosts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_and_never_reserved() {
        let ports = free_ports(8);
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 8);
        assert!(ports.iter().all(|p| !RESERVED_PORTS.contains(p)));
    }

    #[test]
    fn the_state_is_read_after_the_name() {
        assert_eq!(thread_state("42 (a) b) T 1 2"), Some('T'));
        assert_eq!(thread_state("7 (java) S 1"), Some('S'));
        assert_eq!(thread_state("garbage"), None);
    }

    #[test]
    fn hosts_are_listed_in_order() {
        assert_eq!(loopback_hosts([1, 2]), "127.0.0.1:1,127.0.0.1:2");
    }

    #[test]
    #[should_panic(expected = "install it with `apt-get install -y nothing`")]
    fn a_missing_binary_says_how_to_install_it() {
        find_binary(
            "DLOCK_TESTKIT_NO_SUCH_ENV",
            "dlock-testkit-no-such-binary",
            "--version",
            "install it with `apt-get install -y nothing`",
        );
    }
}
