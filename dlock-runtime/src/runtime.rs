//! The runtime: configured once at startup, installed process-wide, overridable per task.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use tokio::runtime::Handle;

use crate::backend::{Backend, Context};
use crate::baton::Baton;
use crate::builder::RuntimeBuilder;
use crate::core::{Core, validate_lease};
use crate::error::LockError;
use crate::events::{LockEvent, Observer};
use crate::inspect::LockInfo;
use crate::lock::{LockBuilder, MAX_KEY_LEN};
use crate::release::{LastResort, Releaser};
use crate::wait::WaitHub;
use crate::watchdog::Watchdog;

/// A configured lock engine plus the policy around it: waiting, renewal, reentrancy, cleanup.
///
/// Cheap to clone (one `Arc`). Build one at startup and [`install`](Runtime::install) it, or
/// pass it explicitly with [`Runtime::lock`], or override the global for one task tree with
/// [`Runtime::scope`].
///
/// The runtime's background work (renewals, subscriptions, releases scheduled from `Drop`)
/// runs on the tokio runtime that called [`RuntimeBuilder::build`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock_runtime::LockError> {
/// use std::time::Duration;
/// use dlock_runtime::Runtime;
///
/// let rt = Runtime::builder()
///     .memory()                       // or .redis("redis://127.0.0.1:6379")
///     .key_prefix("shop:")
///     .default_lease(Duration::from_secs(10))
///     .build()
///     .await?;
/// let guard = rt.lock("stock:42").acquire().await?;
/// assert!(guard.fence().is_some());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Runtime {
    pub(crate) core: Arc<Core>,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("engine", &self.core.engine)
            .field("key_prefix", &self.core.prefix)
            .field("default_lease", &self.core.default_lease)
            .field("default_wait", &self.core.default_wait)
            .field("held", &self.core.watchdog.len())
            .finish()
    }
}

impl Runtime {
    /// Starts configuring a runtime.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    /// Builds a runtime from a URL:
    ///
    /// | URL | engine |
    /// |---|---|
    /// | `redis://host:port[/db]`, `rediss://…` (feature `tls`) | one Redis server |
    /// | `memory://` | in-process (embedded default) |
    ///
    /// Query parameters set runtime options: `prefix=…`, `lease=30s`, `wait=1s`,
    /// `timeout=3s` (durations as `250ms`, `30s`, `2m`, `1h`). Other parameters go to the
    /// engine's client (for Redis, e.g. `protocol`, `db`). An unknown scheme or a malformed
    /// option is [`LockError::InvalidConfig`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dlock_runtime::LockError> {
    /// let rt = dlock_runtime::Runtime::from_url("memory://?prefix=app:&lease=10s").await?;
    /// assert_eq!(rt.key_prefix(), "app:");
    /// assert!(dlock_runtime::Runtime::from_url("http://localhost").await.unwrap_err().is_invalid_config());
    /// # Ok(()) }
    /// ```
    pub async fn from_url(url: &str) -> Result<Runtime, LockError> {
        RuntimeBuilder::default().url(url)?.build().await
    }

    /// Builds a runtime from the `DLOCK_URL` environment variable; when it is unset, the
    /// in-process `memory://` engine, with one warning log line (locks then exclude only
    /// within this process).
    pub async fn from_env() -> Result<Runtime, LockError> {
        match std::env::var("DLOCK_URL") {
            Ok(url) if !url.trim().is_empty() => Self::from_url(url.trim()).await,
            _ => {
                tracing::warn!(
                    "DLOCK_URL is not set: using the in-process memory:// lock engine; locks exclude only within this process"
                );
                Self::from_url("memory://").await
            }
        }
    }

    /// Installs this runtime as the process-wide default used by [`lock`](crate::lock), the
    /// attribute and [`with_lock`](crate::with_lock). A second call returns
    /// [`LockError::AlreadyInstalled`].
    pub fn install(self) -> Result<(), LockError> {
        crate::core::install(self.core)
    }

    /// The runtime in effect here: the innermost [`scope`](Runtime::scope), else the installed
    /// one, else [`LockError::NotInstalled`].
    pub fn current() -> Result<Runtime, LockError> {
        crate::core::current().map(|core| Runtime { core })
    }

