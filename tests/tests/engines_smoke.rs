//! Smoke tests of the etcd and ZooKeeper harnesses ([`EtcdServer`], [`EtcdCluster`],
//! [`ZooKeeperServer`]): each server starts on free loopback ports, is ready when the harness
//! says so, answers one real request through its own wire protocol without a client crate
//! (etcd's JSON gateway, ZooKeeper's four-letter words), and survives the faults the lock tests
//! will use (kill -9 and restart, SIGSTOP/SIGCONT, a killed etcd leader replaced by the others).

use std::time::{Duration, Instant};

use dlock_tests::etcd::{EtcdCluster, EtcdServer, base64_encode};
use dlock_tests::zookeeper::{MAX_SESSION_TIMEOUT, MIN_SESSION_TIMEOUT, ZooKeeperServer};

/// How long the two survivors of a 3-member etcd cluster may take to agree on a new leader.
const REELECTION_WITHIN: Duration = Duration::from_secs(5);

#[test]
fn etcd_single_member_serves_kv_through_the_json_gateway() {
    let started = Instant::now();
    let mut etcd = EtcdServer::start();
    println!("etcd (1 member) ready in {:?}", started.elapsed());

    let port = etcd.port();
    assert!(![2379, 2380].contains(&port), "default port {port} used");
    assert_eq!(etcd.endpoint(), format!("http://127.0.0.1:{port}"));
    assert_eq!(etcd.endpoints(), vec![etcd.endpoint()]);
    assert_eq!(etcd.url(), format!("etcd://127.0.0.1:{port}"));
    assert!(etcd.is_healthy());

    // Raw gateway calls with base64 literals ("smoke/key" = c21va2Uva2V5, "hello" = aGVsbG8=),
    // independent of the harness's own base64.
    let put = etcd.post("/v3/kv/put", r#"{"key":"c21va2Uva2V5","value":"aGVsbG8="}"#);
    assert!(put.contains(r#""revision":"#), "put reply: {put}");
    let range = etcd.post("/v3/kv/range", r#"{"key":"c21va2Uva2V5"}"#);
    assert!(
        range.contains(r#""value":"aGVsbG8=""#) && range.contains(r#""count":"1""#),
        "range reply: {range}"
    );
    assert_eq!(base64_encode(b"smoke/key"), "c21va2Uva2V5");

    // The typed helpers.
    let kv = etcd.get("smoke/key").expect("the key just written");
    assert_eq!(kv.key, "smoke/key");
    assert_eq!(kv.value, b"hello");
    assert!(kv.create_revision > 1 && kv.create_revision == kv.mod_revision);
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

    // A lease through the gateway, attached to a key.
    let grant = etcd.post("/v3/lease/grant", r#"{"TTL":"30"}"#);
    let id: i64 = grant
        .split(r#""ID":""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("lease id in {grant}"));
    let ttl = etcd.lease_ttl(id).expect("a live lease");
    assert!((25..=30).contains(&ttl), "ttl {ttl}");
    etcd.post(
        "/v3/kv/put",
        &format!(
            r#"{{"key":"{}","value":"","lease":"{id}"}}"#,
            base64_encode(b"smoke/leased")
        ),
    );
    assert_eq!(etcd.get("smoke/leased").map(|kv| kv.lease), Some(id));
    assert_eq!(etcd.lease_ttl(12345), None);

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
    assert_eq!(
        etcd.get("smoke/key").map(|kv| kv.value),
        Some(b"hello".to_vec())
    );
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
        assert!(cluster.is_healthy(i), "member {i} not healthy");
        for port in [cluster.client_port(i), cluster.peer_port(i)] {
            assert!(![2379, 2380].contains(&port), "default port {port} used");
        }
    }

    let leader = cluster.wait_for_leader(Duration::from_secs(5));
    assert_eq!(cluster.leader_index(), Some(leader));
    let old_leader_id = cluster.status(leader).expect("leader status").member_id;
    cluster.put("smoke/cluster", "before");

    cluster.kill9(leader);
    let killed = Instant::now();
    let new_leader = cluster.wait_for_leader(REELECTION_WITHIN);
    let took = killed.elapsed();
    println!("etcd leader {leader} killed; member {new_leader} leads after {took:?}");
    assert_ne!(new_leader, leader);
    let status = cluster.status(new_leader).expect("new leader status");
    assert_ne!(status.member_id, old_leader_id);
    assert!(status.raft_term >= 3, "term {}", status.raft_term);

    // The two survivors form a quorum: reads see the old write, writes commit.
    assert_eq!(
        cluster.get("smoke/cluster").map(|kv| kv.value),
        Some(b"before".to_vec())
    );
    cluster.put("smoke/cluster", "after");

    // The killed member rejoins and catches up.
    cluster.restart(leader);
    assert!(cluster.is_healthy(leader));
    let caught_up = Instant::now() + Duration::from_secs(5);
    let expected = cluster.status(new_leader).expect("status").revision;
    while cluster.status(leader).map(|s| s.revision) != Ok(expected) {
        assert!(
            Instant::now() < caught_up,
            "restarted member {leader} did not catch up to revision {expected}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(cluster.wait_for_leader(REELECTION_WITHIN), new_leader);

    // A paused follower: the others keep serving.
    let follower = (0..3).find(|&i| i != new_leader).expect("a follower");
    cluster.pause(follower);
    assert!(!cluster.is_healthy(follower));
    cluster.put("smoke/cluster", "paused follower");
    cluster.resume(follower);
    assert_eq!(cluster.wait_for_leader(REELECTION_WITHIN), new_leader);
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
