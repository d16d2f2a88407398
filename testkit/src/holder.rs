//! [`HolderProcess`]: a program that takes locks from a separate OS process (the
//! `dlock-holder` binary of the tests package), for exclusion across processes and for faults
//! of a holder (kill -9, SIGSTOP).

use std::io::BufRead;
use std::path::Path;
use std::process::{Command, ExitStatus};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::process::{TestProcess, temp_dir};

/// A running lock-holder process: its stdout is read line by line, its stderr goes to a log
/// printed if the test fails. Killed (SIGKILL, by PID) and reaped on drop.
#[derive(Debug)]
pub struct HolderProcess {
    process: TestProcess,
    lines: mpsc::UnboundedReceiver<std::io::Result<String>>,
    /// Last: deleted after the process is killed.
    _dir: tempfile::TempDir,
}

impl HolderProcess {
    /// Spawns `bin` (in this workspace `env!("CARGO_BIN_EXE_dlock-holder")`) with `args`.
    pub fn spawn(bin: &str, args: &[&str]) -> HolderProcess {
        let dir = temp_dir("dlock-holder-");
        let mut command = Command::new(bin);
        command.args(args);
        let name = Path::new(bin)
            .file_name()
            .map_or_else(|| bin.into(), |n| n.to_string_lossy());
        let mut process = TestProcess::new(
            format!("{name} {}", args.join(" ")),
            command,
            dir.path().join("stderr.log"),
        )
        .pipe_stdout();
        if let Err(e) = process.spawn() {
            panic!("spawn {bin}: {e:?}");
        }
        let stdout = process.take_stdout().expect("piped stdout");
        let (line, lines) = mpsc::unbounded_channel();
        // Ends at end of output, when the process exits or is killed.
        std::thread::spawn(move || {
            for next in std::io::BufReader::new(stdout).lines() {
                if line.send(next).is_err() {
                    return;
                }
            }
        });
        HolderProcess {
            process,
            lines,
            _dir: dir,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The next line the holder prints; panics after `within` or at end of output.
    pub async fn next_line(&mut self, within: Duration) -> String {
        match tokio::time::timeout(within, self.lines.recv()).await {
            Ok(Some(Ok(line))) => line,
            Ok(None) => panic!("{} closed its stdout", self.process.label()),
            Ok(Some(Err(e))) => panic!("reading {}'s stdout: {e}", self.process.label()),
            Err(_) => panic!("{} printed nothing within {within:?}", self.process.label()),
        }
    }

    /// Freezes the holder with SIGSTOP: its watchdog stops renewing.
    pub fn pause(&mut self) {
        self.process.pause();
    }

    /// Resumes a holder frozen by [`pause`](HolderProcess::pause) with SIGCONT.
    pub fn resume(&mut self) {
        self.process.resume();
    }

    /// SIGKILL, then reap.
    pub async fn kill9(&mut self) {
        self.process.kill9();
    }

    /// Waits for the process to exit, at most `within`.
    pub async fn wait(&mut self, within: Duration) -> ExitStatus {
        let exited = async {
            loop {
                if let Some(status) = self.process.try_wait() {
                    return status;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        match tokio::time::timeout(within, exited).await {
            Ok(status) => status,
            Err(_) => panic!("{} did not exit within {within:?}", self.process.label()),
        }
    }
}
