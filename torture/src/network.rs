//! Network faults: each worker process reaches the lock engine through links of its own, one
//! [`FaultProxy`] per engine server (from the test process kit), so that the injector can cut,
//! black-hole or slow down one worker's traffic while the others go on; and the engine-pause
//! fault, SIGSTOP of the engine's server past the lease.
//!
//! Which engines: the link faults (`partition`, `blackhole`, `latency`) apply to Redis,
//! Redlock (all three links of the worker at once), etcd and ZooKeeper. Not to a Redis
//! Cluster, whose clients learn every node's address from the cluster itself and would go
//! around a proxy, nor to memory (no network). `engine-pause` applies to every engine but
//! memory: the server of Redis, etcd and ZooKeeper, one node of Redlock, the master of a
//! random key's slot on Cluster. The store's server is never faulted.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use dlock_testkit::FaultProxy;
use dlock_testkit::process::{Signal, signal};
use dlock_testkit::redis::lock_key;

use crate::cli::{Engine, Fault};
use crate::engine::{LockEngine, Profile};
use crate::rng::Rng;

/// Bound on a Cluster being healthy again after one of its masters was paused.
const CLUSTER_OK_WITHIN: Duration = Duration::from_secs(30);

/// Whether `fault` can be injected on `engine`.
pub(crate) fn applies(fault: Fault, engine: Engine) -> bool {
    match fault {
        Fault::Partition | Fault::Blackhole | Fault::Latency => matches!(
            engine,
            Engine::Redis | Engine::Redlock | Engine::Etcd | Engine::ZooKeeper
        ),
        Fault::EnginePause => engine.has_processes(),
        Fault::Kill | Fault::Pause | Fault::Restart | Fault::Block => true,
    }
}

/// Which engine `engine` runs.
pub(crate) fn kind(engine: &LockEngine) -> Engine {
    match engine {
        LockEngine::Memory(_) => Engine::Memory,
        LockEngine::Redis(_) => Engine::Redis,
        LockEngine::Cluster(_) => Engine::Cluster,
        LockEngine::Redlock(_) => Engine::Redlock,
        LockEngine::Etcd(_) => Engine::Etcd,
        LockEngine::ZooKeeper(_) => Engine::ZooKeeper,
    }
}

/// Every worker's links: one proxy per engine server, made when the worker starts and
/// dropped (their connections closed) when it is replaced.
pub(crate) struct Links {
    /// The engine's server ports, as they appear in its URL (`127.0.0.1:<port>`).
    ports: Vec<u16>,
    by_worker: HashMap<u32, Vec<FaultProxy>>,
}

impl Links {
    /// Links for the workers of `engine`, if it has servers a proxy can stand in for.
    pub(crate) fn for_engine(engine: &LockEngine) -> Option<Links> {
        let ports = match engine {
            LockEngine::Redis(server) => vec![server.port()],
            LockEngine::Redlock(servers) => servers.iter().map(|s| s.port()).collect(),
            LockEngine::Etcd(etcd) => vec![etcd.port()],
            LockEngine::ZooKeeper(zk) => vec![zk.port()],
            LockEngine::Memory(_) | LockEngine::Cluster(_) => return None,
        };
        Some(Links {
            ports,
            by_worker: HashMap::new(),
        })
    }

    /// Makes worker `id`'s links and returns `url` (the engine's) with every server's host
    /// replaced by its link's.
    pub(crate) fn url_for(&mut self, id: u32, url: &str) -> String {
        let proxies: Vec<FaultProxy> = self.ports.iter().map(|&p| FaultProxy::to_port(p)).collect();
        let hosts: Vec<(u16, String)> = self
            .ports
            .iter()
            .zip(&proxies)
            .map(|(&port, proxy)| (port, proxy.host()))
            .collect();
        self.by_worker.insert(id, proxies);
        replace_hosts(url, &hosts)
    }

    /// Drops worker `id`'s links (the worker is gone).
    pub(crate) fn remove(&mut self, id: u32) {
        self.by_worker.remove(&id);
    }

    fn of(&self, id: u32) -> &[FaultProxy] {
        self.by_worker.get(&id).map_or(&[], Vec::as_slice)
    }

    /// Applies `fault` (a link fault) to worker `id`'s links for `period`, then heals them.
    pub(crate) async fn inject(&self, id: u32, fault: Fault, profile: Profile) {
        let links = self.of(id);
        let period = 2 * profile.lease;
        match fault {
            Fault::Partition => links.iter().for_each(FaultProxy::cut),
            Fault::Blackhole => links.iter().for_each(FaultProxy::blackhole),
            Fault::Latency => {
                let (delay, jitter) = latency(profile);
                links.iter().for_each(|link| link.latency(delay, jitter));
            }
            other => unreachable!("{other:?} is not a link fault"),
        }
        tokio::time::sleep(period).await;
        links.iter().for_each(FaultProxy::heal);
    }
}

