//! The engines under test: start an engine's servers, hand out runtimes connected to it (each
//! one standing for another process), and change its state behind a holder's back.

use std::future::Future;
use std::time::Duration;

use dlock_runtime::testing::zookeeper_segment;
use dlock_tests::cluster::RedisCluster;
use dlock_tests::etcd::EtcdServer;
use dlock_tests::limits::{self, EngineLimits};
use dlock_tests::zookeeper::ZooKeeperServer;
use dlock_tests::{
    RedisKeys, RedisServer, Runtime, eventually, finish_within, lock_key, redlock_hosts,
    released_channel,
};

/// The six engines every behaviour runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Engine {
    /// `memory://`: in-process; its state lives in one runtime.
    Memory,
    /// `redis://`: one `redis-server`.
    Redis,
    /// `redis+cluster://`: a Redis Cluster of three masters (each with a replica).
    Cluster,
    /// `redlock://`: three independent `redis-server`s.
    Redlock,
    /// `etcd://`: one etcd member.
    Etcd,
    /// `zk://`: one standalone ZooKeeper server.
    ZooKeeper,
}

/// What differs between engines by their documented limits (the lease, dead-holder and wake
/// bounds from the test kit's table, [`limits`]); the behaviours do not.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params {
    /// The shortest lease the lease tests use: the engine's `short_lease` (1 s; 2 s on etcd and
    /// ZooKeeper).
    pub(crate) short_lease: Duration,
    /// How long the watchdog test holds a `short_lease` lock: several leases (4 s more than one).
    pub(crate) hold_for: Duration,
    /// Bound on a waiter holding the key after a release (the holder's lease is 30 s): the
    /// engine's `wake_within`.
    pub(crate) wake_within: Duration,
    /// Whether `fence()` is a token: everywhere but Redlock, where it is `None`.
    pub(crate) fences: bool,
    /// Whether `inspect` shows a holder's own fence: on the engines that can tell the holder's
    /// token (memory: the entry's, etcd: create revision, ZooKeeper: czxid), not on the Redis
    /// engines (their counter runs ahead of the holder's token) nor Redlock (no fences).
    pub(crate) inspect_shows_fence: bool,
    /// The lease of a lock held when the engine goes down: 2 s; 3 s on etcd (whole seconds,
    /// above its 2 s minimum); on ZooKeeper 30 s, since there the session bounds a loss, not
    /// the lease. (The memory engine cannot go down.)
    pub(crate) down_lease: Duration,
    /// Bound from the engine going down to the holder's body ending in `Lost` (nothing can
    /// confirm a renewal, so the validity runs out locally): `down_lease` plus 1.5 s on the
    /// Redis family, plus 0.7 s on etcd; on ZooKeeper the negotiated session
    /// ([`ZK_DOWN_SESSION`]) plus 0.7 s.
    pub(crate) lost_within: Duration,
}

/// The longest session the ZooKeeper server of [`Fixture::start_for_faults`] grants (its
/// `maxSessionTimeout`), while the runtimes ask for the default 10 s.
const ZK_DOWN_SESSION: Duration = limits::ZOOKEEPER_SESSION;

/// Redlock's per-node timeout in these tests: a slow node on a loaded box must not turn into
/// a missing vote.
const REDLOCK_NODE_TIMEOUT: &str = "500ms";

impl Engine {
    /// The engine's row of the test kit's table of limits (named as its module in the suite:
    /// `Engine::ZooKeeper` is `zookeeper`).
    pub(crate) fn limits(self) -> EngineLimits {
        limits::of(&format!("{self:?}").to_lowercase())
    }

