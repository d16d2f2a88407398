//! Acquiring: the lock builder, waiting, reentrancy within a call chain, and `with_lock`.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::LockError;
use crate::acquire::{FOREVER, acquire_fresh};
use crate::backend::Fairness;
use crate::backend::mode::Mode;
use crate::chain::{Ended, Frame, InChain, Scope, current_frame};
use crate::core::{Core, validate_lease};
use crate::guard::LockGuard;
use crate::held::{Held, Reentry, Terms};
use crate::lost::LossCheck;

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
/// | [`hold_at_least`](LockBuilder::hold_at_least) | zero | the key stays taken at least this long after acquisition |
/// | [`read`](LockBuilder::read) | write | a read lock: shared with other readers, excluded by a writer |
/// | [`fair`](LockBuilder::fair) | `false` | waiters are served in the order they arrived, across processes |
///
/// [`Runtime::semaphore`](crate::Runtime::semaphore) makes a builder for one permit of a
/// semaphore instead. Made by [`lock_all`] or [`Runtime::lock_all`](crate::Runtime::lock_all), it takes several
/// keys, all or nothing (see [`lock_all`]).
#[must_use = "a lock builder does nothing until `.acquire().await` or `with_lock`"]
pub struct LockBuilder {
    rt: Option<Arc<Core>>,
    key: String,
    pub(crate) lease: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) watchdog: bool,
    on_lost: OnLost,
    pub(crate) hold_at_least: Duration,
    pub(crate) mode: Mode,
    pub(crate) fair: bool,
    /// Made by `lock_all`: every key in canonical order (sorted, without duplicates); `key` is
    /// the first. `None` for a one-key lock.
    keys: Option<Vec<String>>,
    /// A fresh hold is tracked by the watchdog only once [`Held::watch`] is called: set by
    /// [`protected`] for a one-key body it runs under [`OnLost::Cancel`], which calls it the
    /// first time the body waits.
    pub(crate) track_on_wait: bool,
}

impl fmt::Debug for LockBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockBuilder")
            .field("key", &self.key)
            .field("lease", &self.lease)
            .field("wait", &self.wait)
            .field("watchdog", &self.watchdog)
            .field("on_lost", &self.on_lost)
            .field("hold_at_least", &self.hold_at_least)
            .field("mode", &self.mode)
            .field("fair", &self.fair)
            .field("keys", &self.keys)
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

