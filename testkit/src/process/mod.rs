//! One child process owned by a test, and what every server harness needs around it.
//!
//! [`TestProcess`] spawns a program with its stdout and stderr appended to a log file, waits
//! until a readiness [`Probe`] says the process serves, and offers the faults the tests use:
//! [`kill9`](TestProcess::kill9), [`stop`](TestProcess::stop) (SIGTERM),
//! [`pause`](TestProcess::pause) / [`resume`](TestProcess::resume) (SIGSTOP / SIGCONT) and
//! [`restart`](TestProcess::restart) with the same command line (same ports, same data). Every
//! signal goes to the child's own PID, never to a process name. On drop the process is killed
//! with SIGKILL and reaped, and if the thread is panicking (the owning test is failing) its log
//! is printed to stderr first.
//!
//! Around it: [`free_ports`] (loopback ports, never an engine's default port),
//! [`find_binary`] (a missing server fails the test with installation advice, it does not
//! skip), [`temp_dir`] and [`start_on_free_ports`] (start again on fresh ports when another
//! process took one between choosing and binding it).

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

mod launch;

/// The signal methods of a single-process server, forwarded to the [`ManagedProcess`] in its
/// `process` field: `kill9`, `stop`, `pause`, `resume`. (`restart` stays with each server: what
/// survives it differs.)
macro_rules! forward_signals {
    () => {
        /// Kills the server with SIGKILL and reaps it. Its port (and data, if any) stay for
        /// `restart`.
        pub fn kill9(&mut self) {
            self.process.kill9();
        }

        /// Stops the server with SIGTERM (SIGKILL after 5 s) and reaps it.
        pub fn stop(&mut self) {
            self.process.stop();
        }

        /// Freezes the server with SIGSTOP: connections stay open and requests go unanswered.
        pub fn pause(&mut self) {
            self.process.pause();
        }

        /// Resumes a server frozen by `pause` with SIGCONT.
        pub fn resume(&mut self) {
            self.process.resume();
        }
    };
}
pub(crate) use forward_signals;

pub use launch::{
    Binary, RESERVED_PORTS, Signal, find_binary, free_ports, loopback_hosts, signal,
    start_on_free_ports, temp_dir,
};

/// How long [`TestProcess::restart`] keeps trying while the old port is still taken.
const RESTART_WITHIN: Duration = Duration::from_secs(10);

/// How long [`TestProcess::stop`] waits after SIGTERM before SIGKILL.
const STOP_WITHIN: Duration = Duration::from_secs(5);

/// How often readiness is probed.
const PROBE_EVERY: Duration = Duration::from_millis(20);

/// Why a start attempt failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartError {
    /// A port was taken by another process: try again on fresh ports.
    PortTaken,
    /// Anything else, with the process's log.
    Failed(String),
}

/// What a readiness probe saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// This process serves.
    Ready,
    /// Not yet: probe again.
    NotYet,
    /// Another process answers on our port (ours will fail to bind): try other ports.
    Foreign,
    /// Starting cannot succeed, for this reason.
    Failed(String),
}

/// A readiness probe: given the process id and what the process logged since it was spawned.
type ReadyCheck = Box<dyn Fn(u32, &str) -> Probe + Send + Sync>;

/// A child process owned by one test: output appended to a log file, killed (SIGKILL, by PID)
/// and reaped on drop, its log printed then if the test is failing.
pub struct TestProcess {
    label: String,
    command: Command,
    log_path: PathBuf,
    pipe_stdout: bool,
    ready: Option<ReadyCheck>,
    ready_within: Duration,
    child: Option<Child>,
    paused: bool,
    /// Length of the log when the current process was spawned: readiness and port conflicts
    /// are judged on what this process wrote, not on an earlier run's lines.
    log_offset: u64,
}

impl fmt::Debug for TestProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestProcess")
            .field("label", &self.label)
            .field("pid", &self.child.as_ref().map(Child::id))
            .field("paused", &self.paused)
            .field("log_path", &self.log_path)
            .finish_non_exhaustive()
    }
}

