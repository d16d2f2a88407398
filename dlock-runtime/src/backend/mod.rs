//! Engines behind one trait.
//!
//! A backend does one attempt per call and never sleeps: try-acquire, renew, release, and
//! "tell the runtime when this key may be free". Deadlines, retries, renewal timing,
//! reentrancy and cleanup belong to the runtime (deadpool's split between manager and pool).
//!
//! Engines implement [`Backend`] with plain `async fn`s (static types, no boxing inside an
//! engine); the runtime erases the type once, through [`DynBackend`] (generated from the trait
//! by `dynosaur`), so that a `Runtime` can be stored in a global. What an engine can do is one
//! value, [`Capabilities`], read at connect. Each engine folder also owns its configuration
//! ([`EngineConfig`]): URL scheme, options, validation and messages.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::error::LockError;
use crate::inspect::LockInfo;

#[cfg(feature = "etcd")]
pub(crate) mod etcd;
#[cfg(queued_engines)]
pub(crate) mod io_thread;
pub(crate) mod memory;
pub(crate) mod mode;
#[cfg(feature = "redis")]
pub(crate) mod redis;
#[cfg(feature = "redis")]
pub(crate) mod redlock;
#[cfg(queued_engines)]
pub(crate) mod successor;
pub(crate) mod url;
#[cfg(feature = "zookeeper")]
pub(crate) mod zookeeper;

mod answers;
pub(crate) use self::answers::{
    Attempt, AttemptAll, Capabilities, Extension, Fairness, Queued, Queueing, Released, Renewal,
};

/// What an engine call answers.
pub(crate) type EngineResult<T> = Result<T, LockError>;

/// An engine connecting: the erased backend, or why not.
pub(crate) type Connecting = BoxFuture<'static, EngineResult<Arc<AnyBackend>>>;

/// A boxed, `Send` future borrowed from the backend.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The engine a runtime holds, its type erased.
pub(crate) type AnyBackend = DynBackend<'static>;

/// Where an engine delivers "this key may be free now" (the runtime's wait hub). Engines that
/// notify (Redis pub/sub) call it from their connection's push handler.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) trait Wakeups: Send + Sync + 'static {
    /// `key` may be free: wake its local head waiter.
    fn wake(&self, key: &str);
    /// Notifications may have been missed (a reconnect): every local waiter looks again.
    fn wake_all(&self);
}

/// What the runtime hands an engine when it connects.
#[derive(Clone)]
#[cfg_attr(not(server_engines), allow(dead_code))]
pub(crate) struct Context {
    /// Prefix of every engine key (`"dlock:"`).
    pub(crate) prefix: String,
    /// This runtime's random id: names its own release messages.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) origin: String,
    /// Bound on connecting and on each engine call.
    pub(crate) timeout: Duration,
    /// Where release notifications go.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) wakeups: Arc<dyn Wakeups>,
}

/// One option value: text from a URL query, or a typed value from the builder.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Setting<'a> {
    Text(&'a str),
    Duration(Duration),
    /// A fraction (`0.5`).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    Fraction(f64),
    /// A whole number (a node count).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    Count(u32),
}

impl Setting<'_> {
    /// The value as a duration (`250ms`, `30s`, `2m`, `1h` when text).
    pub(crate) fn duration(self, name: &str) -> Result<Duration, LockError> {
        match self {
            Self::Duration(d) => Ok(d),
            Self::Text(text) => crate::duration::parse(text).ok_or_else(|| {
                LockError::config(format!(
                    "invalid duration `{text}` for `{name}`: expected e.g. 250ms, 30s, 2m, 1h"
                ))
            }),
            Self::Fraction(_) | Self::Count(_) => Err(LockError::config(format!(
                "`{name}` takes a duration, e.g. 250ms, 30s, 2m, 1h"
            ))),
        }
    }

    /// The value as a whole number (decimal digits when text).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn count(self, name: &str) -> Result<u32, LockError> {
        match self {
            Self::Count(n) => Ok(n),
            Self::Text(text) => text.parse().map_err(|_| {
                LockError::config(format!(
                    "invalid number `{text}` for `{name}`: expected a whole number, e.g. {name}=3"
                ))
            }),
            Self::Duration(_) | Self::Fraction(_) => Err(LockError::config(format!(
                "`{name}` takes a whole number, e.g. {name}=3"
            ))),
        }
    }

    /// A duration option that must be positive.
    #[cfg_attr(not(any(feature = "redis", feature = "zookeeper")), allow(dead_code))]
    pub(crate) fn positive_duration(self, name: &str) -> Result<Duration, LockError> {
        let d = self.duration(name)?;
        if d.is_zero() {
            return Err(LockError::config(format!(
                "{name} must be greater than zero"
            )));
        }
        Ok(d)
    }
}