/// One permit of the semaphore `key` of `permits` in the current runtime (see
/// [`Runtime::semaphore`](crate::Runtime::semaphore)), resolved when acquired.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock_runtime::LockError> {
/// # let rt = dlock_runtime::Runtime::from_url("memory://").await?;
/// # rt.scope(async {
/// let permit = dlock_runtime::semaphore("api:quota", 8).acquire().await?;
/// // ... at most 8 of these run at once, across processes ...
/// permit.release().await?;
/// # Ok::<(), dlock_runtime::LockError>(()) }).await?;
/// # Ok(()) }
/// ```
pub fn semaphore(key: impl Into<String>, permits: u32) -> LockBuilder {
    LockBuilder::permit(None, key.into(), permits)
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
            hold_at_least: Duration::ZERO,
            mode: Mode::Exclusive,
            fair: false,
            keys: None,
            track_on_wait: false,
        }
    }

    /// A builder for one permit of the semaphore `key` of `permits`.
    pub(crate) fn permit(rt: Option<Arc<Core>>, key: String, permits: u32) -> Self {
        Self {
            mode: Mode::Permits(permits),
            ..Self::new(rt, key)
        }
    }

    /// Makes this a read lock: any number of readers hold the key together, across
    /// processes, while no writer does. A writer (the default mode, the same as a plain lock)
    /// excludes readers and other writers; once a writer waits, new readers queue behind it,
    /// so a stream of readers cannot starve it.
    ///
    /// Within one call chain, a read inside a write hold of the same key re-enters the write
    /// hold; a read inside a read re-enters; a write inside a read is
    /// [`LockError::InvalidConfig`] ("cannot upgrade a read lock to a write lock"), never a
    /// deadlock. Every reader gets its own fencing token, greater than every earlier holder's.
    /// Not on Redlock ([`LockError::InvalidConfig`] at acquire), and not with
    /// [`hold_at_least`](LockBuilder::hold_at_least).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dlock_runtime::LockError> {
    /// # let rt = dlock_runtime::Runtime::from_url("memory://").await?;
    /// let a = rt.lock("doc:1").read().acquire().await?;
    /// let b = rt.lock("doc:1").read().acquire().await?; // readers share the key
    /// assert!(rt.lock("doc:1").acquire().await.unwrap_err().is_timeout()); // a writer waits
    /// a.release().await?;
    /// b.release().await?;
    /// rt.lock("doc:1").acquire().await?.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn read(mut self) -> Self {
        self.mode = Mode::Read;
        self
    }

    /// A lock on every key of `keys` (see [`lock_all`]), in canonical order.
    pub(crate) fn all(
        rt: Option<Arc<Core>>,
        keys: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        let keys = crate::multi::canonical(keys);
        let first = keys.first().cloned().unwrap_or_default();
        Self {
            keys: Some(keys),
            ..Self::new(rt, first)
        }
    }

    /// The same lock options on the one key `key` (one key of a multi-key lock).
    pub(crate) fn one(&self, core: &Arc<Core>, key: String) -> Self {
        Self {
            rt: Some(core.clone()),
            key,
            keys: None,
            ..*self
        }
    }

    /// The keys of a multi-key lock (canonical order), `None` for a one-key lock.
    pub(crate) fn multi(&self) -> Option<&[String]> {
        self.keys.as_deref()
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

    /// Keeps the key taken until at least `hold` after the acquisition, even when the hold
    /// ends sooner (ShedLock's `lockAtLeastFor`): a scheduled job that finishes in a moment
    /// still makes the other nodes' runs of the same period skip.
    ///
    /// When the last guard ends (release, drop, panic, cancellation) before `hold` has passed,
    /// the key is not deleted: it stays taken by the same owner, no longer renewed, and frees
    /// by itself when the hold ends. Other holders get [`LockError::Timeout`] meanwhile
    /// (waiters get it when the hold ends, within their `wait`). A hold that lasts longer is
    /// released as usual. Counted from when the engine's answer arrived, so the key is never
    /// kept for less than asked (at most a round trip more; etcd rounds up to whole seconds).
    /// Reentrant acquisitions do not matter, the outermost does. With ZooKeeper, whose nodes
    /// live with the session, the node is deleted by a task of the runtime at the end of the
    /// hold: a process that exits meanwhile frees the key early.
    ///
    /// Must not be longer than the [`lease`](LockBuilder::lease) (the "at most", with
    /// `watchdog(false)`), whether the watchdog is on or not: [`LockError::InvalidConfig`] at
    /// [`acquire`](LockBuilder::acquire) otherwise. Zero (default): released at once.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dlock_runtime::LockError> {
    /// # let rt = dlock_runtime::Runtime::from_url("memory://").await?;
    /// use std::time::Duration;
    /// let run = rt
    ///     .lock("job:report")
    ///     .lease(Duration::from_secs(600))
    ///     .watchdog(false)
    ///     .hold_at_least(Duration::from_secs(30))
    ///     .acquire()
    ///     .await?;
    /// // ... the job, done in a moment ...
    /// run.release().await?;
    /// // Another node's run of the same period skips:
    /// assert!(rt.lock("job:report").acquire().await.unwrap_err().is_timeout());
    /// # Ok(()) }
    /// ```
    pub fn hold_at_least(mut self, hold: Duration) -> Self {
        self.hold_at_least = hold;
        self
    }

    /// Serves waiters strictly in the order they started waiting, across processes (a fair
    /// lock, Redisson's `getFairLock`). Without it (default) a release goes to whichever
    /// waiter gets there first, which is faster under contention but lets one process keep
    /// winning.
    ///
    /// | engine | `fair(true)` |
    /// |---|---|
    /// | memory | FIFO by default (the runtime's queue): accepted, nothing changes |
    /// | Redis, Redis Cluster | a queue of waiters in Redis: a list of owners and a sorted set of the deadlines of their places (`<prefix>{<key>}:queue`, `:places`) |
    /// | etcd, ZooKeeper | FIFO by default (the engine's own queue): accepted, nothing changes |
    /// | Redlock | [`LockError::InvalidConfig`] at [`acquire`](LockBuilder::acquire): independent masters keep no common queue |
    ///
    /// On Redis each waiter takes its place in line when it first finds the key busy and
    /// refreshes it (a heartbeat) while it waits; its place lasts
    /// [`FAIR_PLACE`](crate::FAIR_PLACE) (or its lease, if shorter) past each heartbeat, so a
    /// waiter whose process died stops blocking the line at most that long later. A waiter
    /// whose `wait` runs out leaves the line at once; one that is cancelled (its future
    /// dropped) leaves it from a background task. When the lock is
    /// released the waiters are notified (pub/sub) and the first in line takes it; within a
    /// process, a release is not handed to a local waiter out of turn (no hand-off for fair
    /// locks). Every user of a key must agree: a plain acquisition of a key does not look at
    /// its line. A fair lock is a writer: while readers hold the key, the first in line keeps
    /// new readers out as any writer does, so a stream of readers cannot starve the line.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dlock_runtime::LockError> {
    /// # let rt = dlock_runtime::Runtime::from_url("memory://").await?;
    /// use std::time::Duration;
    /// let guard = rt
    ///     .lock("printer")
    ///     .fair(true)
    ///     .wait(Duration::from_secs(5))
    ///     .acquire()
    ///     .await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// The key (of a multi-key lock: the first in canonical order).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Acquires the lock, waiting up to the `wait` budget by notification.
    ///
    /// Inside a call chain (an annotated call or [`with_lock`]) that already holds this key in
    /// the same runtime, re-enters: the hold count grows, the fence stays, nothing is sent to
    /// the engine, and the returned guard's release leaves the outer hold in place. The
    /// returned guard must not outlive the hold it re-entered (see [`LockGuard`]).
    ///
    /// Errors: [`LockError::Timeout`] when still busy at the deadline, [`LockError::Backend`]
    /// when the engine fails, [`LockError::InvalidConfig`] for an empty or too long key (see
    /// [`MAX_KEY_LEN`](crate::MAX_KEY_LEN)) or a bad lease, [`LockError::NotInstalled`]
    /// without a runtime, [`LockError::Lost`] when re-entering a hold whose lease is already
    /// lost.
    ///
    /// Cancel-safe: dropping the future while it waits or while the request is in flight
    /// leaves no lock behind (a compensating owner-checked release is sent).
    pub async fn acquire(self) -> Result<LockGuard, LockError> {
        let frame = current_frame();
        self.acquire_in(frame.as_ref(), None).await
    }

    /// Acquires from the call-chain frame `frame` (none: outside any chain). `scope` is the
    /// frame that a scoped acquisition (`with_lock`, the attribute) opens for its body: a
    /// re-entry makes it the hold's innermost user, so that concurrent branches take turns.
    ///
    /// Runs in the span `dlock.acquire` (fields `key`, `engine`, then `fence` and `waited_ms`
    /// once acquired), and reports the outcome of a fresh acquisition to the runtime's
    /// [`Observer`](crate::events::Observer); a re-entry is not an acquisition.
    pub(crate) async fn acquire_in(
        mut self,
        frame: Option<&Arc<Frame>>,
        scope: Option<u64>,
    ) -> Result<LockGuard, LockError> {
        let core = match self.rt.take() {
            Some(core) => core,
            None => crate::core::current()?,
        };
        if self.keys.is_some() {
            return Box::pin(crate::multi::acquire(self, &core, frame, scope)).await;
        }
        let span = tracing::info_span!(
            "dlock.acquire",
            key = %self.key,
            engine = core.engine,
            fence = tracing::field::Empty,
            waited_ms = tracing::field::Empty,
        );
        let started = Instant::now();
        // Pinned where it is made: wrapped by reference, the future (large) is not copied into
        // the span's wrapper.
        let acquiring = std::pin::pin!(self.acquire_from(&core, frame, scope, started));
        let outcome = acquiring.instrument(span.clone()).await;
        let observer = &core.observer;
        match &outcome {
            Ok(guard) if guard.is_first() => {
                if observer.timed() || !span.is_disabled() {
                    let waited = started.elapsed();
                    let fence = guard.fence();
                    if let Some(fence) = fence {
                        span.record("fence", fence);
                    }
                    span.record("waited_ms", waited.as_millis() as u64);
                    observer.acquired(guard.key(), fence, waited);
                }
            }
            Ok(_) => {}
            Err(LockError::Timeout { key, waited, .. }) => observer.timed_out(key, *waited),
            Err(_) => observer.failed(started.elapsed()),
        }
        outcome
    }

    /// [`acquire_in`](Self::acquire_in) in `core`, started at `started`.
    async fn acquire_from(
        self,
        core: &Arc<Core>,
        frame: Option<&Arc<Frame>>,
        scope: Option<u64>,
        started: Instant,
    ) -> Result<LockGuard, LockError> {
        let lease = self.checked_lease(core)?;
        let wait = self.wait.unwrap_or(core.default_wait);
        let deadline = started + wait.min(FOREVER);

        // The clock is read again only after a wait; a read costs as much as a good part of
        // an in-process acquisition.
        let mut now = started;
        if let Some(frame) = frame
            && let Some(held) = frame.find(core.id, &self.key)
        {
            check_reentry(held.terms.mode, self.mode, &self.key)?;
            if let Some(guard) = reenter(held, frame, scope, started, deadline).await? {
                return Ok(guard);
            }
            now = Instant::now();
        }
        let wait = deadline.saturating_duration_since(now);
        // The frame that uses the hold: the one a scoped acquisition opens, else the caller's.
        let user = scope.or(frame.map(|f| f.id)).unwrap_or(0);
        let terms = Terms {
            lease,
            renew: self.watchdog,
            frame: user,
            hold: self.hold_at_least,
            mode: self.mode,
            fair: self.fair,
            track_on_wait: self.track_on_wait,
        };
        let held = acquire_fresh(core, self.key, terms, now, wait).await?;
        // A scoped acquisition's frame is made around the hold by the caller.
        let frame = match scope {
            Some(_) => None,
            None => frame.cloned(),
        };
        if let Some(frame) = &frame {
            frame.push(held.clone());
        }
        Ok(LockGuard::first(held, frame))
    }
}

