//! Acquiring: the lock builder, waiting, reentrancy within a call chain, and `with_lock`.

use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Attempt, Released};
use crate::guard::{Held, LockGuard};
use crate::runtime::{Core, validate_lease};
use crate::{LockError, Runtime};

/// Attempts of a release scheduled from `Drop` or after a cancelled acquire.
const BACKGROUND_RELEASE_ATTEMPTS: u32 = 5;

/// Pause before a waiter retries after an engine error.
const ERROR_RETRY: Duration = Duration::from_millis(100);

/// Longest deadline the runtime computes; a larger `wait` means "until acquired".
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

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

/// A lock to acquire: key plus options. Made by [`lock`] or [`Runtime::lock`].
///
/// | option | default | meaning |
/// |---|---|---|
/// | [`lease`](LockBuilder::lease) | runtime's (30 s) | TTL written to the engine, renewed every `lease/3` |
/// | [`wait`](LockBuilder::wait) | runtime's (zero) | how long to wait while busy; zero = one attempt |
/// | [`watchdog`](LockBuilder::watchdog) | `true` | `false`: the lease is a hard cap |
/// | [`on_lost`](LockBuilder::on_lost) | [`OnLost::Cancel`] | policy of [`with_lock`] when the lease is lost |
#[must_use = "a lock builder does nothing until `.acquire().await` or `with_lock`"]
pub struct LockBuilder {
    rt: Option<Runtime>,
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

/// A lock on `key` in the current runtime (the innermost [`Runtime::scope`], else the
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
    pub(crate) fn new(rt: Option<Runtime>, key: String) -> Self {
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
        let rt = match self.rt {
            Some(rt) => rt,
            None => Runtime::current()?,
        };
        let core = rt.core;
        if self.key.is_empty() {
            return Err(LockError::config("lock key is empty"));
        }
        let lease = self.lease.unwrap_or(core.default_lease);
        validate_lease(lease, &format!("lease of lock `{}`", self.key))?;
        core.backend.check_lease(lease)?;
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

/// A random 128-bit owner token, chosen before any request is sent.
fn new_owner() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// One owner-checked attempt; if the answer never arrives (error, timeout, or the future is
/// dropped), a compensating release with the same owner token is scheduled, which is a no-op
/// if the request never landed.
async fn attempt(
    core: &Arc<Core>,
    key: &str,
    owner: &str,
    lease: Duration,
) -> Result<Attempt, LockError> {
    compensated(
        core,
        key,
        owner,
        core.backend.try_acquire(key, owner, lease),
    )
    .await
}

/// Runs one acquire request; if its answer never arrives (error, timeout, or the future is
/// dropped), schedules an owner-checked release with the same token.
async fn compensated(
    core: &Arc<Core>,
    key: &str,
    owner: &str,
    request: crate::backend::BoxFuture<'_, Result<Attempt, LockError>>,
) -> Result<Attempt, LockError> {
    struct Compensate<'a> {
        core: &'a Arc<Core>,
        key: &'a str,
        owner: &'a str,
        armed: bool,
    }
    impl Drop for Compensate<'_> {
        fn drop(&mut self) {
            if self.armed {
                release_in_background(
                    self.core.clone(),
                    self.key.to_owned(),
                    self.owner.to_owned(),
                );
            }
        }
    }
    let mut compensate = Compensate {
        core,
        key,
        owner,
        armed: true,
    };
    let result = request.await;
    compensate.armed = result.is_err();
    result
}

