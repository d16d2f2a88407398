//! What a lock asks for: the key (or keys) and the options of one acquisition, set before it
//! is made; nothing here talks to an engine.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::mode::Mode;
use crate::core::Core;

/// What to do when the lease is lost while the protected code runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnLost {
    /// Drop the protected future and return [`LockError::Lost`](crate::LockError::Lost) (default): the code never
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
/// | [`on_lost`](LockBuilder::on_lost) | [`OnLost::Cancel`] | policy of [`with_lock`](crate::with_lock) when the lease is lost |
/// | [`hold_at_least`](LockBuilder::hold_at_least) | zero | the key stays taken at least this long after acquisition |
/// | [`read`](LockBuilder::read) | write | a read lock: shared with other readers, excluded by a writer |
/// | [`fair`](LockBuilder::fair) | `false` | waiters are served in the order they arrived, across processes |
///
/// [`Runtime::semaphore`](crate::Runtime::semaphore) makes a builder for one permit of a
/// semaphore instead. Made by [`lock_all`] or [`Runtime::lock_all`](crate::Runtime::lock_all), it takes several
/// keys, all or nothing (see [`lock_all`]).
#[must_use = "a lock builder does nothing until `.acquire().await` or `with_lock`"]
pub struct LockBuilder {
    pub(crate) rt: Option<Arc<Core>>,
    pub(crate) key: String,
    pub(crate) lease: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) watchdog: bool,
    pub(crate) on_lost: OnLost,
    pub(crate) hold_at_least: Duration,
    pub(crate) mode: Mode,
    pub(crate) fair: bool,
    /// Made by `lock_all`: every key in canonical order (sorted, without duplicates); `key` is
    /// the first. `None` for a one-key lock.
    pub(crate) keys: Option<Vec<String>>,
    /// A fresh hold is tracked by the watchdog only once the body it protects first waits:
    /// set by `protect::protected` for a one-key body it runs under [`OnLost::Cancel`].
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
    /// [`LockError::InvalidConfig`](crate::LockError::InvalidConfig) ("cannot upgrade a read lock to a write lock"), never a
    /// deadlock. Every reader gets its own fencing token, greater than every earlier holder's.
    /// Not on Redlock ([`LockError::InvalidConfig`](crate::LockError::InvalidConfig) at acquire), and not with
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
        let keys = canonical(keys);
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

    /// Policy of [`with_lock`](crate::with_lock) (and the attribute) when the lease is lost.
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
    /// by itself when the hold ends. Other holders get [`LockError::Timeout`](crate::LockError::Timeout) meanwhile
    /// (waiters get it when the hold ends, within their `wait`). A hold that lasts longer is
    /// released as usual. Counted from when the engine's answer arrived, so the key is never
    /// kept for less than asked (at most a round trip more; etcd rounds up to whole seconds).
    /// Reentrant acquisitions do not matter, the outermost does. With ZooKeeper, whose nodes
    /// live with the session, the node is deleted by a task of the runtime at the end of the
    /// hold: a process that exits meanwhile frees the key early.
    ///
    /// Must not be longer than the [`lease`](LockBuilder::lease) (the "at most", with
    /// `watchdog(false)`), whether the watchdog is on or not: [`LockError::InvalidConfig`](crate::LockError::InvalidConfig) at
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
    /// | Redlock | [`LockError::InvalidConfig`](crate::LockError::InvalidConfig) at [`acquire`](LockBuilder::acquire): independent masters keep no common queue |
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
}

/// A lock on every key of `keys` at once, in the current runtime: all or nothing.
///
/// The keys are taken in a canonical order (sorted, duplicates merged), so two calls that name
/// the same keys in opposite orders never deadlock: both take the first key of the order
/// first. One `wait` budget covers the whole set; if a key is still busy at the deadline, the
/// keys already taken are released and the call returns [`LockError::Timeout`](crate::LockError::Timeout) naming that
/// key. On Redis (one server, or Cluster keys that share a hash slot) a first attempt takes
/// every key in one script, atomically, when they are all free; otherwise, and on the other
/// engines, the keys are taken one by one in canonical order (each a Redlock on Redlock).
///
/// The guard covers every key: [`LockGuard::release`](crate::LockGuard::release), `Drop`, a panic or a cancellation
/// release them all; the watchdog renews each; the loss of any key's lease is the loss of the
/// guard ([`LockGuard::lost`](crate::LockGuard::lost), and `with_lock`/the attribute cancel the body).
/// [`LockGuard::fence`](crate::LockGuard::fence) is the first key's token (canonical order), [`LockGuard::fences`](crate::LockGuard::fences)
/// gives every key's.
///
/// Reentrancy: each key the current call chain already holds is re-entered (its hold count
/// grows, its fence stays), the others are acquired fresh, in canonical order. A chain that
/// holds one key and then asks for a set with a key ordered before it waits for that key while
/// holding the later one: take a set in one call rather than key by key to stay deadlock-free.
/// An empty set is [`LockError::InvalidConfig`](crate::LockError::InvalidConfig).
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

/// The canonical order of a key set: sorted (bytewise), duplicates merged.
pub(crate) fn canonical(keys: impl IntoIterator<Item = impl Into<String>>) -> Vec<String> {
    let mut keys: Vec<String> = keys.into_iter().map(Into::into).collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

#[cfg(test)]
mod tests {
    use super::canonical;

    #[test]
    fn canonical_order_is_sorted_without_duplicates() {
        assert_eq!(
            canonical(["b", "a", "c", "a", "b"]),
            ["a", "b", "c"].map(String::from)
        );
        assert!(canonical(Vec::<String>::new()).is_empty());
    }
}