    /// Runs `fut` with this runtime as the current one (a task-local override of the installed
    /// runtime: tests, multi-tenant services). Tasks spawned inside do not inherit it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dlock_runtime::LockError> {
    /// let rt = dlock_runtime::Runtime::from_url("memory://").await?;
    /// rt.scope(async {
    ///     let guard = dlock_runtime::lock("job:nightly").acquire().await?;
    ///     guard.release().await
    /// }).await?;
    /// # Ok(()) }
    /// ```
    pub async fn scope<F: Future>(&self, fut: F) -> F::Output {
        crate::core::scope(self.core.clone(), fut).await
    }

    /// A lock on `key` in this runtime (see [`LockBuilder`]).
    pub fn lock(&self, key: impl Into<String>) -> LockBuilder {
        LockBuilder::new(Some(self.core.clone()), key.into())
    }

    /// One permit of the semaphore `key` of `permits`: at most `permits` holders at once,
    /// across every process, each with its own lease renewed by the watchdog (so a crashed
    /// holder's permit frees within its lease) and its own fencing token. The guard is a
    /// [`LockGuard`](crate::LockGuard) like a lock's; `permits = 1` behaves like a lock.
    ///
    /// Every holder of one semaphore must ask for the same `permits`: asking for another
    /// number while it has holders is [`LockError::InvalidConfig`] naming both. Zero permits
    /// is `InvalidConfig` too. A chain holding a permit re-enters it. Not on Redlock
    /// (`InvalidConfig` at acquire). A semaphore key is not a lock key: do not use one key
    /// for both.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dlock_runtime::LockError> {
    /// # let rt = dlock_runtime::Runtime::from_url("memory://").await?;
    /// let a = rt.semaphore("api:quota", 2).acquire().await?;
    /// let b = rt.semaphore("api:quota", 2).acquire().await?;
    /// // Both permits are taken:
    /// assert!(rt.semaphore("api:quota", 2).acquire().await.unwrap_err().is_timeout());
    /// a.release().await?;
    /// let c = rt.semaphore("api:quota", 2).acquire().await?;
    /// # b.release().await?; c.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self, key: impl Into<String>, permits: u32) -> LockBuilder {
        LockBuilder::permit(Some(self.core.clone()), key.into(), permits)
    }

    /// A lock on every key of `keys` in this runtime, all or nothing, deadlock-free (see
    /// [`lock_all`](crate::lock_all)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dlock_runtime::LockError> {
    /// let rt = dlock_runtime::Runtime::from_url("memory://").await?;
    /// let transfer = rt.lock_all(["acct:1", "acct:2"]).acquire().await?;
    /// // Opposite order, same set: the same lock, busy.
    /// assert!(rt.lock_all(["acct:2", "acct:1"]).acquire().await.unwrap_err().is_timeout());
    /// transfer.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn lock_all(&self, keys: impl IntoIterator<Item = impl Into<String>>) -> LockBuilder {
        LockBuilder::all(Some(self.core.clone()), keys)
    }

    /// Deletes the lock on `key` whoever holds it and wakes its waiters; `true` when it was
    /// held. A read lock or a semaphore loses every holder at once (all its readers, all its
    /// permits); on etcd and ZooKeeper the waiters queued behind the holders keep their places.
    /// The holders find out at their next renewal (their `lost()` resolves). This is the only
    /// operation that is not owner-checked: an operator's tool, not a way to release.
    pub async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        let existed = self.core.backend.force_unlock(key).await?;
        self.core.hub.wake(key);
        Ok(existed)
    }

    /// Whether anybody holds `key` now (a snapshot, for monitoring: never decide to enter a
    /// critical section on it).
    pub async fn is_locked(&self, key: &str) -> Result<bool, LockError> {
        self.core.backend.is_locked(key).await
    }

    /// The lock on `key` as the engine shows it now: holder (redacted), TTL left, hold count,
    /// fence; `None` when nobody holds it (a waiter queued on etcd or ZooKeeper, or a key
    /// reserved for a moment after a release on Redis, is not a holder). A snapshot for
    /// operators (the `dlock` command line) and monitoring; see [`LockInfo`] for what each
    /// engine can show. An empty key or one longer than [`MAX_KEY_LEN`] is
    /// [`LockError::InvalidConfig`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dlock_runtime::LockError> {
    /// let rt = dlock_runtime::Runtime::from_url("memory://").await?;
    /// assert!(rt.inspect("stock:42").await?.is_none());
    /// let guard = rt.lock("stock:42").acquire().await?;
    /// let info = rt.inspect("stock:42").await?.expect("held");
    /// assert_eq!((info.key.as_str(), info.holds, info.fence), ("stock:42", 1, guard.fence()));
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        crate::lock::validate::validate_key(key)?;
        self.core.backend.inspect(key).await
    }

    /// Every lock held now whose key starts with `prefix` (`""`: all of this runtime's key
    /// prefix), sorted by key, as [`Runtime::inspect`] shows each. Redis reads them with
    /// `SCAN` (on Cluster on every master), never `KEYS`; etcd with one range read; ZooKeeper
    /// lists the key nodes. A prefix longer than [`MAX_KEY_LEN`] is
    /// [`LockError::InvalidConfig`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dlock_runtime::LockError> {
    /// let rt = dlock_runtime::Runtime::from_url("memory://").await?;
    /// let _b = rt.lock("stock:2").acquire().await?;
    /// let _a = rt.lock("stock:1").acquire().await?;
    /// let _other = rt.lock("cart:1").acquire().await?;
    /// let keys: Vec<String> = rt.list("stock:").await?.into_iter().map(|i| i.key).collect();
    /// assert_eq!(keys, ["stock:1", "stock:2"]);
    /// # Ok(()) }
    /// ```
    pub async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>, LockError> {
        if prefix.len() > MAX_KEY_LEN {
            return Err(LockError::config(format!(
                "key prefix of {} bytes is longer than the maximum key length of {MAX_KEY_LEN} bytes",
                prefix.len()
            )));
        }
        let found = self.core.backend.list(prefix).await?;
        Ok(crate::inspect::settle_listing(found, prefix))
    }

    /// The prefix put in front of every key in the engine.
    pub fn key_prefix(&self) -> &str {
        &self.core.prefix
    }

    /// The engine's name: `"redis"`, `"redis-cluster"`, `"redlock"`, `"etcd"`, `"zookeeper"`,
    /// `"memory"`.
    pub fn engine(&self) -> &'static str {
        self.core.engine
    }

    /// A receiver of what happens to this runtime's locks from now on: acquired (with fence
    /// and wait), renewed, renewal failed, lost, released (with the hold time), timed out.
    ///
    /// Locking never waits for a receiver: one that falls more than [`EVENT_BUFFER`] events
    /// behind loses the oldest, and its next `recv` says how many
    /// ([`RecvError::Lagged`](tokio::sync::broadcast::error::RecvError::Lagged)). Until the
    /// first call, no event is built at all.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dlock_runtime::LockError> {
    /// use dlock_runtime::{LockEvent, Runtime};
    /// let rt = Runtime::from_url("memory://").await?;
    /// let mut events = rt.events();
    /// rt.lock("report").acquire().await?.release().await?;
    /// assert!(matches!(events.recv().await, Ok(LockEvent::Acquired { .. })));
    /// assert!(matches!(events.recv().await, Ok(LockEvent::Released { .. })));
    /// # Ok(()) }
    /// ```
    ///
    /// [`EVENT_BUFFER`]: crate::EVENT_BUFFER
    pub fn events(&self) -> tokio::sync::broadcast::Receiver<LockEvent> {
        self.core.observer.subscribe()
    }

    /// Number of locks this runtime holds now, as its watchdog tracks them. A lock taken by
    /// [`with_lock`](crate::with_lock) or the attribute is tracked from the first time its
    /// body waits: a body that ends in its first poll (no other task of its thread runs
    /// meanwhile) is never counted.
    pub fn held_count(&self) -> usize {
        self.core.watchdog.len()
    }
}