/// An engine's settings before it connects: made from a URL or by the builder, then given the
/// options addressed to the engine. `Debug` never shows a secret.
pub(crate) trait EngineConfig: CloneConfig + fmt::Debug + Send + Sync + 'static {
    /// The engine's name (`"redis"`, `"etcd"`, ...), as [`crate::Runtime::engine`] reports it.
    fn name(&self) -> &'static str;

    /// Applies one engine option; `Ok(false)` when the engine has no option of that name.
    fn set(&mut self, _name: &str, _value: Setting<'_>) -> Result<bool, LockError> {
        Ok(false)
    }

    /// The engine's option names, for error messages.
    fn options(&self) -> &'static [&'static str] {
        &[]
    }

    /// Whether the engine lives in this process: its backend works from any tokio runtime,
    /// and a new connection would not see its locks.
    fn in_process(&self) -> bool {
        false
    }

    /// Connects (bounded by `ctx.timeout`).
    fn connect(self: Box<Self>, ctx: Context) -> Connecting;
}

/// A boxed copy of a configuration (the builder is `Clone`).
pub(crate) trait CloneConfig {
    fn clone_box(&self) -> Box<dyn EngineConfig>;
}

impl<C: EngineConfig + Clone> CloneConfig for C {
    fn clone_box(&self) -> Box<dyn EngineConfig> {
        Box::new(self.clone())
    }
}