/// A lock on every key of `keys` at once, in the current runtime: all or nothing.
///
/// The keys are taken in a canonical order (sorted, duplicates merged), so two calls that name
/// the same keys in opposite orders never deadlock: both take the first key of the order
/// first. One `wait` budget covers the whole set; if a key is still busy at the deadline, the
/// keys already taken are released and the call returns [`LockError::Timeout`] naming that
/// key. On Redis (one server, or Cluster keys that share a hash slot) a first attempt takes
/// every key in one script, atomically, when they are all free; otherwise, and on the other
/// engines, the keys are taken one by one in canonical order (each a Redlock on Redlock).
///
/// The guard covers every key: [`LockGuard::release`], `Drop`, a panic or a cancellation
/// release them all; the watchdog renews each; the loss of any key's lease is the loss of the
/// guard ([`LockGuard::lost`], and `with_lock`/the attribute cancel the body).
/// [`LockGuard::fence`] is the first key's token (canonical order), [`LockGuard::fences`]
/// gives every key's.
///
/// Reentrancy: each key the current call chain already holds is re-entered (its hold count
/// grows, its fence stays), the others are acquired fresh, in canonical order. A chain that
/// holds one key and then asks for a set with a key ordered before it waits for that key while
/// holding the later one: take a set in one call rather than key by key to stay deadlock-free.
/// An empty set is [`LockError::InvalidConfig`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock_runtime::LockError> {
/// # let rt = dlock_runtime::Runtime::from_url("memory://").await?;
/// # rt.scope(async {
/// use std::time::Duration;
/// let both = dlock_runtime::lock_all(["acct:2", "acct:1"])
///     .wait(Duration::from_millis(500))
///     .acquire()
///     .await?;
/// assert_eq!(both.keys(), ["acct:1", "acct:2"]);
/// assert_eq!(both.fences().len(), 2);
/// // ... move money from one account to the other ...
/// both.release().await?;
/// # Ok::<(), dlock_runtime::LockError>(()) }).await?;
/// # Ok(()) }
/// ```
pub fn lock_all(keys: impl IntoIterator<Item = impl Into<String>>) -> LockBuilder {
    LockBuilder::all(None, keys)
}

