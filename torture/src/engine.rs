//! The lock engine under test: its servers (from the test process kit), the URL workers use,
//! the lease and bounds the run uses on it, its restart fault, and the final check that no key
//! is left locked.

use std::time::{Duration, Instant};

use dlock_runtime::{LockGuard, Runtime};
use dlock_testkit::RedisServer;
use dlock_testkit::cluster::RedisCluster;
use dlock_testkit::etcd::EtcdServer;
use dlock_testkit::limits;
use dlock_testkit::redis::{lock_key, redlock_hosts};
use dlock_testkit::zookeeper::ZooKeeperServer;

use crate::cli::{Engine, Mode};
use crate::rng::Rng;

/// Redlock's per-node timeout: a node slowed down by a loaded machine is not a missing vote.
const REDLOCK_NODE_TIMEOUT: &str = "250ms";

/// Bound on a restarted cluster node's cluster being healthy again.
const CLUSTER_OK_WITHIN: Duration = Duration::from_secs(30);

/// How the workers lock on an engine, and the bounds the checks rely on (from the engine's row
/// of the test kit's table of limits).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Profile {
    /// The lease of every lock (renewed by the watchdog every third of it): the engine's
    /// `contended_lease`.
    pub(crate) lease: Duration,
    /// How long `with_lock` waits for a busy key: two leases.
    pub(crate) wait: Duration,
    /// After this long a dead holder's lock is free: the lease, or ZooKeeper's session.
    pub(crate) dead_holder: Duration,
    /// How much longer a dead holder's lock may live when the engine restarts (etcd).
    pub(crate) restart_extends: Duration,
}

impl Profile {
    pub(crate) fn of(engine: Engine) -> Profile {
        let row = limits::of(engine.name());
        Profile {
            lease: row.contended_lease,
            wait: 2 * row.contended_lease,
            dead_holder: row.dead_holder,
            restart_extends: row.restart_extends,
        }
    }

    /// When a dead holder's lock is free at the latest, given when the last fault and the last
    /// engine restart ended.
    pub(crate) fn all_free_at(&self, last: Instant, last_restart: Option<Instant>) -> Instant {
        let after_restart = last_restart.map(|r| r + self.dead_holder + self.restart_extends);
        (last + self.dead_holder).max(after_restart.unwrap_or(last))
    }

    /// How long a paused worker stays stopped: past its lease (and its session).
    pub(crate) fn pause(&self) -> Duration {
        self.dead_holder.max(self.lease) + Duration::from_secs(1)
    }
}

/// The servers of the engine.
pub(crate) enum LockEngine {
    /// In-process: the runtime is the engine.
    Memory(Runtime),
    Redis(RedisServer),
    Cluster(RedisCluster),
    /// Three independent masters.
    Redlock(Vec<RedisServer>),
    Etcd(EtcdServer),
    ZooKeeper(ZooKeeperServer),
}

impl LockEngine {
    /// Starts the engine's servers (blocking until they serve).
    pub(crate) async fn start(engine: Engine) -> Result<LockEngine, String> {
        let started = match engine {
            Engine::Memory => {
                let rt = Runtime::from_url("memory://")
                    .await
                    .map_err(|e| e.to_string())?;
                return Ok(LockEngine::Memory(rt));
            }
            Engine::Redis => blocking(|| LockEngine::Redis(RedisServer::start())).await,
            Engine::Cluster => blocking(|| LockEngine::Cluster(RedisCluster::start())).await,
            Engine::Redlock => {
                blocking(|| LockEngine::Redlock((0..3).map(|_| RedisServer::start()).collect()))
                    .await
            }
            Engine::Etcd => blocking(|| LockEngine::Etcd(EtcdServer::start())).await,
            Engine::ZooKeeper => blocking(|| LockEngine::ZooKeeper(ZooKeeperServer::start())).await,
        };
        started.map_err(|e| format!("start {engine}: {e}"))
    }

    /// The URL a worker's runtime is built from (`memory://` for the in-process engine).
    pub(crate) fn url(&self) -> String {
        match self {
            LockEngine::Memory(_) => "memory://".into(),
            LockEngine::Redis(server) => server.url(),
            LockEngine::Cluster(cluster) => cluster.url(),
            LockEngine::Redlock(servers) => format!(
                "redlock://{}?node_timeout={REDLOCK_NODE_TIMEOUT}",
                redlock_hosts(servers)
            ),
            LockEngine::Etcd(etcd) => etcd.url(),
            LockEngine::ZooKeeper(zk) => {
                format!(
                    "{}?session_timeout={}ms",
                    zk.url(),
                    limits::ZOOKEEPER_SESSION.as_millis()
                )
            }
        }
    }

