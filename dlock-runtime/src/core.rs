//! One configured runtime's shared state, where it is found (installed or scoped), and the
//! background release every exit path falls back on.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::task::futures::TaskLocalFuture;
use tokio::time::Instant;

use crate::LockError;
use crate::backend::{DynBackend, Released};
use crate::events::Observer;
use crate::held::hold_left;
use crate::last_resort::{self, LastResort};
use crate::wait::WaitHub;
use crate::watchdog::Watchdog;

/// Longest lease accepted (one year); longer is [`LockError::InvalidConfig`].
pub const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// Attempts of a release scheduled from `Drop` or after a cancelled acquire.
const BACKGROUND_RELEASE_ATTEMPTS: u32 = 5;

/// What a `Runtime` shares with its locks, guards and background tasks.
pub(crate) struct Core {
    /// Random id: names this runtime's own release messages, and scopes reentrancy.
    pub(crate) id: u64,
    pub(crate) backend: Arc<dyn DynBackend>,
    pub(crate) hub: Arc<WaitHub>,
    pub(crate) watchdog: Arc<Watchdog>,
    /// Events, metrics and tracing of its locks.
    pub(crate) observer: Arc<Observer>,
    /// When the holders of keys whose acquisition timed out end their lease, as last seen.
    pub(crate) busy: BusyUntil,
    pub(crate) handle: Handle,
    pub(crate) prefix: String,
    pub(crate) default_lease: Duration,
    pub(crate) default_wait: Duration,
    pub(crate) engine: &'static str,
    /// Bound on each engine call.
    pub(crate) timeout: Duration,
    /// Releases without `handle`, once its tokio runtime is gone.
    pub(crate) last_resort: LastResort,
}

impl Drop for Core {
    fn drop(&mut self) {
        self.watchdog.close();
    }
}

/// Keys [`BusyUntil`] remembers at most: beyond, the expired entries go, and if that is not
/// enough, all of them (a `Retry-After` of 1 s is the fallback, not an error).
const BUSY_KEYS: usize = 1024;

/// The instant each busy key's holder ends its lease, as the last acquisition of it that timed
/// out was told (see [`LockError::holder_ttl`]).
#[derive(Debug, Default)]
pub(crate) struct BusyUntil(Mutex<HashMap<String, Instant>>);

impl BusyUntil {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Instant>> {
        // Map operations cannot be interrupted half-way: a poisoned lock is consistent.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An acquisition of `key` timed out; the holder had `ttl` left (`None`: not known).
    pub(crate) fn note(&self, key: &str, ttl: Option<Duration>) {
        let mut map = self.map();
        let Some(ttl) = ttl else {
            map.remove(key);
            return;
        };
        let now = Instant::now();
        if map.len() >= BUSY_KEYS && !map.contains_key(key) {
            map.retain(|_, until| *until > now);
            if map.len() >= BUSY_KEYS {
                map.clear();
            }
        }
        map.insert(key.to_owned(), now + ttl);
    }