    pub(crate) fn params(self) -> Params {
        let limits = self.limits();
        let (down_lease, lost_within) = match self {
            Engine::Memory | Engine::Redis | Engine::Cluster | Engine::Redlock => {
                (Duration::from_secs(2), Duration::from_millis(3500))
            }
            Engine::Etcd => (Duration::from_secs(3), Duration::from_millis(3700)),
            Engine::ZooKeeper => (
                Duration::from_secs(30),
                ZK_DOWN_SESSION + Duration::from_millis(700),
            ),
        };
        Params {
            short_lease: limits.short_lease,
            hold_for: limits.short_lease + Duration::from_secs(4),
            wake_within: limits.wake_within,
            fences: self != Engine::Redlock,
            inspect_shows_fence: matches!(self, Engine::Memory | Engine::Etcd | Engine::ZooKeeper),
            down_lease,
            lost_within,
        }
    }
}

/// The servers behind a fixture.
enum Servers {
    /// The memory engine's one runtime: its state is the engine.
    Memory(Runtime),
    Redis(RedisServer),
    Cluster(RedisCluster),
    Redlock(Vec<RedisServer>),
    Etcd(EtcdServer),
    ZooKeeper(ZooKeeperServer),
}

/// One engine, started for one test; its servers are killed when it drops.
pub(crate) struct Fixture {
    pub(crate) engine: Engine,
    servers: Servers,
    /// The nodes [`kill_engine`](Fixture::kill_engine) killed (Cluster, Redlock), for
    /// [`restart_engine`](Fixture::restart_engine).
    down: Vec<usize>,
}

impl Fixture {
    /// Starts the engine's servers and waits until they serve.
    pub(crate) async fn start(engine: Engine) -> Fixture {
        Fixture::start_with(engine, ZooKeeperServer::start).await
    }

    /// Like [`start`](Fixture::start), for the engine going down: ZooKeeper's server grants
    /// sessions of at most [`ZK_DOWN_SESSION`] while the runtimes ask for the default 10 s, so a
    /// holder must count on the session the server negotiated, the engine's documented bound.
    pub(crate) async fn start_for_faults(engine: Engine) -> Fixture {
        Fixture::start_with(engine, || {
            ZooKeeperServer::start_with_max_session_timeout(ZK_DOWN_SESSION)
        })
        .await
    }

    async fn start_with(engine: Engine, zookeeper: impl FnOnce() -> ZooKeeperServer) -> Fixture {
        let servers = match engine {
            Engine::Memory => Servers::Memory(
                Runtime::from_url("memory://")
                    .await
                    .expect("a memory runtime"),
            ),
            Engine::Redis => Servers::Redis(RedisServer::start()),
            Engine::Cluster => Servers::Cluster(RedisCluster::start()),
            Engine::Redlock => Servers::Redlock(std::thread::scope(|s| {
                let starting: Vec<_> = (0..3).map(|_| s.spawn(RedisServer::start)).collect();
                starting
                    .into_iter()
                    .map(|h| h.join().expect("start redis-server"))
                    .collect()
            })),
            Engine::Etcd => Servers::Etcd(EtcdServer::start()),
            Engine::ZooKeeper => Servers::ZooKeeper(zookeeper()),
        };
        Fixture {
            engine,
            servers,
            down: Vec::new(),
        }
    }

    pub(crate) fn params(&self) -> Params {
        self.engine.params()
    }

    /// The URL runtimes are built from (so every test also checks the engine's good URL).
    pub(crate) fn url(&self) -> Option<String> {
        match &self.servers {
            Servers::Memory(_) => None,
            Servers::Redis(server) => Some(server.url()),
            Servers::Cluster(cluster) => Some(cluster.url()),
            Servers::Redlock(servers) => Some(format!(
                "redlock://{}?node_timeout={REDLOCK_NODE_TIMEOUT}",
                redlock_hosts(servers)
            )),
            Servers::Etcd(etcd) => Some(etcd.url()),
            Servers::ZooKeeper(zk) => Some(zk.url()),
        }
    }

