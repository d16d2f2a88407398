//! Network faults between a runtime and its engine: every connection the runtime makes goes
//! through a [`FaultProxy`] of the test kit (one per server), which black-holes the link
//! (accepts and reads, answers nothing, no RST), resets it mid-request, or half-closes it. A
//! Redis Cluster's nodes announce their proxies' ports (`cluster-announce-port`), since its
//! clients learn every node's address from the cluster itself.
//!
//! What a runtime owes its callers there:
//! - while its engine is black-holed, each call fails within the runtime's request timeout
//!   (plus slack for a loaded machine), never hangs;
//! - a lock held through the black hole is reported lost within its lease (plus slack);
//! - once the link heals (a black-holed connection stays silent for good, like a dropped NAT
//!   entry: only a new connection is served), acquisitions succeed again within two request
//!   timeouts: a connection whose requests time out must be closed and replaced;
//! - after a reset or a half-close, the next requests are served over a new connection.
//!
//! On Redis (one server, and Redlock over three) and etcd, the "serves again" tests failed
//! while the runtime kept a connection that stayed open and silent; it now closes one that
//! has answered nothing for a request timeout while requests wait. Memory under a black hole is
//! `network_memory.rs` (a process of its own, since it reads the process's RSS).

use std::time::{Duration, Instant};

use dlock_runtime::{LockError, LockGuard, RuntimeBuilder};
use dlock_testkit::FaultProxy;
use dlock_tests::cluster::RedisCluster;
use dlock_tests::etcd::EtcdServer;
use dlock_tests::zookeeper::ZooKeeperServer;
use dlock_tests::{BuildExt, RedisServer, Runtime};

/// The runtime's request timeout in these tests (Redlock: its node timeout as well).
const TIMEOUT: Duration = Duration::from_secs(1);

/// Slack on every bound for a loaded machine (2 cores shared with builds).
const SLACK: Duration = Duration::from_millis(1500);

/// A runtime whose every connection to its engine goes through `proxies`, and the servers
/// behind them.
struct Linked {
    rt: Runtime,
    proxies: Vec<FaultProxy>,
    /// The faults of the suite go to the first this many proxies (Redlock: a majority).
    faulted: usize,
    /// Kept alive for the test; dropped (killed) last.
    _servers: Servers,
}

#[allow(dead_code)] // Only held, to keep the servers running.
enum Servers {
    Redis(RedisServer),
    Cluster(RedisCluster),
    Redlock(Vec<RedisServer>),
    Etcd(EtcdServer),
    ZooKeeper(ZooKeeperServer),
}

/// Starts a server whose start blocks (waits for it to serve) off the async threads.
async fn started<S: Send + 'static>(start: fn() -> S) -> S {
    tokio::task::spawn_blocking(start)
        .await
        .expect("the server starts")
}

impl Linked {
    /// A runtime with [`TIMEOUT`] built by `engine` from the hosts of one proxy per port in
    /// `ports` (`127.0.0.1:<proxy port>`), all of them faulted.
    async fn through_proxies(
        servers: Servers,
        ports: &[u16],
        engine: impl FnOnce(RuntimeBuilder, Vec<String>) -> RuntimeBuilder,
    ) -> Linked {
        let proxies: Vec<FaultProxy> = ports.iter().map(|&p| FaultProxy::to_port(p)).collect();
        Linked::over(servers, proxies, engine).await
    }

    /// A runtime with [`TIMEOUT`] built by `engine` from the hosts of `proxies`, all of them
    /// faulted.
    async fn over(
        servers: Servers,
        proxies: Vec<FaultProxy>,
        engine: impl FnOnce(RuntimeBuilder, Vec<String>) -> RuntimeBuilder,
    ) -> Linked {
        let hosts = proxies.iter().map(FaultProxy::host).collect();
        let rt = engine(Runtime::builder(), hosts)
            .timeout(TIMEOUT)
            .built()
            .await;
        Linked {
            rt,
            faulted: proxies.len(),
            proxies,
            _servers: servers,
        }
    }

    /// One redis-server.
    async fn redis() -> Linked {
        let server = RedisServer::start();
        let port = server.port();
        Linked::through_proxies(Servers::Redis(server), &[port], |b, hosts| {
            b.redis(format!("redis://{}", hosts[0]))
        })
        .await
    }

