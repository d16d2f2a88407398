//! Acquiring: the lock builder, waiting, reentrancy within a call chain, and `with_lock`.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::LockError;
use crate::acquire::acquire_fresh;
use crate::chain::{CHAIN, in_chain, new_chain};
use crate::core::{Core, validate_lease};
use crate::guard::LockGuard;

/// What to do when the lease is lost while the protected code runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnLost {
    /// Drop the protected future and return [`LockError::Lost`] (default): the code never
    /// keeps running without the lock.
    #[default]
    Cancel,
    /// Let the protected future finish; the loss is logged.
    Ignore,
}

/// A lock to acquire: key plus options. Made by [`lock`] or [`Runtime::lock`](crate::Runtime::lock).
///
/// | option | default | meaning |
/// |---|---|---|
/// | [`lease`](LockBuilder::lease) | runtime's (30 s) | TTL written to the engine, renewed every `lease/3` |
/// | [`wait`](LockBuilder::wait) | runtime's (zero) | how long to wait while busy; zero = one attempt |
/// | [`watchdog`](LockBuilder::watchdog) | `true` | `false`: the lease is a hard cap |
/// | [`on_lost`](LockBuilder::on_lost) | [`OnLost::Cancel`] | policy of [`with_lock`] when the lease is lost |
#[must_use = "a lock builder does nothing until `.acquire().await` or `with_lock`"]
pub struct LockBuilder {
    rt: Option<Arc<Core>>,
    key: String,
    lease: Option<Duration>,
    wait: Option<Duration>,
    watchdog: bool,
    on_lost: OnLost,
}

impl fmt::Debug for LockBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockBuilder")
            .field("key", &self.key)
            .field("lease", &self.lease)
            .field("wait", &self.wait)
            .field("watchdog", &self.watchdog)
            .field("on_lost", &self.on_lost)
            .finish()
    }
}

/// A lock on `key` in the current runtime (the innermost [`Runtime::scope`](crate::Runtime::scope), else the
/// installed one), resolved when acquired.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock_runtime::LockError> {
/// # let rt = dlock_runtime::Runtime::from_url("memory://").await?;
/// # rt.scope(async {
/// use std::time::Duration;
/// let guard = dlock_runtime::lock("stock:42")
///     .lease(Duration::from_secs(10))
///     .wait(Duration::from_millis(500))
///     .acquire()
///     .await?;
/// // ... critical section ...
/// guard.release().await?;
/// # Ok::<(), dlock_runtime::LockError>(()) }).await?;
/// # Ok(()) }
/// ```
pub fn lock(key: impl Into<String>) -> LockBuilder {
    LockBuilder::new(None, key.into())
}

impl LockBuilder {
    pub(crate) fn new(rt: Option<Arc<Core>>, key: String) -> Self {
        Self {
            rt,
            key,
            lease: None,
            wait: None,
            watchdog: true,
            on_lost: OnLost::Cancel,
        }
    }

    /// The TTL written to the engine. With the watchdog on (default) it is renewed every
    /// `lease/3` while held, so it only bounds how long a dead holder blocks others. Must be
    /// greater than zero; sub-millisecond leases round up to 1 ms on Redis.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// How long to wait while the lock is busy. Zero is exactly one attempt.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// `false` turns renewal off: the lease becomes a hard cap, after which the lock counts as
    /// lost (Redisson's `tryLock(wait, lease)`).
    pub fn watchdog(mut self, enabled: bool) -> Self {
        self.watchdog = enabled;
        self
    }

