//! Engines behind one trait.
//!
//! A backend does one attempt per call and never sleeps: try-acquire, renew, release, and
//! "tell the runtime when this key may be free". Deadlines, retries, renewal timing,
//! reentrancy and cleanup belong to the runtime (deadpool's split between manager and pool).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::LockError;

#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod memory;
#[cfg(feature = "redis")]
pub(crate) mod redis;
#[cfg(feature = "redis")]
pub(crate) mod redlock;
#[cfg(feature = "zookeeper")]
pub(crate) mod zookeeper;

/// A boxed, `Send` future borrowed from the backend: the runtime erases the type once here so
/// that a `Runtime` can be stored in a global.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The answer to one acquire attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The lock is ours; `fence` is the fencing token (`None` where the engine cannot give one).
    Acquired { fence: Option<u64> },
    /// Somebody else holds it; `ttl` is the holder's remaining lease when the engine knows it.
    Busy { ttl: Option<Duration> },
}

/// One lock to renew in a batch.
#[derive(Debug, Clone)]
pub(crate) struct Renewal {
    pub(crate) key: String,
    pub(crate) owner: String,
    pub(crate) lease: Duration,
}

/// The answer to a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// The hold count reached zero: the key is free and waiters were told.
    Freed,
    /// We are still the owner with a positive hold count.
    StillHeld,
    /// The key is not ours (expired, deleted, or taken by someone else).
    NotOwner,
}

/// One engine.
pub(crate) trait Backend: Send + Sync + 'static {
    /// One acquire attempt for `owner`, writing `lease` as the TTL.
    fn try_acquire<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Attempt, LockError>>;

    /// Renews every lock in `batch` (owner-checked); one answer per item: `Some(true)`
    /// renewed, `Some(false)` no longer ours (lost), `None` not determined this time (retried,
    /// not a loss).
    fn renew<'a>(
        &'a self,
        batch: &'a [Renewal],
    ) -> BoxFuture<'a, Result<Vec<Option<bool>>, LockError>>;

    /// Engines with their own FIFO queue (etcd, ZooKeeper) wait there: one call that returns
    /// `Acquired` when first in line, or `Busy` at `deadline` (having left the queue). `None`:
    /// the runtime waits itself (local queue, notifications, retries of `try_acquire`).
    fn acquire_queued<'a>(
        &'a self,
        _key: &'a str,
        _owner: &'a str,
        _lease: Duration,
        _deadline: tokio::time::Instant,
    ) -> Option<BoxFuture<'a, Result<Attempt, LockError>>> {
        None
    }

    /// Owner-checked release of one hold.
    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<Released, LockError>>;

    /// Deletes the lock whoever holds it; `true` when there was one.
    fn force_unlock<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>>;

    /// Whether anybody holds the key now.
    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>>;

    /// Starts delivering "may be free" notifications for `key` to the runtime's wait hub.
    /// Resolves once notifications flow (a release after this point is not missed).
    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), LockError>>;

    /// Stops the notifications started by [`Backend::watch`].
    fn unwatch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), LockError>>;

    /// Rejects a lease the engine cannot honour (e.g. shorter than Redlock's allowances).
    fn check_lease(&self, _lease: Duration) -> Result<(), LockError> {
        Ok(())
    }

    /// How much of a lease the runtime must not count on, for clock drift between the engine's
    /// nodes and this process: the lock is valid until `sent + lease - clock_drift(lease)`.
    fn clock_drift(&self, _lease: Duration) -> Duration {
        Duration::ZERO
    }

    /// Renewals of keys with different partitions never share a call (Cluster: the hash slot,
    /// since one script's keys must share one); each call succeeds or fails on its own.
    fn renew_partition(&self, _key: &str) -> u16 {
        0
    }

    /// Renewal batch size the engine handles in one call.
    fn renew_batch_limit(&self) -> usize {
        512
    }
}
