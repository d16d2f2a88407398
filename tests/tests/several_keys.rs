//! Multi-key locks on the Redis engines, where one script takes every key of a set at once:
//! on one server whatever the keys, on a Cluster when the keys' names share a hash slot (else
//! key by key, in the conformance suite's sets).
//!
//! The behaviour on every engine (no deadlock, all or nothing, one guard, loss, re-entry) is
//! in the conformance suite (`tests/conformance/multi.rs`).

use dlock_runtime::DEFAULT_PREFIX;
use dlock_runtime::testing::redis_names;
use dlock_tests::cluster::RedisCluster;
use dlock_tests::{
    AcquireExt, HoldExt, LONG_LEASE, RedisServer, Runtime, assert_busy, assert_free, lock_key,
};

/// On one server, acquiring a set of three free keys is one script call (no `SET` of the
/// one-key path), and each key gets a fence from its own counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_script_takes_every_key_on_one_server() {
    let server = RedisServer::start();
    let rt = Runtime::from_url(&server.url()).await.expect("runtime");
    let keys = ["set:a", "set:b", "set:c"];
    // Warm: the script is loaded on first use.
    rt.lock_all(keys)
        .held("warm")
        .await
        .release()
        .await
        .expect("release");
    let before = server.command_stats().await;
    let guard = rt.lock_all(keys).lease(LONG_LEASE).held("the set").await;
    let after = server.command_stats().await;
    let delta =
        |name: &str| after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0);
    assert_eq!(delta("evalsha"), 1, "one script call: {after:?}");
    assert_eq!(delta("incrby"), 3, "one fence counter bumped per key");
    assert_eq!(
        delta("get"),
        3,
        "each lock looked at once, inside the script"
    );
    for key in keys {
        let [lock, _, _, _] = redis_names(DEFAULT_PREFIX, key);
        assert!(server.exists(&lock).await, "{lock} written");
    }
    assert!(guard.fences().iter().all(Option::is_some));
    guard.release().await.expect("release");
}

/// Two keys whose names share a hash slot are taken by one script on a Cluster (one script
/// call on their master; key by key would be two plain pipelines): the set holds both, and
/// with one of them busy it takes neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keys_sharing_a_slot_are_taken_at_once_all_or_nothing() {
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let (rt, other) = (
        Runtime::from_url(&url).await.expect("runtime"),
        Runtime::from_url(&url).await.expect("runtime"),
    );
    let (found, _) = cluster.keys_in_one_slot("slot", 2).await;
    let (first, twin) = (found[0].clone(), found[1].clone());
    let master = cluster.master_for_key(&lock_key(&first)).await;
    let keys = [first.as_str(), twin.as_str()];

    // Warm: the script is loaded on first use.
    let warm = rt.lock_all(keys).held("warm").await;
    warm.release().await.expect("release");
    let before = cluster.script_calls_on(master).await;
    let both = rt
        .lock_all(keys)
        .lease(LONG_LEASE)
        .held("both, one slot")
        .await;
    let scripts = cluster.script_calls_on(master).await - before;
    assert_eq!(scripts, 1, "one script took both keys");
    assert_eq!(both.fences().len(), 2);
    for key in keys {
        assert_busy(&other, key, "held by the set").await;
    }
    both.release().await.expect("release");

    let busy = other.hold(&twin, LONG_LEASE).await;
    let err = rt
        .lock_all(keys)
        .lease(LONG_LEASE)
        .refused("a set with a busy key")
        .await;
    assert!(err.is_timeout(), "{err:?}");
    assert_free(&other, &first, "the free key was not taken").await;
    busy.release().await.expect("release");
}