    /// What the holder of `key` has left, if known and not over.
    pub(crate) fn remaining(&self, key: &str) -> Option<Duration> {
        let until = *self.map().get(key)?;
        let left = until.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
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

/// Ends `owner`'s hold on `key` in the engine: a release, or, while a `hold_at_least` that
/// keeps the key until `hold_until` lasts, [`release_after`](crate::backend::Backend::release_after)
/// with what remains of it.
pub(crate) async fn end_in_engine(
    backend: &dyn DynBackend,
    key: &str,
    owner: &str,
    hold_until: Option<Instant>,
) -> Result<Released, LockError> {
    match hold_left(hold_until) {
        Some(left) => backend.release_after(key, owner, left).await,
        None => backend.release(key, owner).await,
    }
}

/// Releases `owner`'s hold on `key` (kept until `hold_until`, if any) from a spawned task
/// (Drop, cancellation). If that task is dropped before it finishes (its tokio runtime shuts
/// down, or is already gone), the release runs on the [last resort](crate::last_resort)
/// instead.
pub(crate) fn release_in_background(
    core: Arc<Core>,
    key: String,
    owner: String,
    hold_until: Option<Instant>,
) {
    spawn_release(core, key, owner, hold_until, false);
}

fn spawn_release(
    core: Arc<Core>,
    key: String,
    owner: String,
    hold_until: Option<Instant>,
    compensating: bool,
) {
    let handle = core.handle.clone();
    let pending = PendingRelease {
        core,
        key,
        owner,
        hold_until,
        finished: false,
    };
    handle.spawn(async move {
        let (core, key, owner) = (&pending.core, &pending.key, &pending.owner);
        let mut found = release_with_retries(core, key, owner, hold_until).await;
        if compensating {
            for wait in [core.timeout, core.timeout * 2] {
                if found {
                    break;
                }
                tokio::time::sleep(wait).await;
                found = release_with_retries(core, key, owner, None).await;
                if found {
                    tracing::debug!(key = %key, "an acquire that landed after its compensating release was undone");
                }
            }
        }
        pending.finish();
    });
}

/// A background release; if dropped unfinished, hands over to the last resort.
struct PendingRelease {
    core: Arc<Core>,
    key: String,
    owner: String,
    hold_until: Option<Instant>,
    finished: bool,
}

impl PendingRelease {
    /// Done (released, or given up after its retries): nothing for the last resort.
    fn finish(mut self) {
        self.finished = true;
    }
}

impl Drop for PendingRelease {
    fn drop(&mut self) {
        if !self.finished {
            last_resort::release(&self.core, &self.key, &self.owner, self.hold_until);
        }
    }
}

/// Retried a few times: a release that fails leaves the lock until its lease ends. `false`
/// when the engine had nothing of `owner`'s. Each attempt keeps the key for what is left of
/// the hold until `hold_until` (if any).
async fn release_with_retries(
    core: &Core,
    key: &str,
    owner: &str,
    hold_until: Option<Instant>,
) -> bool {
    let mut delay = Duration::from_millis(100);
    for attempt in 1..=BACKGROUND_RELEASE_ATTEMPTS {
        match end_in_engine(core.backend.as_ref(), key, owner, hold_until).await {
            Ok(Released::Freed) => {
                tracing::debug!(key = %key, "lock released in the background");
                core.hub.wake(key);
                return true;
            }
            Ok(Released::Kept) => {
                tracing::debug!(key = %key, "lock released in the background; its key is kept until its hold ends");
                // Local waiters look again and wait for the hold's end, not the lease's.
                core.hub.wake(key);
                return true;
            }
            Ok(Released::NotOwner) => {
                core.hub.wake(key);
                return false;
            }
            Ok(Released::StillHeld) => return true,
            Err(err) if attempt < BACKGROUND_RELEASE_ATTEMPTS => {
                tracing::debug!(key = %key, error = %err, "background release failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            Err(err) => {
                tracing::warn!(key = %key, error = %err, "background release failed; the lock expires with its lease");
            }
        }
    }
    // Given up: looking again would not help.
    true
}

/// Until disarmed, schedules an owner-checked release of `owner`'s hold on `key` when dropped:
/// an engine call whose answer never arrived (an error, a timeout, the future dropped) may
/// still have landed, and the release is a no-op if it did not.
pub(crate) struct ReleaseOnDrop<'a> {
    core: &'a Arc<Core>,
    key: &'a str,
    owner: &'a str,
    /// The end of the hold that keeps the key (see [`end_in_engine`]).
    hold_until: Option<Instant>,
    armed: bool,
    /// Undoes an acquire request (which may land late) rather than finishing a release.
    compensating: bool,
}

impl<'a> ReleaseOnDrop<'a> {
    pub(crate) fn new(
        core: &'a Arc<Core>,
        key: &'a str,
        owner: &'a str,
        hold_until: Option<Instant>,
    ) -> Self {
        Self {
            core,
            key,
            owner,
            hold_until,
            armed: true,
            compensating: false,
        }
    }

    /// Until disarmed, undoes the acquire request of `owner` on `key` when dropped. The
    /// request may still land after this release (a reconnect resends nothing, but a Cluster
    /// redirect or a slow socket can deliver it late): when the release finds nothing of
    /// `owner`'s, it looks again after the runtime's `timeout` and after three, by when every
    /// request of that owner has been answered or given up. A late acquire therefore keeps
    /// the key for about the runtime's `timeout` at most, not for its lease.
    pub(crate) fn compensate(core: &'a Arc<Core>, key: &'a str, owner: &'a str) -> Self {
        // Not `..Self::new(..)`: that would make (and drop, armed) a second value.
        Self {
            core,
            key,
            owner,
            hold_until: None,
            armed: true,
            compensating: true,
        }
    }

    /// The call answered: nothing to compensate.
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            spawn_release(
                self.core.clone(),
                self.key.to_owned(),
                self.owner.to_owned(),
                self.hold_until,
                self.compensating,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Runtime;
    use crate::backend::Attempt;

    /// A compensating release that reaches the engine before the acquire it undoes (which
    /// then lands): the key is freed within a few `timeout`s, not held for the 30 s lease.
    #[tokio::test(start_paused = true)]
    async fn an_acquire_landing_after_its_compensation_is_undone() {
        let rt = Runtime::builder()
            .memory()
            .timeout(Duration::from_secs(1))
            .build()
            .await
            .expect("memory runtime");
        let core = rt.core.clone();
        drop(ReleaseOnDrop::compensate(&core, "k", "late"));
        // The compensation runs first and finds nothing; then the request lands.
        tokio::time::sleep(Duration::from_millis(10)).await;
        let landed = core
            .backend
            .try_acquire("k", "late", Duration::from_secs(30))
            .await
            .expect("acquire");
        assert!(matches!(landed, Attempt::Acquired { .. }), "{landed:?}");
        tokio::time::sleep(Duration::from_millis(3500)).await;
        let locked = core.backend.is_locked("k").await.expect("is_locked");
        assert!(
            !locked,
            "the late acquire kept the key past its compensation"
        );
    }
}
