//! Shared parts of the dlock examples.
//!
//! The binaries in `src/bin/` are the examples; this library holds what they share and what the
//! end-to-end test needs to start a service in-process:
//!
//! - [`store`]: the data the locks protect (stock counters), either process-local or in Redis,
//!   with a deliberately non-atomic read-then-write API: only the lock keeps it consistent.
//! - [`inventory`]: the axum inventory service of the `inventory` binary
//!   ([`inventory::app`] builds its router).
//! - [`init_logging`]: `RUST_LOG`-driven logging, so the runtime's own log lines show.

use std::io::IsTerminal;

pub mod inventory;
pub mod store;

/// Installs a `tracing` subscriber printing to stderr, filtered by `RUST_LOG` (default
/// `info`, which shows the runtime's warnings such as "DLOCK_URL is not set"; with
/// `RUST_LOG=dlock_runtime=debug` also failed renewals that are retried).
///
/// Does nothing if a subscriber is already installed.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}
