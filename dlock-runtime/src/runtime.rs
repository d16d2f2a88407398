//! The runtime: configured once at startup, installed process-wide, overridable per task.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::runtime::Handle;

use crate::LockError;
use crate::backend::Backend;
use crate::backend::memory::MemoryBackend;
use crate::lock::LockBuilder;
use crate::wait::WaitHub;
use crate::watchdog::Watchdog;

/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "dlock:";
/// Default lease: 30 s.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Default bound on one engine call and on connecting: 3 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest lease accepted (one year); longer is [`LockError::InvalidConfig`].
pub const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

static GLOBAL: OnceLock<Runtime> = OnceLock::new();

tokio::task_local! {
    static SCOPED: Runtime;
}

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

pub(crate) struct Core {
    /// Random id: names this runtime's own release messages, and scopes reentrancy.
    pub(crate) id: u64,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) hub: Arc<WaitHub>,
    pub(crate) watchdog: Arc<Watchdog>,
    pub(crate) handle: Handle,
    pub(crate) prefix: String,
    pub(crate) default_lease: Duration,
    pub(crate) default_wait: Duration,
    engine: &'static str,
}

impl Drop for Core {
    fn drop(&mut self) {
        self.watchdog.close();
    }
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
        GLOBAL.set(self).map_err(|_| LockError::AlreadyInstalled)
    }

    /// The runtime in effect here: the innermost [`scope`](Runtime::scope), else the installed
    /// one, else [`LockError::NotInstalled`].
    pub fn current() -> Result<Runtime, LockError> {
        SCOPED
            .try_with(Runtime::clone)
            .ok()
            .or_else(|| GLOBAL.get().cloned())
            .ok_or(LockError::NotInstalled)
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
        SCOPED.scope(self.clone(), fut).await
    }

    /// A lock on `key` in this runtime (see [`LockBuilder`]).
    pub fn lock(&self, key: impl Into<String>) -> LockBuilder {
        LockBuilder::new(Some(self.clone()), key.into())
    }

    /// Deletes the lock on `key` whoever holds it and wakes its waiters; `true` when it was
    /// held. The holder finds out at its next renewal (its `lost()` resolves). This is the only
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

    /// The prefix put in front of every key in the engine.
    pub fn key_prefix(&self) -> &str {
        &self.core.prefix
    }

    /// The engine's name: `"redis"`, `"redis-cluster"`, `"redlock"`, `"etcd"`, `"zookeeper"`,
    /// `"memory"`.
    pub fn engine(&self) -> &'static str {
        self.core.engine
    }

    /// Number of locks this runtime holds now (tracked by its watchdog).
    pub fn held_count(&self) -> usize {
        self.core.watchdog.len()
    }
}

#[derive(Debug, Clone)]
enum Engine {
    Unset,
    Memory,
    Redis(String),
    RedisCluster(Vec<String>),
    Redlock(Vec<String>),
    Etcd(Vec<String>),
    ZooKeeper(String),
}

/// Default ZooKeeper session timeout: the bound after which a dead holder's lock is freed.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// Default per-node timeout of Redlock calls.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(100);

/// Configures a [`Runtime`]; see [`Runtime::builder`].
#[derive(Debug, Clone)]
pub struct RuntimeBuilder {
    engine: Engine,
    prefix: String,
    default_lease: Duration,
    default_wait: Duration,
    timeout: Duration,
    node_timeout: Duration,
    session_timeout: Duration,
}

impl Default for RuntimeBuilder {
    fn default() -> Self {
        Self {
            engine: Engine::Unset,
            prefix: DEFAULT_PREFIX.to_owned(),
            default_lease: DEFAULT_LEASE,
            default_wait: Duration::ZERO,
            timeout: DEFAULT_TIMEOUT,
            node_timeout: DEFAULT_NODE_TIMEOUT,
            session_timeout: DEFAULT_SESSION_TIMEOUT,
        }
    }
}

impl RuntimeBuilder {
    /// One Redis server: `redis://[user:password@]host:port[/db]`, or `rediss://` (feature
    /// `tls`). Needs Redis 6 or newer (RESP3 pushes carry the release notifications).
    pub fn redis(mut self, url: impl Into<String>) -> Self {
        self.engine = Engine::Redis(url.into());
        self
    }