impl LockBuilder {
    /// The lease, after the checks of key, lease and `hold_at_least` every acquisition makes
    /// before any I/O.
    pub(crate) fn checked_lease(&self, core: &Core) -> Result<Duration, LockError> {
        validate_key(&self.key)?;
        let lease = self.lease.unwrap_or(core.default_lease);
        validate_lease(lease, format_args!("lease of lock `{}`", self.key))?;
        core.backend.lease_margin(lease)?;
        validate_hold(self.hold_at_least, lease, &self.key)?;
        validate_mode(self.mode, self.hold_at_least, &self.key)?;
        core.backend.check_mode(&self.key, self.mode)?;
        if self.fair && self.mode.is_shared() {
            return Err(LockError::config(format!(
                "fair applies to exclusive locks: lock `{}` is a read lock or a semaphore \
                 permit (use fair(false))",
                self.key
            )));
        }
        if self.fair && core.backend.fairness() == Fairness::Unsupported {
            return Err(LockError::config(format!(
                "fair locks are not available on {}: its independent masters keep no common \
                 line of waiters (lock `{}`); use fair(false), or Redis, etcd or ZooKeeper",
                core.engine, self.key
            )));
        }
        Ok(lease)
    }
}

/// Checks a key before any I/O.
pub(crate) fn validate_key(key: &str) -> Result<(), LockError> {
    if key.is_empty() {
        return Err(LockError::config("lock key is empty"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(LockError::config(format!(
            "lock key of {} bytes is longer than the maximum of {MAX_KEY_LEN} bytes",
            key.len()
        )));
    }
    Ok(())
}

/// `hold_at_least` must not outlast the lease, the "at most" of a scheduled job.
fn validate_hold(hold: Duration, lease: Duration, key: &str) -> Result<(), LockError> {
    if hold > lease {
        return Err(LockError::config(format!(
            "hold_at_least of {hold:?} is longer than the lease of {lease:?} of lock `{key}`: \
             the lease is the longest the key stays taken"
        )));
    }
    Ok(())
}

/// A read lock or a semaphore permit: a positive number of permits, no `hold_at_least`.
fn validate_mode(mode: Mode, hold: Duration, key: &str) -> Result<(), LockError> {
    if mode == Mode::Permits(0) {
        return Err(LockError::config(format!(
            "semaphore `{key}` with 0 permits: nobody could ever hold it; ask for at least 1"
        )));
    }
    if mode.is_shared() && !hold.is_zero() {
        return Err(LockError::config(format!(
            "hold_at_least is for exclusive locks; `{key}` is asked as a {} lock",
            mode.name()
        )));
    }
    Ok(())
}

/// Whether a call chain holding `key` in `held` may re-enter it asking for `asked`: a read
/// inside a write or a read, a write inside a write, a permit inside a permit of the same
/// semaphore. A write inside a read would wait for itself: refused.
fn check_reentry(held: Mode, asked: Mode, key: &str) -> Result<(), LockError> {
    match (held, asked) {
        (Mode::Exclusive, Mode::Exclusive | Mode::Read) | (Mode::Read, Mode::Read) => Ok(()),
        (Mode::Permits(a), Mode::Permits(b)) if a == b => Ok(()),
        (Mode::Permits(held), Mode::Permits(asked)) => {
            Err(crate::backend::mode::permits_mismatch(key, asked, held))
        }
        (Mode::Read, Mode::Exclusive) => Err(LockError::config(format!(
            "cannot upgrade a read lock to a write lock: this call chain holds `{key}` for \
             reading; take the write lock first (a read inside a write re-enters it)"
        ))),
        (held, asked) => Err(LockError::config(format!(
            "this call chain holds `{key}` as a {} lock and asks for it as a {} lock",
            held.name(),
            asked.name()
        ))),
    }
}

/// The longest key a lock accepts, in bytes (UTF-8). Longer keys are
/// [`LockError::InvalidConfig`] before any request is sent: every engine stores the key (with
/// the runtime's prefix) in its own names, and a name this long is almost always a bug (a
/// whole request body interpolated into the key).
pub const MAX_KEY_LEN: usize = 1024;

/// Re-enters `held` from `frame`, taking turns with concurrent branches of the chain until
/// `deadline`. `None` when the hold ended meanwhile (acquire fresh).
async fn reenter(
    held: Arc<Held>,
    frame: &Frame,
    scope: Option<u64>,
    started: Instant,
    deadline: Instant,
) -> Result<Option<LockGuard>, LockError> {
    // Registered before the check that finds the hold busy, so no wake-up is missed.
    let mut turn = None;
    loop {
        match held.reenter(frame, scope) {
            Reentry::Entered => {
                let guard = LockGuard::reentrant(held.clone(), scope);
                if guard.is_lost() {
                    let key = guard.key().to_owned();
                    drop(guard);
                    return Err(LockError::Lost { key });
                }
                tracing::trace!(key = %guard.key(), "lock re-entered");
                return Ok(Some(guard));
            }
            Reentry::Ended => return Ok(None),
            Reentry::Busy => match turn.take() {
                None => turn = Some(held.turn()),
                Some(turn) => {
                    tracing::trace!(key = %held.key, "a concurrent branch of the call chain holds the lock; waiting for its turn");
                    if tokio::time::timeout_at(deadline, turn).await.is_err() {
                        return Err(LockError::Timeout {
                            key: held.key.clone(),
                            waited: started.elapsed(),
                        });
                    }
                }
            },
        }
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
/// Nested calls on the same key in the same chain re-enter. Concurrent branches of one body
/// (`join!`, `join_all`, `select!`) are not nested in each other: each takes the key in turn
/// (a branch that finds its caller holding the key waits until its sibling's call on that key
/// returns, within its `wait`), so two bodies under one key never run at once. Guards from
/// plain [`acquire`](LockBuilder::acquire) have no extent of their own: two branches of one
/// body that both `acquire()` a key their caller holds share that hold, so give each branch
/// its own `with_lock` (or annotated call) when they must exclude each other.
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
    protected(lock, fut).await
}

/// [`with_lock`]: acquires from the current frame, then runs `fut` in a frame of its own.
pub(crate) async fn protected<T>(
    lock: LockBuilder,
    fut: impl Future<Output = T>,
) -> Result<T, LockError> {
    let on_lost = lock.on_lost;
    let parent = current_frame();
    let scope = Frame::next_id();
    let multi = lock.multi().is_some();
    let lock = LockBuilder {
        // The body's first wait has the hold tracked (`LossCheck::lost_while_waiting`).
        track_on_wait: !multi && on_lost == OnLost::Cancel,
        ..lock
    };
    let guard = lock.acquire_in(parent.as_ref(), Some(scope)).await?;
    if multi {
        // Boxed: the body is stored once in this future (a nested body inside it, again),
        // not once per way of running it.
        return protected_all(guard, on_lost, parent, scope, Box::pin(fut)).await;
    }
    let first = guard.is_first();
    // The body runs in the span `dlock.held` (a sibling of `dlock.acquire`, which has ended).
    let held_span = tracing::info_span!(
        "dlock.held",
        key = %guard.key(),
        engine = guard.held().core.engine,
        fence = guard.fence(),
    );
    // A fresh hold's validity was checked on the clock when it was registered, in this same
    // poll: the body's first step needs no second reading. The body's first wait has the hold
    // tracked by the watchdog (`LossCheck::lost_while_waiting`).
    let check = (on_lost == OnLost::Cancel).then(|| LossCheck::new(first));
    let Ended { out, guard } =
        InChain::new(Scope::new(scope, parent, guard), held_span, check, fut).await;
    let Some(out) = out else {
        return Err(LockError::Lost {
            key: guard.key().to_owned(),
        });
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

/// [`protected`] for a multi-key lock: the body runs in a frame holding every key taken fresh,
/// and under [`OnLost::Cancel`] ends when any key's lease is lost.
async fn protected_all<T>(
    guard: LockGuard,
    on_lost: OnLost,
    parent: Option<Arc<Frame>>,
    scope: u64,
    fut: impl Future<Output = T>,
) -> Result<T, LockError> {
    let held_span = tracing::info_span!(
        "dlock.held",
        key = %guard.key(),
        engine = guard.held().core.engine,
        fence = guard.fence(),
    );
    // Every key's lease is checked by `run_unless_any_lost`, none by the body's layer; on a
    // loss the body is dropped with the guard its level kept.
    let holds: Vec<Arc<Held>> = guard.helds().cloned().collect();
    let body = InChain::new(Scope::new(scope, parent, guard), held_span, None, fut);
    let ended = match on_lost {
        OnLost::Cancel => crate::multi::run_unless_any_lost(&holds, body).await,
        OnLost::Ignore => Some(body.await),
    };
    let Some(Ended {
        out: Some(out),
        guard,
    }) = ended
    else {
        let lost = holds.iter().find(|h| h.is_lost()).or(holds.first());
        return Err(LockError::Lost {
            key: lost.map(|h| h.key.clone()).unwrap_or_default(),
        });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Runtime;

    const SEC: Duration = Duration::from_secs(1);

    async fn memory() -> Runtime {
        Runtime::from_url("memory://")
            .await
            .expect("memory runtime")
    }

    /// Whether another owner gets `key` now (and lets it go again).
    async fn free(rt: &Runtime, key: &str) -> bool {
        match rt.lock(key).acquire().await {
            Ok(guard) => {
                guard.release().await.expect("release");
                true
            }
            Err(err) => {
                assert!(err.is_timeout(), "{err}");
                false
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_short_hold_keeps_the_key_until_hold_at_least_after_acquisition() {
        let rt = memory().await;
        let guard = rt
            .lock("job")
            .lease(60 * SEC)
            .watchdog(false)
            .hold_at_least(10 * SEC)
            .acquire()
            .await
            .expect("acquire");
        tokio::time::advance(2 * SEC).await;
        guard.release().await.expect("release");
        assert!(!free(&rt, "job").await, "freed when the body ended");
        tokio::time::advance(7900 * Duration::from_millis(1)).await;
        assert!(!free(&rt, "job").await, "freed before the hold ended");
        tokio::time::advance(100 * Duration::from_millis(1)).await;
        assert!(free(&rt, "job").await, "still taken after the hold ended");
    }

    /// A protected body whose lease runs out unrenewed (no watchdog) takes no step after it,
    /// and its call fails `Lost`.
    #[tokio::test(start_paused = true)]
    async fn a_protected_body_takes_no_step_after_its_validity_ran_out() {
        let rt = memory().await;
        let steps = std::sync::atomic::AtomicU32::new(0);
        let out = with_lock(rt.lock("job").lease(SEC).watchdog(false), async {
            for _ in 0..10 {
                steps.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
        })
        .await;
        assert!(
            matches!(out, Err(LockError::Lost { ref key }) if key == "job"),
            "{out:?}"
        );
        // Steps at 0, 400 and 800 ms; none at 1200 ms.
        assert_eq!(steps.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    /// A body cancelled mid-way is dropped inside its level of the call chain, as it ran:
    /// what its destructors do still sees the body's hold.
    #[tokio::test]
    async fn a_cancelled_body_is_dropped_inside_its_level() {
        struct SeesFence(std::sync::Arc<std::sync::Mutex<Option<Option<u64>>>>);
        impl Drop for SeesFence {
            fn drop(&mut self) {
                *self.0.lock().expect("not poisoned") = Some(crate::current_fence());
            }
        }
        let rt = memory().await;
        let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
        let sees = SeesFence(seen.clone());
        let call = with_lock(rt.lock("job"), async move {
            let _sees = sees;
            std::future::pending::<()>().await;
        });
        let mut call = Box::pin(call);
        let polled = tokio::time::timeout(Duration::from_millis(20), call.as_mut()).await;
        assert!(polled.is_err(), "the body never ends");
        drop(call);
        let fence = seen.lock().expect("not poisoned").take();
        assert!(
            matches!(fence, Some(Some(_))),
            "dropped outside its level: {fence:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_guard_keeps_the_key_too() {
        let rt = memory().await;
        let guard = rt
            .lock("job")
            .hold_at_least(5 * SEC)
            .acquire()
            .await
            .expect("acquire");
        drop(guard);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!free(&rt, "job").await, "freed when the guard was dropped");
        tokio::time::sleep(5 * SEC).await;
        assert!(free(&rt, "job").await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_longer_than_hold_at_least_releases_at_once() {
        let rt = memory().await;
        let guard = rt
            .lock("job")
            .hold_at_least(SEC)
            .acquire()
            .await
            .expect("acquire");
        tokio::time::advance(2 * SEC).await;
        guard.release().await.expect("release");
        assert!(free(&rt, "job").await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_gets_the_key_when_the_hold_ends_not_before() {
        let rt = memory().await;
        let guard = rt
            .lock("job")
            .hold_at_least(3 * SEC)
            .acquire()
            .await
            .expect("acquire");
        let waiter = {
            let rt = rt.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let guard = rt.lock("job").wait(60 * SEC).acquire().await;
                (started.elapsed(), guard.map(drop))
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        guard.release().await.expect("release");
        let (waited, got) = waiter.await.expect("waiter task");
        got.expect("the waiter gets the key");
        assert!(
            waited >= Duration::from_millis(2900) && waited < 4 * SEC,
            "waited {waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn reentrant_holds_do_not_matter_the_outermost_does() {
        let rt = memory().await;
        rt.scope(with_lock(lock("job").hold_at_least(5 * SEC), async {
            // Inner hold without a hold_at_least, ended at once: nothing is released.
            with_lock(lock("job"), async {}).await.expect("re-enter");
        }))
        .await
        .expect("outer");
        assert!(
            !free(&rt, "job").await,
            "the outer hold_at_least was ignored"
        );
        tokio::time::sleep(5 * SEC).await;
        assert!(free(&rt, "job").await);
    }

    #[tokio::test]
    async fn hold_at_least_longer_than_the_lease_is_invalid_config() {
        let rt = memory().await;
        for watchdog in [false, true] {
            let err = rt
                .lock("job")
                .lease(10 * SEC)
                .watchdog(watchdog)
                .hold_at_least(11 * SEC)
                .acquire()
                .await
                .expect_err("hold_at_least > lease");
            assert!(err.is_invalid_config(), "{err}");
            assert!(err.to_string().contains("hold_at_least"), "{err}");
        }
        let equal = rt
            .lock("job")
            .lease(10 * SEC)
            .hold_at_least(10 * SEC)
            .acquire()
            .await
            .expect("hold_at_least == lease");
        drop(equal);
    }
}