impl TestProcess {
    /// A process that runs `command` (not spawned yet), logging to `log_path`. `label` names it
    /// in messages, e.g. `redis-server on port 40123`.
    pub fn new(label: impl Into<String>, command: Command, log_path: impl Into<PathBuf>) -> Self {
        TestProcess {
            label: label.into(),
            command,
            log_path: log_path.into(),
            pipe_stdout: false,
            ready: None,
            ready_within: Duration::from_secs(10),
            child: None,
            paused: false,
            log_offset: 0,
        }
    }

    /// Ready when `check` says so, within `within` of the spawn (default: as soon as spawned).
    pub fn ready_when(
        mut self,
        within: Duration,
        check: impl Fn(u32, &str) -> Probe + Send + Sync + 'static,
    ) -> Self {
        self.ready = Some(Box::new(check));
        self.ready_within = within;
        self
    }

    /// Pipes stdout to the test ([`take_stdout`](TestProcess::take_stdout)) instead of the
    /// log; stderr still goes to the log.
    pub fn pipe_stdout(mut self) -> Self {
        self.pipe_stdout = true;
        self
    }

    /// Spawns the process and waits until it is ready.
    pub fn start(&mut self) -> Result<(), StartError> {
        self.spawn()?;
        self.wait_ready(Instant::now() + self.ready_within)
    }

    /// Spawns the process without waiting (see [`wait_ready`](TestProcess::wait_ready)).
    pub fn spawn(&mut self) -> Result<(), StartError> {
        assert!(self.child.is_none(), "{} is already running", self.label);
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log_path)
                .map_err(|e| StartError::Failed(format!("open {}: {e}", self.log_path.display())))
        };
        let stderr = open()?;
        self.log_offset = stderr.metadata().map(|m| m.len()).unwrap_or(0);
        let stdout = if self.pipe_stdout {
            Stdio::piped()
        } else {
            Stdio::from(open()?)
        };
        let child = self
            .command
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(|e| {
                StartError::Failed(format!(
                    "spawn {}: {e}",
                    self.command.get_program().to_string_lossy()
                ))
            })?;
        self.child = Some(child);
        self.paused = false;
        Ok(())
    }

    /// Waits until the readiness check says ready. A process that exits meanwhile, having
    /// logged "address already in use", or a [`Probe::Foreign`] answer, is
    /// [`StartError::PortTaken`]; the process is killed on any failure.
    pub fn wait_ready(&mut self, deadline: Instant) -> Result<(), StartError> {
        loop {
            let exited = match self.child.as_mut() {
                Some(child) => child.try_wait().ok().flatten(),
                None => return Err(StartError::Failed(format!("{} not spawned", self.label))),
            };
            let log = self.log_since_spawn();
            if let Some(status) = exited {
                self.child = None;
                if log.to_ascii_lowercase().contains("address already in use") {
                    return Err(StartError::PortTaken);
                }
                return Err(StartError::Failed(format!(
                    "{} exited with {status}; log:\n{log}",
                    self.label
                )));
            }
            let Some(check) = &self.ready else {
                return Ok(());
            };
            match check(self.pid(), &log) {
                Probe::Ready => return Ok(()),
                Probe::NotYet => {}
                Probe::Foreign => {
                    self.kill9();
                    return Err(StartError::PortTaken);
                }
                Probe::Failed(why) => {
                    self.kill9();
                    return Err(StartError::Failed(format!("{}: {why}", self.label)));
                }
            }
            if Instant::now() > deadline {
                self.kill9();
                return Err(StartError::Failed(format!(
                    "{} not ready within {:?}; log:\n{}",
                    self.label,
                    self.ready_within,
                    self.log_since_spawn()
                )));
            }
            std::thread::sleep(PROBE_EVERY);
        }
    }

    /// Stops the process if it runs (SIGTERM) and starts it again with the same command line
    /// (same ports, same data dir), retrying for 10 s while a port is still taken.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + RESTART_WITHIN;
        loop {
            match self.start() {
                Ok(()) => return,
                Err(StartError::PortTaken) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Err(StartError::PortTaken) => {
                    panic!("{}: its port stayed taken after it stopped", self.label)
                }
                Err(StartError::Failed(why)) => panic!("could not restart {why}"),
            }
        }
    }

    /// Kills the process with SIGKILL (which also ends a paused one) and reaps it.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    /// Stops the process with SIGTERM (SIGKILL after 5 s) and reaps it.
    pub fn stop(&mut self) {
        if self.paused {
            self.resume();
        }
        let Some(mut child) = self.child.take() else {
            return;
        };
        signal(child.id(), Signal::Term);
        let deadline = Instant::now() + STOP_WITHIN;
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Freezes the process with SIGSTOP.
    pub fn pause(&mut self) {
        signal(self.pid(), Signal::Stop);
        self.paused = true;
    }

    /// Resumes a process frozen by [`pause`](TestProcess::pause) with SIGCONT.
    pub fn resume(&mut self) {
        signal(self.pid(), Signal::Cont);
        self.paused = false;
    }

    /// The exit status if the process has exited (it is then reaped), without waiting.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|child| child.try_wait().ok().flatten())
    }

    /// The piped stdout ([`pipe_stdout`](TestProcess::pipe_stdout)), once.
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.as_mut().and_then(|child| child.stdout.take())
    }

    /// The process id. Panics if it is not running.
    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .unwrap_or_else(|| panic!("{} is not running", self.label))
            .id()
    }

    /// Whether the process exists (running or paused; not killed, stopped or exited at start).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Whether the process is frozen by [`pause`](TestProcess::pause).
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// The name used in messages.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Everything logged so far, by every run of the process.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// What the current run logged.
    pub fn log_since_spawn(&self) -> String {
        let log = std::fs::read(&self.log_path).unwrap_or_default();
        let from = usize::try_from(self.log_offset).unwrap_or(0).min(log.len());
        String::from_utf8_lossy(&log[from..]).into_owned()
    }
}

