//! Smoke tests of the etcd and ZooKeeper harnesses ([`EtcdServer`], [`EtcdCluster`],
//! [`ZooKeeperServer`]): each server starts on free loopback ports, is ready when the harness
//! says so, answers real requests (etcd through `etcd-client`, ZooKeeper's four-letter words),
//! and survives the faults the lock tests use (kill -9 and restart, SIGSTOP/SIGCONT, a killed
//! etcd leader replaced by the others).

use std::time::{Duration, Instant};

use dlock_testkit::etcd::{EtcdCluster, EtcdKv, EtcdServer};
use dlock_testkit::zookeeper::{MAX_SESSION_TIMEOUT, MIN_SESSION_TIMEOUT, ZooKeeperServer};

/// How long the members of a 3-member etcd cluster may take to agree on a leader after a fault:
/// about 1–2 s on an idle box (1 s election timeout), much more on a loaded one. A bound, not
/// what the test is about.
const REELECTION_WITHIN: Duration = Duration::from_secs(20);

/// Waits until member `i` is healthy (it knows a leader and answers a linearizable read): an
/// election under way, which a loaded box can set off at any time, is not a failure.
fn wait_until_healthy(cluster: &EtcdCluster, i: usize) {
    let start = Instant::now();
    while !cluster.is_healthy(i) {
        assert!(
            start.elapsed() < REELECTION_WITHIN,
            "etcd member {i} not healthy within {REELECTION_WITHIN:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Asserts that `kv` (a key read back) holds `expected`.
#[track_caller]
fn assert_value(kv: Option<EtcdKv>, expected: &str) {
    assert_eq!(kv.map(|kv| kv.value), Some(expected.as_bytes().to_vec()));
}

#[test]
fn etcd_single_member_serves_kv_and_leases() {
    let started = Instant::now();
    let mut etcd = EtcdServer::start();
    println!("etcd (1 member) ready in {:?}", started.elapsed());

    let port = etcd.port();
    assert!(![2379, 2380].contains(&port), "default port {port} used");
    assert_eq!(etcd.endpoint(), format!("http://127.0.0.1:{port}"));
    assert_eq!(etcd.endpoints(), vec![etcd.endpoint()]);
    assert_eq!(etcd.url(), format!("etcd://127.0.0.1:{port}"));
    assert!(etcd.is_healthy());

    let put = etcd.put("smoke/key", "hello");
    let kv = etcd.get("smoke/key").expect("the key just written");
    assert_eq!(kv.key, "smoke/key");
    assert_eq!(kv.value, b"hello");
    assert!(kv.create_revision > 1 && kv.create_revision == kv.mod_revision);
    assert_eq!(kv.mod_revision, put);
    assert_eq!((kv.version, kv.lease), (1, 0));
    let rev = etcd.put("smoke/other", "x");
    assert!(rev > kv.mod_revision);
    let keys: Vec<String> = etcd
        .get_prefix("smoke/")
        .into_iter()
        .map(|kv| kv.key)
        .collect();
    assert_eq!(keys, ["smoke/key", "smoke/other"]);
    assert!(etcd.delete("smoke/other"));
    assert!(!etcd.delete("smoke/other"));
    assert_eq!(etcd.get("smoke/other"), None);

    // A lease, attached to a key.
    let id = etcd.lease_grant(30);
    let ttl = etcd.lease_ttl(id).expect("a live lease");
    assert!((25..=30).contains(&ttl), "ttl {ttl}");
    assert_eq!(etcd.lease_granted_ttl(id), Some(30));
    etcd.put_leased("smoke/leased", "", id);
    assert_eq!(etcd.get("smoke/leased").map(|kv| kv.lease), Some(id));
    assert_eq!(etcd.lease_ttl(12345), None);
    etcd.lease_revoke(id);
    assert_eq!(etcd.lease_ttl(id), None);
    assert_eq!(
        etcd.get("smoke/leased"),
        None,
        "revoking deletes the lease's keys"
    );

    // SIGSTOP: unanswered; SIGCONT: back.
    etcd.pause();
    assert!(!etcd.is_healthy());
    etcd.resume();
    assert!(etcd.is_healthy());

    // kill -9 and restart on the same port: the data is still there.
    let old_pid = etcd.pid();
    etcd.kill9();
    assert!(!etcd.is_healthy());
    let restarted = Instant::now();
    etcd.restart();
    println!("etcd (1 member) restarted in {:?}", restarted.elapsed());
    assert_ne!(etcd.pid(), old_pid);
    assert_eq!(etcd.port(), port);
    assert_value(etcd.get("smoke/key"), "hello");
}

#[test]
fn etcd_cluster_of_three_elects_a_new_leader_after_kill9() {
    let started = Instant::now();
    let mut cluster = EtcdCluster::start(3);
    println!("etcd (3 members) ready in {:?}", started.elapsed());

    let endpoints = cluster.endpoints();
    assert_eq!(endpoints.len(), 3);
    let hosts: Vec<&str> = endpoints
        .iter()
        .map(|e| e.strip_prefix("http://").expect("http endpoint"))
        .collect();
    assert_eq!(cluster.url(), format!("etcd://{}", hosts.join(",")));
    for i in 0..3 {
        wait_until_healthy(&cluster, i);
        for port in [cluster.client_port(i), cluster.peer_port(i)] {
            assert!(![2379, 2380].contains(&port), "default port {port} used");
        }
    }

    // The leader, and its term while it leads.
    let (leader, before) = loop {
        let leader = cluster.wait_for_leader(REELECTION_WITHIN);
        match cluster.status(leader) {
            Ok(status) if status.is_leader() => break (leader, status),
            _ => continue,
        }
    };
    cluster.put("smoke/cluster", "before");

    cluster.kill9(leader);
    let killed = Instant::now();
    let new_leader = cluster.wait_for_leader(REELECTION_WITHIN);
    let took = killed.elapsed();
    println!("etcd leader {leader} killed; member {new_leader} leads after {took:?}");
    // The behaviour, not the schedule: another member leads, in a later term than the killed
    // leader's (how many terms an election takes depends on the load, so no number is assumed).
    assert_ne!(new_leader, leader);
    let status = cluster.status(new_leader).expect("new leader status");
    assert_ne!(status.member_id, before.member_id);
    assert!(
        status.raft_term > before.raft_term,
        "new leader's term {} is not after the killed leader's term {}",
        status.raft_term,
        before.raft_term
    );

    // The two survivors form a quorum: reads see the old write, writes commit.
    assert_value(cluster.get("smoke/cluster"), "before");
    cluster.put("smoke/cluster", "after");

    // The killed member rejoins (ready: it knows a leader) and catches up. It may start an
    // election as it comes back, so which member leads afterwards is not asserted.
    cluster.restart(leader);
    cluster.wait_for_leader(REELECTION_WITHIN);
    let written = cluster.put("smoke/cluster", "rejoined");
    let caught_up = Instant::now() + REELECTION_WITHIN;
    while cluster.status(leader).map(|s| s.revision) != Ok(written) {
        assert!(
            Instant::now() < caught_up,
            "restarted member {leader} did not catch up to revision {written}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // A paused member does not answer, and the two others keep serving writes.
    let follower = (0..3)
        .find(|&i| i != cluster.wait_for_leader(REELECTION_WITHIN))
        .expect("a follower");
    cluster.pause(follower);
    assert!(!cluster.is_healthy(follower));
    cluster.wait_for_leader(REELECTION_WITHIN);
    cluster.put("smoke/cluster", "paused follower");
    cluster.resume(follower);
    wait_until_healthy(&cluster, follower);
    assert_value(cluster.get("smoke/cluster"), "paused follower");
}

#[test]
fn zookeeper_standalone_answers_four_letter_words() {
    let started = Instant::now();
    let mut zk = ZooKeeperServer::start();
    println!("zookeeper ready in {:?}", started.elapsed());

    let port = zk.port();
    assert_ne!(port, 2181, "default port used");
    assert_eq!(zk.connect_string(), format!("127.0.0.1:{port}"));
    assert_eq!(zk.url(), format!("zk://127.0.0.1:{port}"));

    let srvr = zk.srvr();
    assert!(srvr.contains("Mode: standalone"), "srvr: {srvr}");
    assert!(srvr.contains("Zookeeper version: 3."), "srvr: {srvr}");
    let conf = zk.four_letter("conf").expect("conf");
    assert!(
        conf.contains(&format!(
            "minSessionTimeout={}",
            MIN_SESSION_TIMEOUT.as_millis()
        )) && conf.contains(&format!(
            "maxSessionTimeout={}",
            MAX_SESSION_TIMEOUT.as_millis()
        )),
        "conf: {conf}"
    );
    assert_eq!(zk.four_letter("ruok").expect("ruok"), "imok");

    // SIGSTOP: no answer; SIGCONT: back.
    zk.pause();
    assert!(zk.four_letter("srvr").is_err());
    zk.resume();
    assert!(zk.srvr().contains("Mode: standalone"));

    // kill -9 and restart on the same port.
    let old_pid = zk.pid();
    zk.kill9();
    assert!(zk.four_letter("srvr").is_err());
    let restarted = Instant::now();
    zk.restart();
    println!("zookeeper restarted in {:?}", restarted.elapsed());
    assert_ne!(zk.pid(), old_pid);
    assert_eq!(zk.port(), port);
    assert!(zk.srvr().contains("Mode: standalone"));
}
