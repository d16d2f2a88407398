//! What engine calls answer, and what an engine can do ([`Capabilities`]): plain values the
//! runtime and every engine share.

use std::time::Duration;

use tokio::time::Instant;

/// The answer to one acquire attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The lock is ours; `fence` is the fencing token (`None` where the engine cannot give one).
    Acquired { fence: Option<u64> },
    /// Somebody else holds it; `ttl` is the holder's remaining lease when the engine knows it.
    Busy { ttl: Option<Duration> },
}

/// The answer to one attempt at several keys at once ([`Backend::try_acquire_all`](super::Backend::try_acquire_all)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    not(feature = "redis"),
    allow(
        dead_code,
        reason = "made by the Redis engine, which takes several keys in one script"
    )
)]
pub(crate) enum AttemptAll {
    /// Every key is ours; one fence per key, in the order asked.
    Acquired { fences: Vec<Option<u64>> },
    /// The key at `index` is held by somebody else (`ttl`: its holder's remaining lease when
    /// known); none of the keys was taken.
    Busy { index: usize, ttl: Option<Duration> },
}

/// How an engine orders the waiters of one key ([`Capabilities::fairness`]), which decides what a
/// fair lock (`fair(true)`) does there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fairness {
    /// Waiters are served in arrival order already (memory: the runtime's local FIFO queue;
    /// etcd and ZooKeeper: their own queues): a fair lock is an ordinary one.
    Native,
    /// The engine keeps a queue of waiters for fair locks on request:
    /// [`Backend::try_acquire_fair`](super::Backend::try_acquire_fair) (Redis, Redis Cluster).
    Queue,
    /// The engine cannot order waiters (Redlock: independent masters): a fair lock is
    /// [`LockError::InvalidConfig`](crate::LockError::InvalidConfig).
    Unsupported,
}

/// What an engine can do and its limits, as one value ([`Backend::capabilities`](super::Backend::capabilities)) read once
/// at connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Capabilities {
    /// Waiters queue in the engine's own FIFO queue (etcd, ZooKeeper) through
    /// [`Backend::acquire_queued`](super::Backend::acquire_queued), instead of the runtime's local queue and notifications.
    pub(crate) queue: bool,
    /// How the engine orders waiters, for fair locks.
    pub(crate) fairness: Fairness,
    /// How many consecutive fencing tokens one acquisition reserves, from the one it answers
    /// (`Attempt::Acquired::fence`) up. Above 1, the runtime may hand a held lock to another
    /// waiter of its own, with the next token, without a round trip (see `handoff.rs`).
    pub(crate) fence_block: u64,
    /// The most renewals one [`Backend::renew`](super::Backend::renew) call carries.
    pub(crate) renew_batch_limit: usize,
    /// Read locks and semaphore permits (not on Redlock: a quorum of independent nodes
    /// cannot agree on a set of holders without fencing).
    pub(crate) shared_modes: bool,
}

impl Capabilities {
    /// An engine that waits through the runtime, in arrival order, with one token an
    /// acquisition, renewals in batches of 512, and every mode.
    pub(crate) const DEFAULT: Self = Self {
        queue: false,
        fairness: Fairness::Native,
        fence_block: 1,
        renew_batch_limit: 512,
        shared_modes: true,
    };
}

/// What a queued acquisition ([`Backend::acquire_queued`](super::Backend::acquire_queued)) asks for, besides key and owner.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(
    not(feature = "etcd"),
    allow(dead_code, reason = "read by the engines with a queue of their own")
)]
pub(crate) struct Queueing {
    /// The lock's lease.
    pub(crate) lease: Duration,
    /// Whether the watchdog renews the lease while held (else the lease is a hard cap).
    pub(crate) renew: bool,
    /// Until when to wait in the queue.
    pub(crate) deadline: Instant,
}

/// The answer of a queued acquisition.
#[derive(Debug)]
pub(crate) struct Queued {
    pub(crate) attempt: Attempt,
    /// When the engine's hold was last confirmed for a whole lease (sent): the lock counts as
    /// valid until then plus the counted part of the lease. `None`: the engine kept the hold
    /// alive every third of the lease since the request started, so the runtime counts from
    /// the later of that start and a third of the lease ago.
    pub(crate) confirmed: Option<Instant>,
}

#[cfg_attr(
    not(queued_engines),
    allow(dead_code, reason = "made by the engines with a queue of their own")
)]
impl Queued {
    /// An answer counted by the runtime's rule (see [`Queued::confirmed`]).
    pub(crate) fn kept_alive(attempt: Attempt) -> Self {
        Self {
            attempt,
            confirmed: None,
        }
    }
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
    /// The hold ended, but the key stays ours until it expires by itself
    /// ([`Backend::release_after`](super::Backend::release_after)).
    Kept,
}

/// What [`Backend::release_or_extend`](super::Backend::release_or_extend) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) enum Extension {
    /// Still the owner's, its lease renewed, with a new block of fencing tokens ending at
    /// `last` (see [`Capabilities::fence_block`]).
    Extended { last: u64 },
    /// Released instead, as [`Backend::release`](super::Backend::release) answers.
    Released(Released),
}