    /// A Redis Cluster (Redis 7 or newer), one seed URL per node (any reachable subset is
    /// enough): `.redis_cluster(["redis://h1:7000", "redis://h2:7001"])`. Each lock lives on the
    /// shard of its key's hash slot; notifications use sharded pub/sub; MOVED/ASK redirects and
    /// failovers are followed. A lock lost in a failover (the promoted replica never saw it) is
    /// reported lost at the next renewal.
    pub fn redis_cluster<I, S>(mut self, seeds: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.engine = Engine::RedisCluster(seeds.into_iter().map(Into::into).collect());
        self
    }

    /// etcd (feature `etcd`), one endpoint per member: `.etcd(["http://h1:2379",
    /// "http://h2:2379"])`. Locks live in etcd's own FIFO queue (create revisions, a lease per
    /// contender kept alive also while queued, each waiter watching only its predecessor);
    /// `fence()` is the key's create revision. Leases are whole seconds (rounded up; the server
    /// may raise short ones to its minimum).
    pub fn etcd<I, S>(mut self, endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.engine = Engine::Etcd(endpoints.into_iter().map(Into::into).collect());
        self
    }

    /// ZooKeeper (feature `zookeeper`): `.zookeeper("h1:2181,h2:2181/chroot")`. Locks are
    /// ephemeral sequential nodes under `/dlock/<key>/`; the **session timeout**
    /// ([`session_timeout`](Self::session_timeout), default 10 s) bounds how long a dead
    /// holder blocks others, not the lease; `fence()` is the node's creation zxid.
    pub fn zookeeper(mut self, connect: impl Into<String>) -> Self {
        self.engine = Engine::ZooKeeper(connect.into());
        self
    }

