//! Asking a [`RedisCluster`] what it looks like: failover, slot owners, keys placed on chosen
//! masters or in one slot, and per-node queries.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use dlock_runtime::testing::hash_slot;
use redis::cluster_async::ClusterConnection;

use super::nodes::info_field;
use super::{ADMIN_TIMEOUT, NodeView, RedisCluster, parse_cluster_nodes};
use crate::redis::{connect, connect_cluster, lock_key, script_calls_in};

/// Bound on a failover after a master is killed or paused.
const FAILOVER_WITHIN: Duration = Duration::from_secs(20);

/// The outcome of [`RedisCluster::wait_for_failover`].
#[derive(Debug, Clone, Copy)]
pub struct Failover {
    /// Index of the node now serving the old master's slots.
    pub new_master: usize,
    /// From the kill/pause of the old master until every live node reported `cluster_state:ok`
    /// with the slots on the new master.
    pub took: Duration,
}

impl RedisCluster {
    /// Waits until a replica has taken over the slots that node `old` served when it was
    /// killed or paused: every live node sees them on one other, live, healthy master and says
    /// `cluster_state:ok`. Panics after 20 s with what the nodes reported.
    pub async fn wait_for_failover(&self, old: usize) -> Failover {
        let (stopped_at, slots) = self.nodes[old]
            .stopped
            .clone()
            .unwrap_or_else(|| panic!("node {old} was not killed or paused"));
        assert!(
            !slots.is_empty(),
            "node {old} served no slots when it was stopped: it was not a master"
        );
        let deadline = Instant::now() + FAILOVER_WITHIN;
        loop {
            let why = match self.failed_over(old, &slots).await {
                Ok(new_master) => {
                    return Failover {
                        new_master,
                        took: stopped_at.elapsed(),
                    };
                }
                Err(why) => why,
            };
            assert!(
                Instant::now() < deadline,
                "no failover of node {old} within {FAILOVER_WITHIN:?}: {why}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn failed_over(&self, old: usize, slots: &[(u16, u16)]) -> Result<usize, String> {
        let mut agreed: Option<usize> = None;
        for i in self.live() {
            let info: String = self
                .node_query(i, redis::cmd("CLUSTER").arg("INFO"))
                .await
                .map_err(|e| format!("CLUSTER INFO on node {i}: {e}"))?;
            if info_field(&info, "cluster_state") != Some("ok") {
                return Err(format!("node {i} says cluster_state is not ok"));
            }
            let text: String = self
                .node_query(i, redis::cmd("CLUSTER").arg("NODES"))
                .await
                .map_err(|e| format!("CLUSTER NODES on node {i}: {e}"))?;
            let views = parse_cluster_nodes(&text);
            for &(lo, hi) in slots {
                for slot in [lo, hi] {
                    let owner = views
                        .iter()
                        .find(|v| v.is_healthy_master() && v.serves(slot))
                        .ok_or_else(|| format!("node {i} sees no healthy master of slot {slot}"))?;
                    let index = self
                        .index_of(&owner.id)
                        .ok_or_else(|| format!("node {i}: unknown master {}", owner.id))?;
                    if index == old || !self.is_live(index) {
                        return Err(format!("node {i} sees slot {slot} on node {index}"));
                    }
                    if agreed.is_some_and(|a| a != index) {
                        return Err(format!("nodes disagree on the master of slot {slot}"));
                    }
                    agreed = Some(index);
                }
            }
        }
        agreed.ok_or_else(|| "no live node".to_owned())
    }

    /// Waits until every live node says `cluster_state:ok`; panics after `within`.
    pub async fn wait_ok(&self, within: Duration) {
        let start = Instant::now();
        loop {
            let mut all_ok = true;
            for i in self.live() {
                let info: Result<String, _> =
                    self.node_query(i, redis::cmd("CLUSTER").arg("INFO")).await;
                if !matches!(&info, Ok(info) if info_field(info, "cluster_state") == Some("ok")) {
                    all_ok = false;
                }
            }
            if all_ok {
                return;
            }
            assert!(
                start.elapsed() < within,
                "cluster_state not ok on every live node within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `CLUSTER KEYSLOT key`, asked of a live node.
    pub async fn keyslot(&self, key: &str) -> u16 {
        let i = self.any_live();
        self.node_query(i, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
            .await
            .unwrap_or_else(|e| panic!("CLUSTER KEYSLOT {key:?} on node {i}: {e}"))
    }

    /// `CLUSTER NODES` of node `i`, parsed.
    pub async fn nodes_view(&self, i: usize) -> Vec<NodeView> {
        let text: String = self
            .node_query(i, redis::cmd("CLUSTER").arg("NODES"))
            .await
            .unwrap_or_else(|e| panic!("CLUSTER NODES on node {i}: {e}"));
        parse_cluster_nodes(&text)
    }

    /// The index of the node serving `slot`, as a live node sees it now (a healthy master).
    pub async fn master_for_slot(&self, slot: u16) -> usize {
        let observer = self.any_live();
        let views = self.nodes_view(observer).await;
        let owner = views
            .iter()
            .find(|v| v.is_healthy_master() && v.serves(slot))
            .unwrap_or_else(|| panic!("node {observer} sees no healthy master of slot {slot}"));
        self.index_of(&owner.id)
            .unwrap_or_else(|| panic!("unknown node {} serves slot {slot}", owner.id))
    }

    /// The index of the master serving the Redis key `key` (pass the full Redis key, e.g.
    /// `lock_key("k")`; the hash tag decides the slot).
    pub async fn master_for_key(&self, key: &str) -> usize {
        let slot = self.keyslot(key).await;
        self.master_for_slot(slot).await
    }

    /// For every current master, one lock key `<prefix>:<n>` whose lock hash
    /// `dlock:{<prefix>:<n>}` that master serves, with the master's index; ordered by master
    /// index. Slots are the library's own hash slots, each chosen key checked with
    /// `CLUSTER KEYSLOT`.
    pub async fn one_key_per_master(&self, prefix: &str) -> Vec<(String, usize)> {
        let views = self.nodes_view(self.any_live()).await;
        let masters: Vec<usize> = views
            .iter()
            .filter(|v| v.is_healthy_master() && !v.slots.is_empty())
            .filter_map(|v| self.index_of(&v.id))
            .collect();
        let mut found: Vec<(String, usize)> = Vec::new();
        for master in masters {
            let key = self.key_on_master(prefix, master).await;
            found.push((key, master));
        }
        found.sort_by_key(|(_, m)| *m);
        found
    }

    /// One lock key `<prefix>:<n>` whose lock hash master `master` serves now (see
    /// [`keys_on_master`](Self::keys_on_master)).
    pub async fn key_on_master(&self, prefix: &str, master: usize) -> String {
        self.keys_on_master(prefix, master, 1).await.remove(0)
    }

    /// `count` lock keys `<prefix>:<n>` whose lock hashes (`dlock:{<prefix>:<n>}`) master
    /// `master` serves now, each in a different hash slot; checked with `CLUSTER KEYSLOT`.
    pub async fn keys_on_master(&self, prefix: &str, master: usize, count: usize) -> Vec<String> {
        let views = self.nodes_view(self.any_live()).await;
        let served = views
            .iter()
            .find(|v| v.id == self.nodes[master].id && v.is_healthy_master())
            .cloned()
            .unwrap_or_else(|| panic!("node {master} is not a healthy master"));
        let mut keys: Vec<(String, u16)> = Vec::new();
        for n in 0..100_000 {
            if keys.len() == count {
                break;
            }
            let key = format!("{prefix}:{n}");
            let slot = lock_slot(&key);
            if served.serves(slot) && !keys.iter().any(|(_, s)| *s == slot) {
                keys.push((key, slot));
            }
        }
        assert_eq!(keys.len(), count, "too few keys found on node {master}");
        for (key, slot) in &keys {
            self.check_slot(key, *slot).await;
        }
        keys.into_iter().map(|(k, _)| k).collect()
    }

    /// `count` different lock keys `<prefix>:<n>` whose lock hashes share one hash slot (the
    /// runtime renews such locks with one script call), with that slot; checked with
    /// `CLUSTER KEYSLOT`.
    pub async fn keys_in_one_slot(&self, prefix: &str, count: usize) -> (Vec<String>, u16) {
        assert!(count >= 1);
        let mut by_slot: HashMap<u16, Vec<String>> = HashMap::new();
        for n in 0..10_000_000u64 {
            let key = format!("{prefix}:{n}");
            let slot = lock_slot(&key);
            let keys = by_slot.entry(slot).or_default();
            keys.push(key);
            if keys.len() == count {
                let keys = keys.clone();
                for k in &keys {
                    self.check_slot(k, slot).await;
                }
                return (keys, slot);
            }
        }
        panic!("no {count} keys share a slot");
    }

    /// Asserts the server puts the lock hash of `key` in `slot`.
    async fn check_slot(&self, key: &str, slot: u16) {
        let server_slot = self.keyslot(&lock_key(key)).await;
        assert_eq!(server_slot, slot, "CLUSTER KEYSLOT disagrees for {key:?}");
    }

    /// The replicas of node `master`, as a live node sees them now.
    pub async fn replicas_of(&self, master: usize) -> Vec<usize> {
        let views = self.nodes_view(self.any_live()).await;
        views
            .iter()
            .filter(|v| v.master_id.as_deref() == Some(self.nodes[master].id.as_str()))
            .filter_map(|v| self.index_of(&v.id))
            .collect()
    }

    /// How many scripts node `i` has run (`EVALSHA`, `EVAL` and their variants in
    /// `INFO commandstats`).
    pub async fn script_calls_on(&self, i: usize) -> u64 {
        let info: String = self
            .node_query(i, redis::cmd("INFO").arg("commandstats"))
            .await
            .unwrap_or_else(|e| panic!("INFO commandstats on node {i}: {e}"));
        script_calls_in(&info)
    }

    /// A raw slot-routed connection (the redis crate's async cluster client) through the live
    /// nodes, with generous timeouts: for inspecting lock keys behind the runtime's back.
    pub async fn conn(&self) -> ClusterConnection {
        connect_cluster(&self.live_seeds())
            .await
            .unwrap_or_else(|e| panic!("connect to the test cluster: {e}"))
    }

    /// Runs one command on node `i` itself (no redirection: a key of another node's slots is a
    /// `MOVED` error). Bounded by a 2 s connect and response timeout.
    pub async fn node_query<T: redis::FromRedisValue>(
        &self,
        i: usize,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        let mut conn = connect(&self.node_url(i), ADMIN_TIMEOUT).await?;
        cmd.query_async(&mut conn).await
    }

    /// `PUBSUB SHARDNUMSUB channel` on node `i`: sharded subscribers of the channel there.
    pub async fn shard_subscribers(&self, i: usize, channel: &str) -> u64 {
        let reply: Vec<redis::Value> = self
            .node_query(i, redis::cmd("PUBSUB").arg("SHARDNUMSUB").arg(channel))
            .await
            .unwrap_or_else(|e| panic!("PUBSUB SHARDNUMSUB on node {i}: {e}"));
        match reply.get(1) {
            Some(redis::Value::Int(n)) => u64::try_from(*n).unwrap_or(0),
            other => panic!("unexpected PUBSUB SHARDNUMSUB reply: {other:?}"),
        }
    }

    /// Whether node `i` itself has `key` (`READONLY` first, so a replica answers too).
    pub async fn exists_on(&self, i: usize, key: &str) -> bool {
        let mut conn = connect(&self.node_url(i), ADMIN_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("connect to node {i}: {e}"));
        let (n,): (u64,) = redis::pipe()
            .cmd("READONLY")
            .ignore()
            .cmd("EXISTS")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("EXISTS {key:?} on node {i}: {e}"));
        n == 1
    }
}

/// The hash slot of the lock hash of `key`, by the library's own rule.
fn lock_slot(key: &str) -> u16 {
    hash_slot(lock_key(key).as_bytes())
}