/// The latency fault: a third of the lease each way, ± a tenth of the lease.
fn latency(profile: Profile) -> (Duration, Duration) {
    (profile.lease / 3, profile.lease / 10)
}

/// `url` with each `127.0.0.1:<port>` of `hosts` replaced by its new host (a whole port only:
/// `:1234` does not match `:12345`).
fn replace_hosts(url: &str, hosts: &[(u16, String)]) -> String {
    let mut out = url.to_owned();
    for (port, host) in hosts {
        let old = format!("127.0.0.1:{port}");
        let mut from = 0;
        while let Some(at) = out[from..].find(&old).map(|i| i + from) {
            let end = at + old.len();
            if out[end..].starts_with(|c: char| c.is_ascii_digit()) {
                from = end;
                continue;
            }
            out.replace_range(at..end, host);
            from = at + host.len();
        }
    }
    out
}

/// SIGSTOPs the engine's server (see the module documentation) for `period`, then SIGCONTs
/// it. Returns what was paused.
pub(crate) async fn pause_engine(
    engine: &mut LockEngine,
    rng: &mut Rng,
    keys: &[String],
    period: Duration,
) -> String {
    let (pid, what) = match engine {
        LockEngine::Memory(_) => return "nothing (in-process)".into(),
        LockEngine::Cluster(cluster) => {
            // Through the cluster's handle, which follows the failover this may cause.
            let key = &keys[rng.below(keys.len())];
            let master = cluster.master_for_key(&lock_key(key)).await;
            tokio::task::block_in_place(|| cluster.pause(master));
            tokio::time::sleep(period).await;
            tokio::task::block_in_place(|| cluster.resume(master));
            cluster.wait_ok(CLUSTER_OK_WITHIN).await;
            return format!("cluster node {master} (master of {key})");
        }
        LockEngine::Redis(server) => (server.pid(), "redis-server".to_owned()),
        LockEngine::Redlock(servers) => {
            let i = rng.below(servers.len());
            (servers[i].pid(), format!("redlock node {i}"))
        }
        LockEngine::Etcd(etcd) => (etcd.pid(), "etcd".to_owned()),
        LockEngine::ZooKeeper(zk) => (zk.pid(), "zookeeper".to_owned()),
    };
    tokio::task::block_in_place(|| signal(pid, Signal::Stop));
    tokio::time::sleep(period).await;
    signal(pid, Signal::Cont);
    what
}

/// What the network faults cost: per fault, how many were injected, how long they lasted in
/// all, and how many sections ended meanwhile (every worker's, against the run's mean rate).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Cost {
    pub(crate) injected: u32,
    pub(crate) lasted: Duration,
    pub(crate) sections: u64,
}

impl Cost {
    /// Adds one fault that lasted from `started` to now, with `sections` ended meanwhile.
    pub(crate) fn add(&mut self, started: Instant, sections: u64) {
        self.injected += 1;
        self.lasted += started.elapsed();
        self.sections += sections;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_replaced_by_whole_ports_only() {
        let hosts = [
            (1234, "127.0.0.1:9".to_owned()),
            (7, "127.0.0.1:8".to_owned()),
        ];
        assert_eq!(
            replace_hosts(
                "redlock://127.0.0.1:1234,127.0.0.1:12345,127.0.0.1:7?node_timeout=250ms",
                &hosts
            ),
            "redlock://127.0.0.1:9,127.0.0.1:12345,127.0.0.1:8?node_timeout=250ms"
        );
        assert_eq!(
            replace_hosts("zk://127.0.0.1:7/?session_timeout=2000ms", &hosts),
            "zk://127.0.0.1:8/?session_timeout=2000ms"
        );
    }

    #[test]
    fn link_faults_apply_where_a_proxy_can_stand_in_for_the_servers() {
        for fault in [Fault::Partition, Fault::Blackhole, Fault::Latency] {
            assert!(!applies(fault, Engine::Memory));
            assert!(!applies(fault, Engine::Cluster));
            assert!(applies(fault, Engine::Redlock));
        }
        assert!(applies(Fault::EnginePause, Engine::Cluster));
        assert!(!applies(Fault::EnginePause, Engine::Memory));
    }
}