impl Drop for TestProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "==== {} log ({}) ====\n{}\n==== end of {} log ====",
                self.label,
                self.log_path.display(),
                self.log(),
                self.label
            );
        }
        self.kill9();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_logs_is_paused_resumed_and_killed_by_pid() {
        let dir = temp_dir("dlock-testkit-");
        let mut command = Command::new("sh");
        command.args(["-c", "echo started; echo oops >&2; exec sleep 30"]);
        let mut process = TestProcess::new("sh", command, dir.path().join("sh.log")).ready_when(
            Duration::from_secs(10),
            |_, log| {
                if log.contains("started") && log.contains("oops") {
                    Probe::Ready
                } else {
                    Probe::NotYet
                }
            },
        );
        process.start().expect("sh starts");
        let pid = process.pid();
        process.pause();
        assert!(process.is_paused());
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
        assert!(stat.contains(") T "), "stopped once pause returns: {stat}");
        process.resume();
        process.kill9();
        assert!(!process.is_running());
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "reaped");
        process.restart();
        assert_ne!(process.pid(), pid);
        assert_eq!(process.log().matches("started").count(), 2);
        assert_eq!(process.log_since_spawn().matches("started").count(), 1);
    }

    #[test]
    fn an_early_exit_reports_the_log_and_a_taken_port() {
        let dir = temp_dir("dlock-testkit-");
        let mut command = Command::new("sh");
        command.args(["-c", "echo 'bind: Address already in use' >&2; exit 1"]);
        let mut process = TestProcess::new("sh", command, dir.path().join("sh.log"))
            .ready_when(Duration::from_secs(10), |_, _| Probe::NotYet);
        assert_eq!(process.start(), Err(StartError::PortTaken));
        let mut command = Command::new("sh");
        command.args(["-c", "echo broken; exit 3"]);
        let mut process = TestProcess::new("sh", command, dir.path().join("other.log"))
            .ready_when(Duration::from_secs(10), |_, _| Probe::NotYet);
        match process.start() {
            Err(StartError::Failed(why)) => assert!(why.contains("broken"), "{why}"),
            other => panic!("expected a failure, got {other:?}"),
        }
    }
}