/// Releases `owner`'s hold on `key` from a spawned task (Drop, cancellation).
pub(crate) fn release_in_background(core: Arc<Core>, key: String, owner: String) {
    let handle = core.handle.clone();
    handle.spawn(async move {
        // Retried a few times: a release that fails leaves the lock until its lease ends.
        let mut delay = Duration::from_millis(100);
        for attempt in 1..=BACKGROUND_RELEASE_ATTEMPTS {
            match core.backend.release(&key, &owner).await {
                Ok(Released::Freed) => {
                    tracing::debug!(key = %key, "lock released in the background");
                    core.hub.wake(&key);
                    return;
                }
                Ok(Released::NotOwner) => {
                    core.hub.wake(&key);
                    return;
                }
                Ok(Released::StillHeld) => return,
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
    });
}

async fn acquire_fresh(
    core: &Arc<Core>,
    key: String,
    lease: Duration,
    wait: Duration,
    watchdog: bool,
) -> Result<Arc<Held>, LockError> {
    let owner = new_owner();
    let started = Instant::now();
    let deadline = started + wait.min(FOREVER);
    let timeout = |key: String| LockError::Timeout {
        key,
        waited: started.elapsed(),
    };

    // Engines with their own FIFO queue wait there (no local queue, no polling).
    let mut owner = owner;
    let queued = loop {
        let Some(request) = core.backend.acquire_queued(&key, &owner, lease, deadline) else {
            break None;
        };
        match compensated(core, &key, &owner, request).await {
            Ok(answer) => break Some(answer),
            // A transient engine error (a new session, a failover) while the wait budget
            // lasts: queue again with a fresh owner token.
            Err(err) if err.is_backend() && Instant::now() + ERROR_RETRY < deadline => {
                tracing::debug!(key = %key, error = %err, "queueing failed; retrying within the wait");
                owner = new_owner();
                tokio::time::sleep(ERROR_RETRY).await;
            }
            Err(err) => return Err(err),
        }
    };
    if let Some(answer) = queued {
        return match answer {
            Attempt::Acquired { fence } => {
                // The lease was granted when the request started and kept alive while queued:
                // count on it from the later of that start and a third of a lease ago.
                let since = Instant::now()
                    .checked_sub(lease / 3)
                    .map_or(started, |t| t.max(started));
                Ok(Held::new(core, key, owner, fence, lease, watchdog, since))
            }
            Attempt::Busy { .. } => Err(timeout(key)),
        };
    }

    // Fast path: one attempt, unless local waiters are queued (then queue behind them).
    if wait.is_zero() || !core.hub.has_waiters(&key) {
        let sent_at = Instant::now();
        match attempt(core, &key, &owner, lease).await? {
            Attempt::Acquired { fence } => {
                return Ok(Held::new(core, key, owner, fence, lease, watchdog, sent_at));
            }
            Attempt::Busy { .. } if wait.is_zero() => return Err(timeout(key)),
            Attempt::Busy { .. } => {}
        }
    }

    // Slow path, boxed so that the common uncontended acquire stays a small future.
    tracing::debug!(key = %key, ?wait, "lock busy; waiting for a release");
    Box::pin(wait_in_queue(
        core, key, owner, lease, watchdog, started, deadline,
    ))
    .await
}

/// Queues locally; the head of the queue subscribes and contends until `deadline`.
async fn wait_in_queue(
    core: &Arc<Core>,
    key: String,
    mut owner: String,
    lease: Duration,
    watchdog: bool,
    started: Instant,
    deadline: Instant,
) -> Result<Arc<Held>, LockError> {
    let timeout = |key: String| LockError::Timeout {
        key,
        waited: started.elapsed(),
    };
    let ticket = core.hub.join(&key);
    let Ok(_turn) = tokio::time::timeout_at(deadline, ticket.queue().turn.lock()).await else {
        return Err(timeout(key));
    };
    match tokio::time::timeout_at(deadline, ticket.ensure_watched()).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => return Err(err),
        Err(_) => return Err(timeout(key)),
    }
    let queue = ticket.queue();
    loop {
        let freed = queue.freed.notified();
        tokio::pin!(freed);
        freed.as_mut().enable();
        // The previous head of this queue holds the key: its release wakes us, and an attempt
        // now could only fail (no herd, no wasted round trip on a hot key).
        if let Some(holder_lease) = queue.held_here() {
            let until = (Instant::now() + holder_lease.min(FOREVER)).min(deadline);
            tokio::select! {
                _ = freed => {}
                _ = tokio::time::sleep_until(until) => queue.clear_held(),
            }
            continue;
        }
        let sent_at = Instant::now();
        let answer = match attempt(core, &key, &owner, lease).await {
            Ok(answer) => answer,
            // A transient engine error (a failover, a reconnect) while the wait budget lasts:
            // try again shortly. The failed attempt's compensating release carries the old
            // owner token, so the next attempt takes a fresh one.
            Err(err) if err.is_backend() && Instant::now() + ERROR_RETRY < deadline => {
                tracing::debug!(key = %key, error = %err, "attempt failed; retrying within the wait");
                owner = new_owner();
                tokio::time::sleep(ERROR_RETRY).await;
                continue;
            }
            Err(err) => return Err(err),
        };
        match answer {
            Attempt::Acquired { fence } => {
                queue.mark_held(lease);
                return Ok(Held::new(core, key, owner, fence, lease, watchdog, sent_at));
            }
            Attempt::Busy { ttl } => {
                let now = Instant::now();
                if now >= deadline {
                    return Err(timeout(key));
                }
                // A lost notification costs at most the holder's remaining TTL. Without a TTL
                // (somebody persisted the key) look again after a short while.
                let recheck = now + ttl.unwrap_or(Duration::from_millis(100)).min(FOREVER);
                tokio::select! {
                    _ = freed => {}
                    _ = tokio::time::sleep_until(recheck.min(deadline)) => {}
                }
            }
        }
    }
}

tokio::task_local! {
    /// The locks held by one call chain (the dynamic extent of an annotated call or of
    /// [`with_lock`]). Spawned tasks do not inherit it: another task is another owner.
    static CHAIN: RefCell<ChainHolds>;
}

/// The holds of one call chain, innermost last. The first lives inline: a chain that holds
/// one lock at a time never allocates.
#[derive(Default)]
pub(crate) struct ChainHolds {
    first: Option<Arc<Held>>,
    more: Vec<Arc<Held>>,
}

impl ChainHolds {
    /// Innermost first.
    fn iter_rev(&self) -> impl Iterator<Item = &Arc<Held>> {
        self.more.iter().rev().chain(self.first.iter())
    }

    fn find(&self, runtime: u64, key: &str) -> Option<Arc<Held>> {
        self.iter_rev()
            .find(|h| h.core.id == runtime && h.key == key)
            .cloned()
    }

    fn push(&mut self, held: Arc<Held>) {
        if self.first.is_none() && self.more.is_empty() {
            self.first = Some(held);
        } else {
            self.more.push(held);
        }
    }

    fn remove(&mut self, held: &Arc<Held>) {
        if let Some(i) = self.more.iter().rposition(|h| Arc::ptr_eq(h, held)) {
            self.more.remove(i);
        } else if self.first.as_ref().is_some_and(|h| Arc::ptr_eq(h, held)) {
            self.first = None;
        }
    }
}

/// Whether this task is inside a call chain.
pub(crate) fn in_chain() -> bool {
    CHAIN.try_with(|_| ()).is_ok()
}

/// Runs `fut` as a new call chain (a plain function: an `async fn` would store `fut` twice).
pub(crate) fn new_chain<F: Future>(
    fut: F,
) -> tokio::task::futures::TaskLocalFuture<RefCell<ChainHolds>, F> {
    CHAIN.scope(RefCell::default(), fut)
}

/// Forgets the innermost occurrence of `held` in the current chain (no-op elsewhere).
pub(crate) fn leave_chain(held: &Arc<Held>) {
    let _ = CHAIN.try_with(|c| c.borrow_mut().remove(held));
}

/// The fencing token of the innermost lock held by this call chain, if any.
///
/// Pass it to the storage you write under the lock so it can reject a stale holder.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock_runtime::LockError> {
/// # let rt = dlock_runtime::Runtime::from_url("memory://").await?;
/// # rt.scope(async {
/// use dlock_runtime::{current_fence, lock, with_lock};
/// assert_eq!(current_fence(), None);
/// let fence = with_lock(lock("ledger"), async { current_fence() }).await?;
/// assert!(fence.is_some());
/// # Ok::<(), dlock_runtime::LockError>(()) }).await?;
/// # Ok(()) }
/// ```
pub fn current_fence() -> Option<u64> {
    CHAIN
        .try_with(|c| {
            c.borrow()
                .iter_rev()
                .find(|h| h.is_held())
                .and_then(|h| h.fence)
        })
        .ok()
        .flatten()
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