    /// Redlock over three redis-servers, each through its own proxy; node timeout
    /// [`TIMEOUT`].
    async fn redlock() -> Linked {
        let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
        let ports: Vec<u16> = servers.iter().map(RedisServer::port).collect();
        Linked::through_proxies(Servers::Redlock(servers), &ports, |b, hosts| {
            b.redlock(hosts.iter().map(|h| format!("redis://{h}")))
                .node_timeout(TIMEOUT)
        })
        .await
    }

    /// One etcd member.
    async fn etcd() -> Linked {
        let etcd = started(EtcdServer::start).await;
        let port = etcd.port();
        Linked::through_proxies(Servers::Etcd(etcd), &[port], |b, hosts| {
            b.etcd([format!("http://{}", hosts[0])])
        })
        .await
    }

    /// A standalone ZooKeeper, with a session of [`ZK_SESSION`].
    async fn zookeeper() -> Linked {
        let zk = started(ZooKeeperServer::start).await;
        let port = zk.port();
        Linked::through_proxies(Servers::ZooKeeper(zk), &[port], |b, hosts| {
            b.zookeeper(hosts[0].clone()).session_timeout(ZK_SESSION)
        })
        .await
    }

    /// A Redis Cluster (three masters, three replicas), every node through its own proxy: the
    /// nodes announce the proxies' ports, so the runtime reaches every node through them
    /// (the cluster bus between nodes stays direct).
    async fn cluster() -> Linked {
        let cluster = tokio::task::spawn_blocking(RedisCluster::start)
            .await
            .expect("start the cluster");
        let ports: Vec<u16> = (0..cluster.len()).map(|i| cluster.port(i)).collect();
        let proxies: Vec<FaultProxy> = ports.iter().map(|&p| FaultProxy::to_port(p)).collect();
        let announced: Vec<u16> = proxies.iter().map(FaultProxy::port).collect();
        let cluster = tokio::task::spawn_blocking(move || {
            cluster.announce_ports(&announced);
            cluster
        })
        .await
        .expect("announce the proxies");
        Linked::over(Servers::Cluster(cluster), proxies, |b, hosts| {
            b.redis_cluster(hosts.iter().map(|h| format!("redis://{h}")))
        })
        .await
    }

    /// Redlock whose first two nodes of three take the faults: a majority.
    async fn redlock_majority() -> Linked {
        Linked {
            faulted: 2,
            ..Linked::redlock().await
        }
    }

    fn proxy(&self) -> &FaultProxy {
        &self.proxies[0]
    }

    /// The proxies the faults go to.
    fn faulted(&self) -> &[FaultProxy] {
        &self.proxies[..self.faulted]
    }

    /// Connections accepted so far by the faulted proxies.
    fn accepted(&self) -> u64 {
        self.faulted().iter().map(|p| p.stats().accepted).sum()
    }

    /// Takes and releases `key` at once: the link works.
    async fn works(&self, key: &str, when: &str) {
        let guard = attempt(&self.rt, key)
            .await
            .unwrap_or_else(|e| panic!("{when}: acquire {key:?}: {e:?}"));
        guard
            .release()
            .await
            .unwrap_or_else(|e| panic!("{when}: release {key:?}: {e:?}"));
    }
}

impl Linked {
    /// Black-holes every link after a working acquisition: each call then fails within the
    /// request timeout.
    async fn fails_fast_in_a_black_hole(&self, name: &str) {
        self.works(&format!("{name}:before"), "before the black hole")
            .await;
        for proxy in self.faulted() {
            proxy.blackhole();
        }
        assert_each_fails_within(&self.rt, name, 3, TIMEOUT + SLACK).await;
    }

    /// Holds `key` for `lease` and black-holes every link: the guard must be reported lost
    /// within `bound` of the black hole.
    async fn loses_a_lock_in_a_black_hole(&self, key: &str, lease: Duration, bound: Duration) {
        let guard = self
            .rt
            .lock(key)
            .lease(lease)
            .acquire()
            .await
            .expect("acquire");
        for proxy in self.faulted() {
            proxy.blackhole();
        }
        assert_lost_within(&guard, Instant::now(), bound).await;
    }

    /// Resets every connection after a working acquisition: acquisitions are served again
    /// within two request timeouts, over a new connection.
    async fn survives_a_reset(&self, name: &str) {
        self.works(&format!("{name}:before"), "before the reset")
            .await;
        let accepted = self.accepted();
        for proxy in self.faulted() {
            proxy.reset();
        }
        let reset = Instant::now();
        assert_serves_again_within(&self.rt, &format!("{name}:after"), reset, 2 * TIMEOUT).await;
        assert!(
            self.accepted() > accepted,
            "served again without a new connection?"
        );
    }
}