impl RuntimeBuilder {
    /// Connects and starts the runtime's background work on the current tokio runtime.
    ///
    /// Errors: [`LockError::InvalidConfig`] for a bad option or URL or when no engine was
    /// chosen; [`LockError::Backend`] when the engine cannot be reached within the timeout.
    pub async fn build(self) -> Result<Runtime, LockError> {
        let handle = Handle::try_current().map_err(|_| {
            LockError::config("a lock runtime must be built inside a tokio runtime")
        })?;
        validate_lease(self.default_lease, "default lease")?;
        if self.timeout.is_zero() {
            return Err(LockError::config("timeout must be greater than zero"));
        }
        let mut config = self.engine.ok_or_else(|| {
            LockError::config(
                "no lock engine chosen: call .redis(url) or .memory() on the builder, or use Runtime::from_url",
            )
        })??;
        for (name, value) in self.engine_options {
            if !config.set(name, value)? {
                return Err(LockError::config(format!(
                    "`{name}` is not an option of the {} engine (its options: {})",
                    config.name(),
                    config.options().join(", ")
                )));
            }
        }
        let id: u64 = rand::random();
        let origin = format!("{id:016x}");
        let (hub, ops) = WaitHub::<Baton>::new();
        let engine = config.name();
        let last_resort = LastResort::new(
            config.as_ref(),
            self.prefix.clone(),
            origin.clone(),
            self.timeout,
        );
        let backend = config
            .connect(Context {
                prefix: self.prefix.clone(),
                origin,
                timeout: self.timeout,
                wakeups: hub.clone(),
            })
            .await?;
        let caps = backend.capabilities();
        let observer = Arc::new(Observer::new(engine));
        let watchdog = Arc::new(Watchdog::new(observer.clone()));
        handle.spawn(WaitHub::run_subscriptions(ops, Arc::downgrade(&backend)));
        handle.spawn(
            watchdog
                .clone()
                .run(Arc::downgrade(&backend), caps.renew_batch_limit),
        );
        let releaser = Arc::new(Releaser::new(
            backend.clone(),
            hub.clone(),
            handle.clone(),
            self.timeout,
            last_resort,
        ));
        Ok(Runtime {
            core: Arc::new(Core {
                id,
                backend,
                caps,
                hub,
                watchdog,
                observer,
                releaser,
                handle,
                prefix: self.prefix,
                default_lease: self.default_lease,
                default_wait: self.default_wait,
                engine,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A guard's hold counts from its acquisition; a `with_lock` hold from its body's first
    /// wait (as documented); neither after it ends.
    #[tokio::test]
    async fn held_count_counts_guards_and_waiting_bodies() {
        let rt = Runtime::from_url("memory://").await.expect("memory");
        let guard = rt.lock("a").acquire().await.expect("acquire");
        assert_eq!(rt.held_count(), 1);
        let counted = crate::protect::with_lock(rt.lock("b"), async {
            tokio::task::yield_now().await;
            rt.held_count()
        })
        .await
        .expect("with_lock");
        assert_eq!(counted, 2, "a body that waited is counted");
        assert_eq!(rt.held_count(), 1);
        guard.release().await.expect("release");
        assert_eq!(rt.held_count(), 0);
    }

    #[tokio::test]
    async fn urls_are_checked() {
        for bad in [
            "localhost:6379",
            "http://localhost",
            "memory://host",
            "memory://?bogus=1",
            "memory://?lease=10x",
            "memory://?lease=0s",
            "redis://127.0.0.1:1?timeout=forever",
            "redis://127.0.0.1:1?dbb=2",
            "redlock://127.0.0.1:1,,127.0.0.1:3",
            "redis+cluster://",
            "redlock://127.0.0.1:1,127.0.0.1:2",
            "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?node_timeout=0s",
        ] {
            let err = Runtime::from_url(bad).await.expect_err(bad);
            assert!(err.is_invalid_config(), "{bad}: {err}");
        }
        let rt = Runtime::from_url("memory://?prefix=x:&lease=2s&wait=5ms")
            .await
            .expect("valid memory url");
        assert_eq!(rt.key_prefix(), "x:");
        assert_eq!(rt.core.default_lease, Duration::from_secs(2));
        assert_eq!(rt.core.default_wait, Duration::from_millis(5));
    }

    #[tokio::test]
    async fn builder_needs_an_engine() {
        let err = Runtime::builder().build().await.expect_err("no engine");
        assert!(err.is_invalid_config());
        assert!(err.to_string().contains("no lock engine chosen"));
    }

    #[tokio::test]
    async fn scope_overrides_and_current_is_not_installed_outside() {
        // No global is installed in unit tests.
        assert!(matches!(Runtime::current(), Err(LockError::NotInstalled)));
        let rt = Runtime::from_url("memory://?prefix=scoped:")
            .await
            .expect("memory");
        let prefix = rt
            .scope(async { Runtime::current().map(|r| r.key_prefix().to_owned()) })
            .await
            .expect("scoped runtime is current");
        assert_eq!(prefix, "scoped:");
    }
}
