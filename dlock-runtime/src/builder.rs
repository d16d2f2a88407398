//! Configuring a runtime: the engine (by builder method or URL) and the runtime's policy
//! options. Engine options are handed to the engine's own configuration, which validates them.

use std::time::Duration;

use crate::backend::url::{EngineUrl, RUNTIME_OPTIONS};
use crate::backend::{EngineConfig, Setting};
use crate::engines;
use crate::error::LockError;

/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "dlock:";
/// Default lease: 30 s.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Default bound on one engine call and on connecting: 3 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);

/// Configures a [`Runtime`](crate::Runtime); see [`Runtime::builder`](crate::Runtime::builder).
#[derive(Debug)]
pub struct RuntimeBuilder {
    pub(crate) engine: Option<Result<Box<dyn EngineConfig>, LockError>>,
    /// Engine options set on the builder, applied to the engine at `build`.
    pub(crate) engine_options: Vec<(&'static str, Setting<'static>)>,
    pub(crate) prefix: String,
    pub(crate) default_lease: Duration,
    pub(crate) default_wait: Duration,
    pub(crate) timeout: Duration,
}

impl Clone for RuntimeBuilder {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.as_ref().map(|engine| match engine {
                Ok(config) => Ok(config.clone_box()),
                Err(err) => Err(err.clone()),
            }),
            engine_options: self.engine_options.clone(),
            prefix: self.prefix.clone(),
            default_lease: self.default_lease,
            default_wait: self.default_wait,
            timeout: self.timeout,
        }
    }
}

