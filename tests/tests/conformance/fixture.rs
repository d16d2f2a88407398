//! The engines under test: start an engine's servers, hand out runtimes connected to it (each
//! one standing for another process), and change its state behind a holder's back.

use std::time::Duration;

use dlock_tests::cluster::RedisCluster;
use dlock_tests::etcd::EtcdServer;
use dlock_tests::zookeeper::ZooKeeperServer;
use dlock_tests::{RedisServer, Runtime, lock_key};

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

/// What differs between engines by their documented limits; the behaviours do not.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params {
    /// The shortest lease the lease tests use: 1 s, except etcd (whole seconds, raised to a
    /// 2 s server minimum) and ZooKeeper (renewal checks its session), 2 s.
    pub(crate) short_lease: Duration,
    /// How long the watchdog test holds a `short_lease` lock: several leases.
    pub(crate) hold_for: Duration,
    /// Bound on a waiter holding the key after a release (the holder's lease is 30 s).
    pub(crate) wake_within: Duration,
    /// Whether `fence()` is a token: everywhere but Redlock, where it is `None`.
    pub(crate) fences: bool,
}

/// Redlock's per-node timeout in these tests: a slow node on a loaded box must not turn into
/// a missing vote.
const REDLOCK_NODE_TIMEOUT: &str = "500ms";

impl Engine {
    pub(crate) fn params(self) -> Params {
        let one_second = Params {
            short_lease: Duration::from_secs(1),
            hold_for: Duration::from_secs(5),
            wake_within: Duration::from_millis(200),
            fences: true,
        };
        match self {
            Engine::Memory | Engine::Redis => one_second,
            Engine::Cluster => Params {
                wake_within: Duration::from_millis(500),
                ..one_second
            },
            Engine::Redlock => Params {
                wake_within: Duration::from_millis(500),
                fences: false,
                ..one_second
            },
            Engine::Etcd => Params {
                short_lease: Duration::from_secs(2),
                hold_for: Duration::from_secs(6),
                wake_within: Duration::from_millis(500),
                ..one_second
            },
            Engine::ZooKeeper => Engine::Etcd.params(),
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
}

impl Fixture {
    /// Starts the engine's servers and waits until they serve.
    pub(crate) async fn start(engine: Engine) -> Fixture {
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
            Engine::ZooKeeper => Servers::ZooKeeper(ZooKeeperServer::start()),
        };
        Fixture { engine, servers }
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
            Servers::Redlock(servers) => {
                let hosts: Vec<String> = servers
                    .iter()
                    .map(|s| format!("127.0.0.1:{}", s.port()))
                    .collect();
                Some(format!(
                    "redlock://{}?node_timeout={REDLOCK_NODE_TIMEOUT}",
                    hosts.join(",")
                ))
            }
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
}
