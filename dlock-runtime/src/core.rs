//! What a runtime shares with its locks, guards and background tasks, and where the current
//! runtime is found (the innermost scope, else the installed one).

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::task::futures::TaskLocalFuture;

use crate::backend::{AnyBackend, Capabilities};
use crate::baton::Baton;
use crate::error::LockError;
use crate::events::Observer;
use crate::release::Releaser;
use crate::wait::WaitHub;
use crate::watchdog::Watchdog;

/// Longest lease accepted (one year); longer is [`LockError::InvalidConfig`].
pub const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// Longest deadline the runtime computes; a larger `wait` means "until acquired".
pub(crate) const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The local queues of a runtime, whose slots hold batons.
pub(crate) type Hub = WaitHub<Baton>;

/// What a `Runtime` shares with its locks, guards and background tasks.
pub(crate) struct Core {
    /// Random id: names this runtime's own release messages, and scopes reentrancy.
    pub(crate) id: u64,
    pub(crate) backend: Arc<AnyBackend>,
    /// What the engine can do, read when the runtime connected.
    pub(crate) caps: Capabilities,
    pub(crate) hub: Arc<Hub>,
    pub(crate) watchdog: Arc<Watchdog>,
    /// Events, metrics and tracing of its locks.
    pub(crate) observer: Arc<Observer>,
    /// Background releases (Drop, cancellation), with the last resort behind them.
    pub(crate) releaser: Arc<Releaser>,
    pub(crate) handle: Handle,
    pub(crate) prefix: String,
    pub(crate) default_lease: Duration,
    pub(crate) default_wait: Duration,
    pub(crate) engine: &'static str,
}

impl Drop for Core {
    fn drop(&mut self) {
        self.watchdog.close();
    }
}

static GLOBAL: OnceLock<Arc<Core>> = OnceLock::new();

tokio::task_local! {
    static SCOPED: Arc<Core>;
}

/// Makes `core` the process-wide default; `AlreadyInstalled` the second time.
pub(crate) fn install(core: Arc<Core>) -> Result<(), LockError> {
    GLOBAL.set(core).map_err(|_| LockError::AlreadyInstalled)
}

/// The innermost scoped runtime, else the installed one, else `NotInstalled`.
pub(crate) fn current() -> Result<Arc<Core>, LockError> {
    SCOPED
        .try_with(Arc::clone)
        .ok()
        .or_else(|| GLOBAL.get().cloned())
        .ok_or(LockError::NotInstalled)
}

/// Runs `fut` with `core` as the current runtime.
pub(crate) fn scope<F: Future>(core: Arc<Core>, fut: F) -> TaskLocalFuture<Arc<Core>, F> {
    SCOPED.scope(core, fut)
}

/// A lease must be positive and at most [`MAX_LEASE`].
/// `what` names the lease in the error (formatted only when there is one).
pub(crate) fn validate_lease(
    lease: Duration,
    what: impl std::fmt::Display,
) -> Result<(), LockError> {
    if lease.is_zero() {
        return Err(LockError::config(format!(
            "{what} must be greater than zero"
        )));
    }
    if lease > MAX_LEASE {
        return Err(LockError::config(format!(
            "{what} of {lease:?} is longer than the maximum of one year"
        )));
    }
    Ok(())
}