/// One engine: single attempts, no sleeping, no policy. Its type-erased form
/// ([`DynBackend`], boxed futures) is generated from this one definition.
#[dynosaur::dynosaur(pub(crate) DynBackend = dyn(box) Backend)]
pub(crate) trait Backend: Send + Sync {
    /// One acquire attempt for `owner`, writing `lease` as the TTL.
    fn try_acquire(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<Attempt, LockError>> + Send;

    /// An attempt by a waiter that contends for `key` (the head of its process's local queue):
    /// as [`Backend::try_acquire`], and when the key is busy the engine is also asked to
    /// notify this waiter of its release (Redis flags the holder's lock, whose release then
    /// publishes; without a waiter outside its process, a release publishes nothing).
    fn try_acquire_waiting(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<Attempt, LockError>> + Send {
        self.try_acquire(key, owner, lease)
    }

    /// The last waiter of this runtime for `key` stopped waiting without the lock (it gave
    /// up): the engine forgets this runtime's place in the line of processes waiting for the
    /// key (Redis: the turns of `lua/acquire.lua`), so that no release reserves the key for a
    /// process nobody waits in; after a cancelled wait, in the background. Best effort: a place
    /// left behind (an error, a process that died) costs the next release a short reservation
    /// for nobody.
    fn leave_line(&self, _key: &str) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Renews every lock in `batch` (owner-checked); one answer per item: `Some(true)`
    /// renewed, `Some(false)` no longer ours (lost), `None` not determined this time (retried,
    /// not a loss).
    fn renew(
        &self,
        batch: &[Renewal],
    ) -> impl Future<Output = Result<Vec<Option<bool>>, LockError>> + Send;

    /// Owner-checked release of one hold.
    fn release(
        &self,
        key: &str,
        owner: &str,
    ) -> impl Future<Output = Result<Released, LockError>> + Send;

    /// The end of a hold whose block of fencing tokens is used up while a waiter of this
    /// runtime wants the key next: an engine that reserves blocks may keep the hold for it (a
    /// new block, the lease renewed) when no other runtime waits; otherwise, and by default,
    /// a release.
    fn release_or_extend(
        &self,
        key: &str,
        owner: &str,
        _lease: Duration,
    ) -> impl Future<Output = Result<Extension, LockError>> + Send {
        async move { self.release(key, owner).await.map(Extension::Released) }
    }

    /// Owner-checked end of a hold whose key must stay taken `hold` longer (`hold_at_least`):
    /// the key stays `owner`'s, no longer renewed, and frees by itself after `hold` (never
    /// sooner). `Kept`, or `NotOwner` when the key is no longer ours. Other runtimes' waiters
    /// may be told to look again (they find the key taken, with the hold's remaining TTL).
    fn release_after(
        &self,
        key: &str,
        owner: &str,
        hold: Duration,
    ) -> impl Future<Output = Result<Released, LockError>> + Send;

    /// Deletes the lock whoever holds it; `true` when there was one.
    fn force_unlock(&self, key: &str) -> impl Future<Output = Result<bool, LockError>> + Send;

    /// Whether anybody holds the key now.
    fn is_locked(&self, key: &str) -> impl Future<Output = Result<bool, LockError>> + Send;

    /// The holder of `key` now, read from the engine's layout (`<engine>/inspect.rs`), or
    /// `None` when nobody holds it (a waiter in a queue, a Redis reservation, or a value the
    /// runtime did not write is not a holder).
    fn inspect(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<LockInfo>, LockError>> + Send;

    /// Every lock held now whose key starts with `prefix`, in any order (the runtime sorts
    /// them); as [`Backend::inspect`] for each.
    fn list(&self, prefix: &str) -> impl Future<Output = Result<Vec<LockInfo>, LockError>> + Send;

    /// The holder's remaining lease, for an attempt that found `key` busy without saying how
    /// long (Redis answers a first attempt with the holder's value only). `None` when the
    /// engine cannot tell (default) or nobody holds it.
    fn holder_ttl(&self, _key: &str) -> impl Future<Output = Option<Duration>> + Send {
        async { None }
    }

    /// Starts delivering "may be free" notifications for `key` to [`Context::wakeups`].
    /// Resolves once notifications flow (a release after this point is not missed). Engines
    /// without notifications (in-process, or queued) have nothing to do.
    fn watch(&self, _key: &str) -> impl Future<Output = Result<(), LockError>> + Send {
        async { Ok(()) }
    }

    /// Stops the notifications started by [`Backend::watch`].
    fn unwatch(&self, _key: &str) -> impl Future<Output = Result<(), LockError>> + Send {
        async { Ok(()) }
    }

    /// Queues for `key` in the engine: `Acquired` when first in line, or `Busy` at `deadline`
    /// (having left the queue). Called only when [`Capabilities::queue`].
    fn acquire_queued(
        &self,
        key: &str,
        _owner: &str,
        _ask: Queueing,
    ) -> impl Future<Output = Result<Queued, LockError>> + Send {
        let err = LockError::backend(Some(key), "this engine has no queue", None);
        async move { Err(err) }
    }

    /// How much of `lease` the runtime must not count on (clock drift between the engine's
    /// nodes and this process: the lock is valid until `sent + lease - margin`), or why the
    /// engine cannot honour such a lease.
    fn lease_margin(&self, _lease: Duration) -> Result<Duration, LockError> {
        Ok(Duration::ZERO)
    }

    /// Whether [`Backend::try_acquire_all`] can take `keys` in one atomic step (Redis: one
    /// server, or one Cluster hash slot). Default: no; the runtime then takes them one by one.
    fn acquires_all_at_once(&self, _keys: &[String]) -> bool {
        false
    }

    /// One attempt at every key of `keys` for `owner`, atomically: all taken, or none (called
    /// only when [`Backend::acquires_all_at_once`] said yes for these keys).
    fn try_acquire_all(
        &self,
        keys: &[String],
        _owner: &str,
        _lease: Duration,
    ) -> impl Future<Output = Result<AttemptAll, LockError>> + Send {
        let err = LockError::backend(
            keys.first().map(String::as_str),
            "this engine cannot take several keys at once",
            None,
        );
        async move { Err(err) }
    }

    /// A fair lock's attempt (called only when [`Capabilities::fairness`] is
    /// [`Fairness::Queue`]): acquires only when `owner` is first in the key's queue of
    /// waiters (or the queue is empty); else joins the queue, or refreshes its place there,
    /// which lasts `place` past this call (a zero `place`: a try that does not join), and
    /// answers `Busy` with how long to wait before the next attempt (the holder's remaining
    /// lease, or when a waiter ahead loses its place).
    fn try_acquire_fair(
        &self,
        key: &str,
        _owner: &str,
        _lease: Duration,
        _place: Duration,
    ) -> impl Future<Output = Result<Attempt, LockError>> + Send {
        let err = LockError::backend(Some(key), "this engine has no queue for fair locks", None);
        async move { Err(err) }
    }

    /// Takes `owner` out of the fair queue of `key` (a waiter that gave up), waking the next
    /// one if that frees the head of the line.
    fn leave_fair_queue(
        &self,
        _key: &str,
        _owner: &str,
    ) -> impl Future<Output = Result<(), LockError>> + Send {
        async { Ok(()) }
    }

    /// Renewals of keys with different partitions never share a call (Cluster: the hash slot,
    /// since one script's keys must share one); each call succeeds or fails on its own.
    fn renew_partition(&self, _key: &str) -> u16 {
        0
    }

    /// What the engine can do and its limits, read once when the runtime connects.
    fn capabilities(&self) -> Capabilities {
        Capabilities::DEFAULT
    }
}