    /// Policy of [`with_lock`] (and the attribute) when the lease is lost.
    pub fn on_lost(mut self, policy: OnLost) -> Self {
        self.on_lost = policy;
        self
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Acquires the lock, waiting up to the `wait` budget by notification.
    ///
    /// Inside a call chain (an annotated call or [`with_lock`]) that already holds this key in
    /// the same runtime, re-enters: the hold count grows, the fence stays, nothing is sent to
    /// the engine, and the returned guard's release leaves the outer hold in place.
    ///
    /// Errors: [`LockError::Timeout`] when still busy at the deadline, [`LockError::Backend`]
    /// when the engine fails, [`LockError::InvalidConfig`] for an empty key or a bad lease,
    /// [`LockError::NotInstalled`] without a runtime, [`LockError::Lost`] when re-entering a
    /// hold whose lease is already lost.
    ///
    /// Cancel-safe: dropping the future while it waits or while the request is in flight
    /// leaves no lock behind (a compensating owner-checked release is sent).
    pub async fn acquire(self) -> Result<LockGuard, LockError> {
        let core = match self.rt {
            Some(core) => core,
            None => crate::core::current()?,
        };
        if self.key.is_empty() {
            return Err(LockError::config("lock key is empty"));
        }
        let lease = self.lease.unwrap_or(core.default_lease);
        validate_lease(lease, &format!("lease of lock `{}`", self.key))?;
        core.backend.lease_margin(lease)?;
        let wait = self.wait.unwrap_or(core.default_wait);

        // One task-local lookup: `Err` outside any call chain, else the hold to re-enter.
        let reentry = CHAIN.try_with(|c| c.borrow().find(core.id, &self.key));
        let in_chain = reentry.is_ok();
        if let Ok(Some(held)) = reentry
            && held.add_hold()
        {
            if held.lost.is_lost() {
                held.drop_hold();
                return Err(LockError::Lost { key: self.key });
            }
            CHAIN.with(|c| c.borrow_mut().push(held.clone()));
            tracing::trace!(key = %held.key, "lock re-entered");
            return Ok(LockGuard::new(held, true));
        }
        let held = acquire_fresh(&core, self.key, lease, wait, self.watchdog).await?;
        if in_chain {
            // Still inside the same task-local scope after the await.
            let _ = CHAIN.try_with(|c| c.borrow_mut().push(held.clone()));
        }
        Ok(LockGuard::new(held, in_chain))
    }
}

/// Runs `fut` while holding `lock`, releasing it on every exit path.
///
/// Equivalent to the attribute without the macro. The lock is acquired first (waiting up to
/// its `wait`); under [`OnLost::Cancel`] (default) `fut` is dropped as soon as the lease is
/// known lost and the call returns [`LockError::Lost`]. After `fut` completes the lock is
/// released and awaited; a release that finds the lease gone returns `Lost` under `Cancel`,
/// a release the engine fails to answer is logged (the lock then expires with its lease).
/// On panic or cancellation the release is scheduled from `Drop`.
///
/// Nested calls on the same key in the same chain re-enter.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock_runtime::LockError> {
/// # let rt = dlock_runtime::Runtime::from_url("memory://").await?;
/// # rt.scope(async {
/// use dlock_runtime::{lock, with_lock};
/// let total = with_lock(lock("cart:7"), async {
///     // re-enters: same chain, same key
///     with_lock(lock("cart:7"), async { 40 }).await.map(|n| n + 2)
/// })
/// .await??;
/// assert_eq!(total, 42);
/// # Ok::<(), dlock_runtime::LockError>(()) }).await?;
/// # Ok(()) }
/// ```
pub async fn with_lock<T>(lock: LockBuilder, fut: impl Future<Output = T>) -> Result<T, LockError> {
    if in_chain() {
        protected(lock, fut).await
    } else {
        new_chain(protected(lock, fut)).await
    }
}

/// [`with_lock`] inside a call chain.
pub(crate) async fn protected<T>(
    lock: LockBuilder,
    fut: impl Future<Output = T>,
) -> Result<T, LockError> {
    let on_lost = lock.on_lost;
    let guard = lock.acquire().await?;
    let out = match on_lost {
        OnLost::Cancel => match guard.run_unless_lost(fut).await {
            Some(out) => out,
            None => {
                return Err(LockError::Lost {
                    key: guard.key().to_owned(),
                });
            }
        },
        OnLost::Ignore => fut.await,
    };
    match guard.release().await {
        Ok(()) => Ok(out),
        Err(LockError::Lost { key }) if on_lost == OnLost::Cancel => Err(LockError::Lost { key }),
        Err(err) => {
            tracing::warn!(error = %err, "release after the protected code failed");
            Ok(out)
        }
    }
}
