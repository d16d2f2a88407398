//! The runtime's log lines, captured: [`captured_logs`] installs (once per test binary) a
//! `tracing` subscriber that records every event at debug level or above into memory, so a test
//! can assert what was logged (a warning it expects, a secret that must not appear). Tests of
//! one binary run in parallel and share the capture: look for lines naming your own key.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use tracing_subscriber::fmt::MakeWriter;

/// Everything logged since [`captured_logs`] was first called in this test binary.
#[derive(Debug, Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// The captured text so far.
    pub fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The captured lines that contain every one of `parts`.
    pub fn lines_with(&self, parts: &[&str]) -> Vec<String> {
        self.text()
            .lines()
            .filter(|line| parts.iter().all(|p| line.contains(p)))
            .map(str::to_owned)
            .collect()
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut bytes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Logs {
    type Writer = Logs;

    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

/// The process-wide capture, installed as the global `tracing` subscriber on first use (every
/// target, debug and above, no colours). Panics if another global subscriber was installed
/// first.
pub fn captured_logs() -> &'static Logs {
    static LOGS: OnceLock<Logs> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Logs::default();
        tracing_subscriber::fmt()
            .with_max_level(tracing_subscriber::filter::LevelFilter::DEBUG)
            .with_ansi(false)
            .with_writer(logs.clone())
            .try_init()
            .expect("no other global tracing subscriber in this test binary");
        logs
    })
}