impl Default for RuntimeBuilder {
    fn default() -> Self {
        Self {
            engine: None,
            engine_options: Vec::new(),
            prefix: DEFAULT_PREFIX.to_owned(),
            default_lease: DEFAULT_LEASE,
            default_wait: Duration::ZERO,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl RuntimeBuilder {
    fn engine(mut self, engine: Result<Box<dyn EngineConfig>, LockError>) -> Self {
        self.engine = Some(engine);
        self
    }

    fn engine_option(mut self, name: &'static str, value: Setting<'static>) -> Self {
        self.engine_options.push((name, value));
        self
    }

    /// One Redis server: `redis://[user:password@]host:port[/db]`, or `rediss://` (feature
    /// `tls`). Needs Redis 6 or newer (RESP3 pushes carry the release notifications).
    pub fn redis(self, url: impl Into<String>) -> Self {
        self.engine(engines::redis(url.into()))
    }

    /// A Redis Cluster (Redis 7 or newer), one seed URL per node (any reachable subset is
    /// enough): `.redis_cluster(["redis://h1:7000", "redis://h2:7001"])`. Each lock lives on the
    /// shard of its key's hash slot; notifications use sharded pub/sub; MOVED/ASK redirects and
    /// failovers are followed. A lock lost in a failover (the promoted replica never saw it) is
    /// reported lost at the next renewal.
    pub fn redis_cluster<I, S>(self, seeds: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.engine(engines::redis_cluster(
            seeds.into_iter().map(Into::into).collect(),
        ))
    }

    /// etcd (feature `etcd`), one endpoint per member: `.etcd(["http://h1:2379",
    /// "http://h2:2379"])`. Locks live in etcd's own FIFO queue (create revisions, a lease per
    /// contender kept alive also while queued, each waiter watching only its predecessor);
    /// `fence()` is the key's create revision. Leases are whole seconds (rounded up; the server
    /// may raise short ones to its minimum).
    pub fn etcd<I, S>(self, endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.engine(engines::etcd(
            endpoints.into_iter().map(Into::into).collect(),
        ))
    }

    /// ZooKeeper (feature `zookeeper`): `.zookeeper("h1:2181,h2:2181/chroot")`. Locks are
    /// ephemeral sequential nodes under `/dlock/<key>/`; the **session timeout**
    /// ([`session_timeout`](Self::session_timeout), default 10 s) bounds how long a dead
    /// holder blocks others, not the lease; `fence()` is the node's creation zxid.
    pub fn zookeeper(self, connect: impl Into<String>) -> Self {
        self.engine(engines::zookeeper(connect.into()))
    }

    /// ZooKeeper's session timeout to ask for (default 10 s). The server clamps it to its
    /// `minSessionTimeout`..`maxSessionTimeout` (by default 2 to 20 ticks) and the runtime
    /// counts on the timeout the server **granted** (logged at debug): a holder counts its lock
    /// lost once that long has passed since its last confirmed call. An option of the ZooKeeper
    /// engine: with another engine, `build` fails with [`LockError::InvalidConfig`].
    pub fn session_timeout(self, timeout: Duration) -> Self {
        self.engine_option("session_timeout", Setting::Duration(timeout))
    }

    /// Redlock over N independent Redis masters (at least 3), one URL per node; each node may
    /// carry its own password, db or TLS: `.redlock(["redis://h1:6379", "redis://h2:6379",
    /// "redis://h3:6379"])`. A lock is held by a majority of them (or [`quorum`](Self::quorum));
    /// a node seen restarting counts again only [`rejoin_after`](Self::rejoin_after) later;
    /// `fence()` is `None` (no strictly increasing token across holders is possible). See
    /// [`node_timeout`](Self::node_timeout) and [`min_validity`](Self::min_validity).
    pub fn redlock<I, S>(self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.engine(engines::redlock(urls.into_iter().map(Into::into).collect()))
    }

    /// Bound on each Redlock node's answer (default 100 ms): far below the lease, so that a
    /// node that is down or paused costs at most this much per attempt. An option of the
    /// Redlock engine: with another engine, `build` fails with [`LockError::InvalidConfig`].
    pub fn node_timeout(self, timeout: Duration) -> Self {
        self.engine_option("node_timeout", Setting::Duration(timeout))
    }

    /// Redlock: the fraction of the lease that must still be valid when the quorum has granted
    /// the lock (default `0.5`; from 0 to below 1); a grant that came later is undone and the
    /// attempt retried. The URL option `min_validity=0.5`. An option of the Redlock engine:
    /// with another engine, or out of range, `build` fails with [`LockError::InvalidConfig`].
    pub fn min_validity(self, fraction: f64) -> Self {
        self.engine_option("min_validity", Setting::Fraction(fraction))
    }

    /// Redlock: how many nodes must grant a lock (default: a majority, `N/2 + 1`). A larger
    /// quorum survives more nodes restarted empty while a lock is held (`2q - N - 1` of them)
    /// at the cost of availability (at most `N - q` nodes may be down). Must be from a
    /// majority to `N`, else `build` fails with [`LockError::InvalidConfig`]. The URL option
    /// `quorum=3`.
    pub fn quorum(self, nodes: u32) -> Self {
        self.engine_option("quorum", Setting::Count(nodes))
    }

    /// Redlock: how long after a node restarted its grants count again (default: the longest
    /// lease this runtime has used; zero turns the check off). The runtime reads each node's
    /// run id (`INFO server`) when it first reaches it and after every reconnect or failed
    /// call; a node whose run id changed has restarted and may have lost the locks it held, so
    /// its grants do not count toward the quorum until this long after its restart. The URL
    /// option `rejoin_after=30s`.
    pub fn rejoin_after(self, delay: Duration) -> Self {
        self.engine_option("rejoin_after", Setting::Duration(delay))
    }

    /// The in-process engine: locks exclude within this process only. The embedded default
    /// for local runs and tests.
    pub fn memory(self) -> Self {
        self.engine(engines::memory())
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

    /// Applies a URL (see [`Runtime::from_url`](crate::Runtime::from_url)): the runtime's options from its query, the
    /// rest to the engine its scheme names. Builder methods called afterwards override what
    /// the URL set. A bad URL is [`LockError::InvalidConfig`] (its password redacted).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dlock_runtime::LockError> {
    /// let rt = dlock_runtime::Runtime::builder()
    ///     .url("memory://?prefix=app:")?
    ///     .key_prefix("ops:")
    ///     .build()
    ///     .await?;
    /// assert_eq!(rt.key_prefix(), "ops:");
    /// # Ok(()) }
    /// ```
    pub fn url(mut self, url: &str) -> Result<Self, LockError> {
        let mut parsed = EngineUrl::parse(url)?;
        let shown = parsed.url.clone();
        for (name, value) in parsed.take_options(&RUNTIME_OPTIONS) {
            let duration = || {
                Setting::Text(value)
                    .duration(name)
                    .map_err(|e| LockError::config(format!("{e} in `{shown}`")))
            };
            match name {
                "prefix" => self.prefix = value.to_owned(),
                "lease" => self.default_lease = duration()?,
                "wait" => self.default_wait = duration()?,
                _ => self.timeout = duration()?,
            }
        }
        Ok(self.engine(Ok(engines::from_url(&parsed)?)))
    }
}