/// ZooKeeper's session timeout in these tests (the lease of a ZooKeeper lock is its session).
const ZK_SESSION: Duration = Duration::from_secs(2);

/// One acquisition of `key` without waiting.
async fn attempt(rt: &Runtime, key: &str) -> Result<LockGuard, LockError> {
    rt.lock(key).wait(Duration::ZERO).acquire().await
}

/// `attempts` acquisitions of fresh keys: each must fail with `Backend` within `bound`
/// (never hang, never succeed).
async fn assert_each_fails_within(rt: &Runtime, prefix: &str, attempts: usize, bound: Duration) {
    for i in 0..attempts {
        let key = format!("{prefix}:{i}");
        let start = Instant::now();
        let out = tokio::time::timeout(bound + Duration::from_secs(30), attempt(rt, &key)).await;
        let took = start.elapsed();
        let err = match out {
            Err(_) => panic!("attempt {i} on {key:?} hung for {took:?}"),
            Ok(Ok(_)) => panic!("attempt {i} on {key:?} acquired through a black hole"),
            Ok(Err(e)) => e,
        };
        println!("attempt {i}: {err} after {took:?}");
        assert!(
            err.is_backend(),
            "attempt {i}: expected Backend, got {err:?}"
        );
        assert!(
            took <= bound,
            "attempt {i} on {key:?} failed after {took:?}, expected within {bound:?}: {err}"
        );
    }
}