    /// ZooKeeper's session timeout (default 10 s; the server clamps it to its own limits).
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// Redlock over N independent Redis masters (at least 3), one URL per node; each node may
    /// carry its own password, db or TLS: `.redlock(["redis://h1:6379", "redis://h2:6379",
    /// "redis://h3:6379"])`. A lock is held by a majority; `fence()` is `None` (no strictly
    /// increasing token across holders is possible). See [`node_timeout`](Self::node_timeout).
    pub fn redlock<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.engine = Engine::Redlock(urls.into_iter().map(Into::into).collect());
        self
    }

    /// Bound on each Redlock node's answer (default 100 ms): far below the lease, so that a
    /// node that is down or paused costs at most this much per attempt.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// The in-process engine: locks exclude within this process only. The embedded default
    /// for local runs and tests.
    pub fn memory(mut self) -> Self {
        self.engine = Engine::Memory;
        self
    }

    /// Prefix of every engine key (default `"dlock:"`).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Lease of locks that do not set one (default 30 s).
    pub fn default_lease(mut self, lease: Duration) -> Self {
        self.default_lease = lease;
        self
    }

    /// Wait budget of locks that do not set one (default zero: one attempt).
    pub fn default_wait(mut self, wait: Duration) -> Self {
        self.default_wait = wait;
        self
    }

    /// Bound on connecting and on each engine call (default 3 s): an engine that is down is a
    /// [`LockError::Backend`] within about this long, never a hang.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Applies a URL (see [`Runtime::from_url`]).
    fn url(mut self, url: &str) -> Result<Self, LockError> {
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            LockError::config(format!(
                "`{url}` is not a lock URL; expected e.g. redis://host:port or memory://"
            ))
        })?;
        let (rest, fragment) = match rest.split_once('#') {
            Some((rest, fragment)) => (rest, Some(fragment)),
            None => (rest, None),
        };
        let (base, query) = match rest.split_once('?') {
            Some((base, query)) => (base, Some(query)),
            None => (rest, None),
        };
        let mut engine_params = Vec::new();
        for pair in query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|p| !p.is_empty())
        {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let duration = || {
                crate::duration::parse(value).ok_or_else(|| {
                    LockError::config(format!(
                        "invalid duration `{value}` for `{name}` in `{url}`: expected e.g. 250ms, 30s, 2m, 1h"
                    ))
                })
            };
            match name {
                "prefix" => self.prefix = value.to_owned(),
                "lease" => self.default_lease = duration()?,
                "wait" => self.default_wait = duration()?,
                "timeout" => self.timeout = duration()?,
                "node_timeout" => self.node_timeout = duration()?,
                "session_timeout" => self.session_timeout = duration()?,
                _ => engine_params.push(pair),
            }
        }
        self.engine = match scheme {
            "memory" => {
                if !base.is_empty() || !engine_params.is_empty() || fragment.is_some() {
                    return Err(LockError::config(format!(
                        "`{url}`: memory:// takes no host and only the prefix, lease, wait and timeout options"
                    )));
                }
                Engine::Memory
            }
            "redis" | "rediss" | "redlock" | "redis+cluster" | "rediss+cluster" => {
                // What the redis client reads; anything else is a typo, not an option.
                const REDIS_PARAMS: [&str; 4] = ["protocol", "db", "user", "pass"];
                if let Some(unknown) = engine_params.iter().find(|pair| {
                    let name = pair.split_once('=').map_or(**pair, |(name, _)| name);
                    !REDIS_PARAMS.contains(&name)
                }) {
                    return Err(LockError::config(format!(
                        "unknown option `{unknown}` in `{url}`; expected prefix, lease, wait, timeout, node_timeout, protocol, db, user or pass"
                    )));
                }
                let node_url = |node_scheme: &str, host: &str| {
                    let mut node = format!("{node_scheme}://{host}");
                    if !engine_params.is_empty() {
                        node.push('?');
                        node.push_str(&engine_params.join("&"));
                    }
                    if let Some(fragment) = fragment {
                        node.push('#');
                        node.push_str(fragment);
                    }
                    node
                };
                let hosts = || -> Result<Vec<&str>, LockError> {
                    let hosts: Vec<&str> = base.trim_end_matches('/').split(',').collect();
                    if hosts.iter().any(|h| h.trim().is_empty()) {
                        return Err(LockError::config(format!(
                            "`{url}`: expected {scheme}://host1:port1,host2:port2,..."
                        )));
                    }
                    Ok(hosts)
                };
                match scheme {
                    "redlock" => Engine::Redlock(
                        hosts()?
                            .iter()
                            .map(|h| node_url("redis", h.trim()))
                            .collect(),
                    ),
                    "redis+cluster" | "rediss+cluster" => {
                        let node_scheme = scheme.trim_end_matches("+cluster");
                        Engine::RedisCluster(
                            hosts()?
                                .iter()
                                .map(|h| node_url(node_scheme, h.trim()))
                                .collect(),
                        )
                    }
                    _ => Engine::Redis(node_url(scheme, base)),
                }
            }
            "zk" | "zookeeper" => {
                if let Some(unknown) = engine_params.first() {
                    return Err(LockError::config(format!(
                        "unknown option `{unknown}` in `{url}`; expected prefix, lease, wait, timeout or session_timeout"
                    )));
                }
                let hosts = base.split('/').next().unwrap_or_default();
                if hosts.split(',').any(|h| h.trim().is_empty()) {
                    return Err(LockError::config(format!(
                        "`{url}`: expected zk://host1:port1,host2:port2[/chroot]"
                    )));
                }
                Engine::ZooKeeper(base.to_owned())
            }
            "etcd" => {
                if let Some(unknown) = engine_params.first() {
                    return Err(LockError::config(format!(
                        "unknown option `{unknown}` in `{url}`; expected prefix, lease, wait or timeout"
                    )));
                }
                let hosts: Vec<&str> = base.trim_end_matches('/').split(',').collect();
                if hosts.iter().any(|h| h.trim().is_empty()) {
                    return Err(LockError::config(format!(
                        "`{url}`: expected etcd://host1:port1,host2:port2,..."
                    )));
                }
                Engine::Etcd(
                    hosts
                        .iter()
                        .map(|h| format!("http://{}", h.trim()))
                        .collect(),
                )
            }
            other => {
                return Err(LockError::config(format!(
                    "unsupported scheme `{other}` in `{url}`; expected one of redis, rediss, redis+cluster, redlock, etcd, zk, memory"
                )));
            }
        };
        Ok(self)
    }

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
        let id: u64 = rand::random();
        let (hub, ops) = WaitHub::new();
        let (backend, engine): (Arc<dyn Backend>, &'static str) = match self.engine {
            Engine::Unset => {
                return Err(LockError::config(
                    "no lock engine chosen: call .redis(url) or .memory() on the builder, or use Runtime::from_url",
                ));
            }
            Engine::Memory => (Arc::new(MemoryBackend::new()), "memory"),
            #[cfg(feature = "redis")]
            Engine::Redis(url) => {
                if url.starts_with("rediss://") && !cfg!(feature = "tls") {
                    return Err(LockError::config(format!(
                        "`{url}` needs TLS: enable the `tls` feature of dlock-runtime"
                    )));
                }
                let backend = crate::backend::redis::RedisBackend::connect(
                    &url,
                    self.prefix.clone(),
                    hub.clone(),
                    format!("{id:016x}"),
                    self.timeout,
                )
                .await?;
                (Arc::new(backend), "redis")
            }
            #[cfg(feature = "redis")]
            Engine::RedisCluster(seeds) => {
                if seeds.is_empty() {
                    return Err(LockError::config(
                        "redis_cluster needs at least one seed URL",
                    ));
                }
                let backend = crate::backend::redis::RedisBackend::connect_cluster(
                    &seeds,
                    self.prefix.clone(),
                    hub.clone(),
                    format!("{id:016x}"),
                    self.timeout,
                )
                .await?;
                (Arc::new(backend), "redis-cluster")
            }
            #[cfg(feature = "redis")]
            Engine::Redlock(urls) => {
                if self.node_timeout.is_zero() {
                    return Err(LockError::config("node_timeout must be greater than zero"));
                }
                let backend = crate::backend::redlock::RedlockBackend::connect(
                    &urls,
                    self.prefix.clone(),
                    hub.clone(),
                    format!("{id:016x}"),
                    self.node_timeout,
                )?;
                (Arc::new(backend), "redlock")
            }
            #[cfg(feature = "etcd")]
            Engine::Etcd(endpoints) => {
                if endpoints.is_empty() {
                    return Err(LockError::config("etcd needs at least one endpoint"));
                }
                let backend = crate::backend::etcd::EtcdBackend::connect(
                    &endpoints,
                    self.prefix.clone(),
                    self.timeout,
                )
                .await?;
                (Arc::new(backend), "etcd")
            }
            #[cfg(feature = "zookeeper")]
            Engine::ZooKeeper(connect) => {
                if self.session_timeout.is_zero() {
                    return Err(LockError::config(
                        "session_timeout must be greater than zero",
                    ));
                }
                let backend = crate::backend::zookeeper::ZooKeeperBackend::connect(
                    &connect,
                    &self.prefix,
                    self.session_timeout,
                    self.timeout,
                )
                .await?;
                (Arc::new(backend), "zookeeper")
            }
            #[cfg(not(feature = "zookeeper"))]
            Engine::ZooKeeper(connect) => {
                return Err(LockError::config(format!(
                    "zk://{connect} needs the `zookeeper` feature of dlock-runtime"
                )));
            }
            #[cfg(not(feature = "etcd"))]
            Engine::Etcd(endpoints) => {
                return Err(LockError::config(format!(
                    "etcd ({}) needs the `etcd` feature of dlock-runtime",
                    endpoints.join(",")
                )));
            }
            #[cfg(not(feature = "redis"))]
            Engine::Redis(_) | Engine::RedisCluster(_) | Engine::Redlock(_) => {
                return Err(LockError::config(
                    "Redis and Redlock need the `redis` feature of dlock-runtime",
                ));
            }
        };
        let watchdog = Arc::new(Watchdog::default());
        handle.spawn(WaitHub::run_subscriptions(ops, Arc::downgrade(&backend)));
        handle.spawn(
            watchdog
                .clone()
                .run(Arc::downgrade(&backend), backend.renew_batch_limit()),
        );
        Ok(Runtime {
            core: Arc::new(Core {
                id,
                backend,
                hub,
                watchdog,
                handle,
                prefix: self.prefix,
                default_lease: self.default_lease,
                default_wait: self.default_wait,
                engine,
            }),
        })
    }
}

/// A lease must be positive and at most [`MAX_LEASE`].
pub(crate) fn validate_lease(lease: Duration, what: &str) -> Result<(), LockError> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