    /// A runtime on the engine (the in-process one for memory).
    pub(crate) async fn runtime(&self) -> Result<Runtime, String> {
        match self {
            LockEngine::Memory(rt) => Ok(rt.clone()),
            _ => Runtime::from_url(&self.url())
                .await
                .map_err(|e| format!("a runtime on {}: {e}", self.url())),
        }
    }

    /// Restarts the engine, or the part of it the fault model names: one Redis (no
    /// persistence: it comes back empty), the master of a random key's slot on Cluster (empty;
    /// or after a failover, as a replica), one Redlock node (a minority, empty), the etcd
    /// member and the ZooKeeper server (their data survives). Returns what was restarted.
    pub(crate) async fn restart(&mut self, rng: &mut Rng, keys: &[String]) -> String {
        match self {
            LockEngine::Memory(_) => "nothing (in-process)".into(),
            LockEngine::Redis(server) => {
                tokio::task::block_in_place(|| server.restart());
                "redis-server".into()
            }
            LockEngine::Cluster(cluster) => {
                let key = &keys[rng.below(keys.len())];
                let master = cluster.master_for_key(&lock_key(key)).await;
                tokio::task::block_in_place(|| cluster.restart(master));
                cluster.wait_ok(CLUSTER_OK_WITHIN).await;
                format!("cluster node {master} (master of {key})")
            }
            LockEngine::Redlock(servers) => {
                let i = rng.below(servers.len());
                tokio::task::block_in_place(|| servers[i].restart());
                format!("redlock node {i}")
            }
            LockEngine::Etcd(etcd) => {
                tokio::task::block_in_place(|| etcd.restart());
                "etcd".into()
            }
            LockEngine::ZooKeeper(zk) => {
                tokio::task::block_in_place(|| zk.restart());
                "zookeeper".into()
            }
        }
    }
}

/// Runs a blocking kit call (which panics on failure) off the async workers; its panic becomes
/// an error.
async fn blocking<T: Send + 'static>(
    start: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(start)
        .await
        .map_err(|e| format!("{e}"))
}

/// The keys still locked now, tried once each with no wait on `rt`; for each, how long it then
/// took to get (up to 30 s), or `None` if it never came free. A semaphore's key is free when
/// all its permits can be taken at once; a read-write lock's when its write lock can.
pub(crate) async fn keys_left(
    rt: &Runtime,
    keys: &[String],
    mode: Mode,
) -> Vec<(String, Option<Duration>)> {
    let mut left = Vec::new();
    for key in keys {
        if try_all(rt, key, mode, Duration::ZERO).await {
            continue;
        }
        let since = Instant::now();
        let freed = try_all(rt, key, mode, Duration::from_secs(30))
            .await
            .then(|| since.elapsed());
        left.push((key.clone(), freed));
    }
    left
}

/// The exclusive lock, or every permit of a semaphore, taken together then released: whether
/// they all were.
async fn try_all(rt: &Runtime, key: &str, mode: Mode, wait: Duration) -> bool {
    let mut held = Vec::new();
    let mut all = true;
    let n = match mode {
        Mode::Semaphore(n) => n,
        Mode::Exclusive | Mode::Rw => 1,
    };
    for _ in 0..n {
        match try_once(rt, key, mode, wait).await {
            Some(guard) => held.push(guard),
            None => {
                all = false;
                break;
            }
        }
    }
    for guard in held {
        if let Err(e) = guard.release().await {
            eprintln!("release {key} after the final check: {e}");
        }
    }
    all
}

/// One acquisition (retrying engine errors for up to 10 s: the engine may have just
/// restarted).
async fn try_once(rt: &Runtime, key: &str, mode: Mode, wait: Duration) -> Option<LockGuard> {
    let start = Instant::now();
    loop {
        let lock = match mode {
            Mode::Semaphore(n) => rt.semaphore(key, n),
            Mode::Exclusive | Mode::Rw => rt.lock(key),
        };
        match lock
            .lease(Duration::from_secs(5))
            .wait(wait)
            .acquire()
            .await
        {
            Ok(guard) => return Some(guard),
            Err(e) if e.is_backend() && start.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => {
                if !e.is_timeout() {
                    eprintln!("final check of {key}: {e}");
                }
                return None;
            }
        }
    }
}