/// Tries `key` every 50 ms from `healed` on until an acquisition succeeds; panics (with every
/// error seen) unless one does within `within` of `healed`. Returns how long it took.
async fn assert_serves_again_within(
    rt: &Runtime,
    key: &str,
    healed: Instant,
    within: Duration,
) -> Duration {
    let mut errors = Vec::new();
    loop {
        let out = tokio::time::timeout(within + SLACK, attempt(rt, key)).await;
        match out {
            Ok(Ok(guard)) => {
                let took = healed.elapsed();
                println!("served again {took:?} after the heal, after {errors:?}");
                let _ = guard.release().await;
                assert!(
                    took <= within,
                    "served again only {took:?} after the heal, expected within {within:?}; \
                     errors meanwhile: {errors:?}"
                );
                return took;
            }
            Ok(Err(e)) => errors.push(format!("{:.1?}: {e}", healed.elapsed())),
            Err(_) => errors.push(format!("{:.1?}: hung", healed.elapsed())),
        }
        assert!(
            healed.elapsed() <= within,
            "not served again within {within:?} of the heal ({} attempts failed): {errors:#?}",
            errors.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits for `guard` to be reported lost; panics unless that happens within `bound` of
/// `since`.
async fn assert_lost_within(guard: &LockGuard, since: Instant, bound: Duration) {
    let left = bound.saturating_sub(since.elapsed());
    if tokio::time::timeout(left, guard.lost()).await.is_err() {
        panic!(
            "the lock held through the black hole was not reported lost within {bound:?} \
             (valid for {:?} by the runtime's count)",
            guard.valid_for()
        );
    }
    println!("reported lost {:?} after the black hole", since.elapsed());
}

/// The black hole lasts this long before the heal in the recovery tests: several request
/// timeouts, so that requests time out on the connection before it heals.
const BLACK_HOLE: Duration = Duration::from_secs(3);

/// Black-holes every proxy of `linked` (after a working acquisition, holding a lock), heals
/// after [`BLACK_HOLE`], and asserts acquisitions succeed within two request timeouts of the
/// heal.
async fn black_hole_then_heal(linked: &Linked, name: &str) {
    linked
        .works(&format!("{name}:before"), "before the black hole")
        .await;
    let held = linked
        .rt
        .lock(format!("{name}:held"))
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .expect("hold a lock before the black hole");
    let start = Instant::now();
    for proxy in linked.faulted() {
        proxy.blackhole();
    }
    tokio::time::sleep(BLACK_HOLE.saturating_sub(start.elapsed())).await;
    for proxy in linked.faulted() {
        proxy.heal();
    }
    let healed = Instant::now();
    assert_serves_again_within(&linked.rt, &format!("{name}:after"), healed, 2 * TIMEOUT).await;
    drop(held);
}

/// The black-hole suite on one engine, as a module named after it: calls fail within the
/// timeout, acquisitions succeed again within two timeouts of the heal, a held lock is
/// reported lost within `lost: (lease, bound)`, and a reset of every connection is survived.
macro_rules! black_hole_suite {
    ($engine:ident, $linked:expr, lost: ($lease:expr, $bound:expr)) => {
        mod $engine {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn calls_in_a_black_hole_fail_within_the_request_timeout() {
                $linked.await.fails_fast_in_a_black_hole("bh:fail").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn serves_again_within_two_request_timeouts_after_a_black_hole_heals() {
                black_hole_then_heal(&$linked.await, "bh:heal").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn lock_held_through_a_black_hole_is_reported_lost_within_its_lease() {
                let linked = $linked.await;
                linked
                    .loses_a_lock_in_a_black_hole("bh:lost", $lease, $bound)
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn reset_of_every_connection_is_survived_over_a_new_one() {
                $linked.await.survives_a_reset("reset").await;
            }
        }
    };
}

/// The lease of the locks held through a black hole (etcd's shared lease and ZooKeeper's
/// session set their own bound).
const LEASE: Duration = Duration::from_secs(3);

black_hole_suite!(redis, Linked::redis(), lost: (LEASE, LEASE + SLACK));
// Every node's link black-holed at once (the cluster bus stays up: no failover).
black_hole_suite!(cluster, Linked::cluster(), lost: (LEASE, LEASE + SLACK));
// A majority of nodes silent: no renewal reaches a quorum.
black_hole_suite!(redlock_majority, Linked::redlock_majority(), lost: (LEASE, LEASE + SLACK));
// A renewed lock lives on the runtime's shared lease: TTL max(4 timeouts, 5 s).
black_hole_suite!(etcd, Linked::etcd(), lost: (LEASE, Duration::from_secs(5) + SLACK));
// A lock lives as long as the session.
black_hole_suite!(zookeeper, Linked::zookeeper(), lost: (LEASE, ZK_SESSION + SLACK));

// ---- Redis, one server: a reset mid-request, a half-close ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_reset_mid_request_fails_it_and_the_next_request_reconnects() {
    let linked = Linked::redis().await;
    linked.works("reset:before", "before the reset").await;
    let accepted = linked.accepted();
    // Replies take 400 ms: the reset comes while the request is in flight.
    linked.proxy().set_latency(
        dlock_testkit::net::Direction::ToClient,
        Duration::from_millis(400),
        Duration::ZERO,
    );
    let rt = linked.rt.clone();
    let start = Instant::now();
    let in_flight = tokio::spawn(async move { attempt(&rt, "reset:in-flight").await.map(drop) });
    tokio::time::sleep(Duration::from_millis(150)).await;
    linked.proxy().reset();
    linked.proxy().heal();
    let out = in_flight.await.unwrap();
    println!("the request in flight: {out:?} after {:?}", start.elapsed());
    if let Err(e) = &out {
        assert!(e.is_backend(), "{e:?}");
    }
    assert!(start.elapsed() <= TIMEOUT + SLACK);
    let healed = Instant::now();
    assert_serves_again_within(&linked.rt, "reset:after", healed, 2 * TIMEOUT).await;
    assert!(
        linked.accepted() > accepted,
        "served again without a new connection?"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_half_close_is_noticed_and_the_next_request_reconnects() {
    let linked = Linked::redis().await;
    linked.works("half:before", "before the half-close").await;
    let accepted = linked.accepted();
    linked.proxy().half_close();
    let closed = Instant::now();
    assert_serves_again_within(&linked.rt, "half:after", closed, 2 * TIMEOUT).await;
    assert!(linked.accepted() > accepted);
}

// ---- Redlock over three servers, one of them silent ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_with_a_minority_black_holed_still_acquires_without_a_fence() {
    let linked = Linked::redlock().await;
    linked
        .works("rl:minority:before", "before the black hole")
        .await;
    linked.proxies[0].blackhole();
    for i in 0..3 {
        let key = format!("rl:minority:{i}");
        let start = Instant::now();
        let guard = attempt(&linked.rt, &key)
            .await
            .unwrap_or_else(|e| panic!("acquire {key:?} with one node of three silent: {e:?}"));
        let took = start.elapsed();
        println!("{key}: acquired in {took:?}");
        assert_eq!(guard.fence(), None, "Redlock gives no fence");
        assert!(
            took <= TIMEOUT + SLACK,
            "{key}: took {took:?}, the silent node's vote is bounded by the node timeout"
        );
        guard.release().await.expect("release");
    }
}