    /// A runtime on this engine, standing for another process: a new connection (or session)
    /// on every engine but memory, whose state lives in its one runtime (there, the same
    /// runtime: its tasks are the contenders).
    pub(crate) async fn runtime(&self) -> Runtime {
        match (&self.servers, self.url()) {
            (Servers::Memory(rt), _) => rt.clone(),
            (_, Some(url)) => Runtime::from_url(&url)
                .await
                .unwrap_or_else(|e| panic!("{:?}: a runtime on {url}: {e}", self.engine)),
            (_, None) => unreachable!("every engine with servers has a URL"),
        }
    }

    /// `n` runtimes (see [`runtime`](Fixture::runtime)).
    pub(crate) async fn runtimes(&self, n: usize) -> Vec<Runtime> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.runtime().await);
        }
        out
    }

    /// As many runtimes as the pattern they are bound to names (see
    /// [`runtime`](Fixture::runtime)): `let [rt, other] = fixture.each_runtime().await;`.
    pub(crate) async fn each_runtime<const N: usize>(&self) -> [Runtime; N] {
        let runtimes = self.runtimes(N).await;
        runtimes
            .try_into()
            .unwrap_or_else(|_: Vec<Runtime>| unreachable!("runtimes(N) returns N runtimes"))
    }

    /// Runs `per_runtime` tasks on each of `n` runtimes (see [`runtime`](Fixture::runtime)),
    /// each the future `task` makes of its runtime; waits for them in order, each within
    /// `within` (see [`finish_within`]), and panics if one panicked.
    pub(crate) async fn tasks_on_each<F, Fut>(
        &self,
        (n, per_runtime): (usize, usize),
        within: Duration,
        task: F,
    ) where
        F: Fn(Runtime) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut tasks = Vec::new();
        for rt in self.runtimes(n).await {
            for _ in 0..per_runtime {
                tasks.push(tokio::spawn(task(rt.clone())));
            }
        }
        finish_within(tasks, within).await;
    }

    /// Raw access to the keys of the Redis engines, behind the runtime's back: the server
    /// (Redis), the slot-routed cluster (Cluster), every node (Redlock); none elsewhere.
    pub(crate) fn redis_nodes(&self) -> Vec<&RedisKeys> {
        match &self.servers {
            Servers::Redis(server) => vec![&**server],
            Servers::Cluster(cluster) => vec![&**cluster],
            Servers::Redlock(servers) => servers.iter().map(|s| &**s).collect(),
            Servers::Memory(_) | Servers::Etcd(_) | Servers::ZooKeeper(_) => Vec::new(),
        }
    }

    /// Deletes the lock record of `key` behind its holder's back, the engine's own way: `DEL`
    /// of the lock hash (on every node for Redlock), a delete of the holder's etcd key (its lease
    /// stays), and `force_unlock` from another runtime where the tests have no raw client
    /// (memory, ZooKeeper). Panics if there was nothing to delete.
    pub(crate) async fn delete_lock(&self, key: &str) {
        let deleted = match &self.servers {
            Servers::Memory(rt) => rt.force_unlock(key).await.expect("force_unlock"),
            Servers::Redis(server) => server.del(&lock_key(key)).await,
            Servers::Cluster(cluster) => cluster.del(&lock_key(key)).await,
            Servers::Redlock(servers) => {
                let mut all = true;
                for server in servers {
                    all &= server.del(&lock_key(key)).await;
                }
                all
            }
            Servers::Etcd(etcd) => tokio::task::block_in_place(|| {
                let contenders = etcd.get_prefix(&format!("dlock:{key}/"));
                assert_eq!(
                    contenders.len(),
                    1,
                    "etcd: expected the holder's key only under dlock:{key}/"
                );
                etcd.delete(&contenders[0].key)
            }),
            Servers::ZooKeeper(_) => self
                .runtime()
                .await
                .force_unlock(key)
                .await
                .expect("force_unlock"),
        };
        assert!(
            deleted,
            "{:?}: no lock record of {key:?} to delete",
            self.engine
        );
    }

    /// Waits until `n` waiters for `key`, each on a runtime of its own, wait at the engine (each
    /// has made its first attempt): `n` contenders queued behind the holder (etcd keys,
    /// ZooKeeper nodes), or `n` subscriptions to the key's release channel (Redis; sharded, on
    /// the key's master, on Cluster; on every node for Redlock). Panics after `within`.
    pub(crate) async fn wait_for_waiters(&self, key: &str, n: usize, within: Duration) {
        let what = format!("{:?}: {n} waiters for {key:?} at the engine", self.engine);
        eventually(within, &what, || async {
            self.waiters_at_engine(key).await >= n
        })
        .await;
    }

    /// How many waiters for `key` the engine sees (see [`wait_for_waiters`](Self::wait_for_waiters)).
    async fn waiters_at_engine(&self, key: &str) -> usize {
        let channel = released_channel(key);
        let count = |n: u64| usize::try_from(n).expect("a subscriber count");
        match &self.servers {
            Servers::Memory(_) => panic!("the memory engine has no server to ask about waiters"),
            Servers::Redis(server) => count(server.subscribers(&channel).await),
            Servers::Cluster(cluster) => {
                let master = cluster.master_for_key(key).await;
                count(cluster.shard_subscribers(master, &channel).await)
            }
            Servers::Redlock(servers) => {
                let mut fewest = usize::MAX;
                for server in servers {
                    fewest = fewest.min(count(server.subscribers(&channel).await));
                }
                fewest
            }
            Servers::Etcd(etcd) => tokio::task::block_in_place(|| {
                let contenders = etcd.get_prefix(&format!("dlock:{key}/"));
                contenders.len().saturating_sub(1)
            }),
            Servers::ZooKeeper(zk) => {
                let parent = format!("/dlock/{}/", zookeeper_segment(key));
                let nodes = tokio::task::block_in_place(|| zk.ephemeral_nodes());
                let queued = nodes.iter().filter(|n| n.starts_with(&parent)).count();
                queued.saturating_sub(1)
            }
        }
    }

    /// Takes the engine down with kill -9 so that nothing can confirm a renewal of `key`: its
    /// one server (Redis, etcd, ZooKeeper); on Cluster the master of the key's slot and its
    /// replicas (a replica left alive would be promoted, with the lock); on Redlock enough nodes
    /// to lose the quorum (two of three). [`restart_engine`](Self::restart_engine) brings them
    /// back.
    pub(crate) async fn kill_engine(&mut self, key: &str) {
        match &mut self.servers {
            Servers::Memory(_) => {
                panic!("the memory engine lives in its runtime: it cannot go down on its own")
            }
            Servers::Redis(server) => server.kill9(),
            Servers::Cluster(cluster) => {
                let master = cluster.master_for_key(key).await;
                let mut shard = vec![master];
                shard.extend(cluster.replicas_of(master).await);
                for &i in &shard {
                    cluster.kill9(i);
                }
                self.down = shard;
            }
            Servers::Redlock(servers) => {
                let quorum = servers.len() / 2 + 1;
                self.down = (0..=servers.len() - quorum).collect();
                for &i in &self.down {
                    servers[i].kill9();
                }
            }
            Servers::Etcd(etcd) => etcd.kill9(),
            Servers::ZooKeeper(zk) => zk.kill9(),
        }
    }

    /// Restarts what [`kill_engine`](Self::kill_engine) killed, on the same ports: Redis and
    /// Redis Cluster nodes come back empty (no persistence), etcd and ZooKeeper with their data.
    pub(crate) fn restart_engine(&mut self) {
        let down = std::mem::take(&mut self.down);
        tokio::task::block_in_place(|| match &mut self.servers {
            Servers::Memory(_) => unreachable!("the memory engine cannot go down"),
            Servers::Redis(server) => server.restart(),
            Servers::Cluster(cluster) => down.iter().for_each(|&i| cluster.restart(i)),
            Servers::Redlock(servers) => down.iter().for_each(|&i| servers[i].restart()),
            Servers::Etcd(etcd) => etcd.restart(),
            Servers::ZooKeeper(zk) => zk.restart(),
        });
    }
}
