//! Redis Cluster harness: [`RedisCluster::start`] forms a cluster of three masters and three
//! replicas (one per master) from six `redis-server` processes on free loopback ports, each in
//! its own temp dir, without persistence, with `cluster-node-timeout` of
//! [`NODE_TIMEOUT_MS`] so that a failover takes a few seconds. Every node is killed (SIGKILL,
//! by PID) when the handle drops; if the test is failing then, every node's log is printed.
//!
//! The cluster is formed by hand (`CLUSTER ADDSLOTSRANGE`, `CLUSTER MEET`, `CLUSTER
//! REPLICATE`), so only `redis-server` (7.0 or newer: sharded pub/sub, `cluster-port`) is
//! needed, and node `i < 3` starts as the master of slot range `i` with node `i + 3` as its
//! replica. Roles change with faults: ask the cluster ([`RedisCluster::master_for_key`]).
//!
//! Faults: [`kill9`](RedisCluster::kill9), [`pause`](RedisCluster::pause) /
//! [`resume`](RedisCluster::resume), then [`wait_for_failover`](RedisCluster::wait_for_failover).
//! Inspection: a raw slot-routed connection ([`conn`](RedisCluster::conn), [`exists`],
//! [`pttl`], [`hget`], [`del`]) and direct per-node queries
//! ([`node_query`](RedisCluster::node_query), [`exists_on`](RedisCluster::exists_on)).
//!
//! [`exists`]: RedisCluster::exists
//! [`pttl`]: RedisCluster::pttl
//! [`hget`]: RedisCluster::hget
//! [`del`]: RedisCluster::del

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::cluster_async::ClusterConnection;

use crate::REDIS_SERVER_ENV;

/// `cluster-node-timeout` of every node, in milliseconds: a master that does not answer for
/// this long is flagged failing, and its replica is promoted about a second later.
pub const NODE_TIMEOUT_MS: u64 = 1000;

/// Number of masters (and of replicas: one per master).
pub const MASTERS: usize = 3;

/// Bound on forming the cluster (all slots served, every master with a synced replica).
const FORM_WITHIN: Duration = Duration::from_secs(30);

/// Bound on a failover after a master is killed or paused.
const FAILOVER_WITHIN: Duration = Duration::from_secs(20);

/// How long a freshly spawned node may take to answer.
const NODE_READY_WITHIN: Duration = Duration::from_secs(10);

/// Timeouts of the harness's own connections (the test box is noisy).
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Slot ranges of the three initial masters (what `redis-cli --cluster create` assigns).
const SLOT_RANGES: [(u16, u16); MASTERS] = [(0, 5460), (5461, 10922), (10923, 16383)];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Paused,
    Killed,
}

#[derive(Debug)]
struct Node {
    port: u16,
    bus_port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    state: State,
    /// `CLUSTER MYID`.
    id: String,
    /// Set by `kill9`/`pause`: when, and the slot ranges the node owned then.
    stopped: Option<(Instant, Vec<(u16, u16)>)>,
}

impl Node {
    fn log(&self) -> String {
        let mut out =
            std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
        let stderr =
            std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default();
        if !stderr.is_empty() {
            out.push_str("\n--- stderr ---\n");
            out.push_str(&stderr);
        }
        out
    }
}

/// One line of `CLUSTER NODES`: how one node sees another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// Node id.
    pub id: String,
    /// Client port.
    pub port: u16,
    /// Flags: `myself`, `master`, `slave`, `fail?`, `fail`, `handshake`, `noaddr`, ...
    pub flags: Vec<String>,
    /// The master's id, for a replica.
    pub master_id: Option<String>,
    /// Whether the cluster bus link is `connected`.
    pub connected: bool,
    /// Slot ranges served (inclusive).
    pub slots: Vec<(u16, u16)>,
}

impl NodeView {
    /// Whether the node has `flag`.
    pub fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    /// A master not flagged failing (`fail` or `fail?`).
    pub fn is_healthy_master(&self) -> bool {
        self.has("master") && !self.has("fail") && !self.has("fail?")
    }

    /// Whether the node serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(lo, hi)| lo <= slot && slot <= hi)
    }
}

/// Parses a `CLUSTER NODES` reply.
pub fn parse_cluster_nodes(text: &str) -> Vec<NodeView> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return None;
            }
            // `ip:port@cport[,hostname]`
            let port = fields[1]
                .split('@')
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()?;
            let slots = fields[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((lo, hi)) => Some((lo.parse().ok()?, hi.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect();
            Some(NodeView {
                id: fields[0].to_owned(),
                port,
                flags: fields[2].split(',').map(str::to_owned).collect(),
                master_id: (fields[3] != "-").then(|| fields[3].to_owned()),
                connected: fields[7] == "connected",
                slots,
            })
        })
        .collect()
}

/// The value of `field` in an `INFO`/`CLUSTER INFO` reply.
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.trim().strip_prefix(field)?.strip_prefix(':'))
}

/// The outcome of [`RedisCluster::wait_for_failover`].
#[derive(Debug, Clone, Copy)]
pub struct Failover {
    /// Index of the node now serving the old master's slots.
    pub new_master: usize,
    /// From the kill/pause of the old master until every live node reported `cluster_state:ok`
    /// with the slots on the new master.
    pub took: Duration,
}

/// A Redis Cluster of three masters and three replicas owned by one test.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Node>,
}

impl RedisCluster {
    /// Starts six nodes and forms the cluster; returns once every node says `cluster_state:ok`,
    /// knows all six nodes, and every master has a replica whose replication link is up.
    ///
    /// Panics (printing every node's log) if that takes longer than 30 s, and with
    /// installation advice when `redis-server` is missing or older than 7.0.
    pub fn start() -> RedisCluster {
        let started = Instant::now();
        let bin = redis_server_binary();
        let mut cluster = RedisCluster { nodes: Vec::new() };
        for _ in 0..2 * MASTERS {
            let node = spawn_node(&bin);
            cluster.nodes.push(node);
        }
        cluster.form();
        println!(
            "redis cluster ready in {:?}: masters {:?}, replicas {:?}",
            started.elapsed(),
            cluster.nodes[..MASTERS]
                .iter()
                .map(|n| n.port)
                .collect::<Vec<_>>(),
            cluster.nodes[MASTERS..]
                .iter()
                .map(|n| n.port)
                .collect::<Vec<_>>()
        );
        cluster
    }

    fn form(&mut self) {
        for i in 0..self.nodes.len() {
            let id: String = self
                .query_sync(i, redis::cmd("CLUSTER").arg("MYID"))
                .unwrap_or_else(|e| panic!("CLUSTER MYID on node {i}: {e}"));
            self.nodes[i].id = id;
        }
        for (i, (lo, hi)) in SLOT_RANGES.iter().enumerate() {
            let () = self
                .query_sync(
                    i,
                    redis::cmd("CLUSTER").arg("ADDSLOTSRANGE").arg(lo).arg(hi),
                )
                .unwrap_or_else(|e| panic!("CLUSTER ADDSLOTSRANGE on node {i}: {e}"));
            let () = self
                .query_sync(i, redis::cmd("CLUSTER").arg("SET-CONFIG-EPOCH").arg(i + 1))
                .unwrap_or_else(|e| panic!("CLUSTER SET-CONFIG-EPOCH on node {i}: {e}"));
        }
        for j in 1..self.nodes.len() {
            let () = self
                .query_sync(
                    0,
                    redis::cmd("CLUSTER")
                        .arg("MEET")
                        .arg("127.0.0.1")
                        .arg(self.nodes[j].port)
                        .arg(self.nodes[j].bus_port),
                )
                .unwrap_or_else(|e| panic!("CLUSTER MEET node {j} from node 0: {e}"));
        }
        let deadline = Instant::now() + FORM_WITHIN;
        let mut last = String::new();
        // Every node must know the others before a replica can name its master.
        while !self.everyone_knows_everyone(&mut last) {
            assert!(
                Instant::now() < deadline,
                "the cluster nodes did not meet within {FORM_WITHIN:?}: {last}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        for r in MASTERS..2 * MASTERS {
            let master = self.nodes[r - MASTERS].id.clone();
            loop {
                match self.query_sync::<()>(r, redis::cmd("CLUSTER").arg("REPLICATE").arg(&master))
                {
                    Ok(()) => break,
                    Err(e) => {
                        assert!(
                            Instant::now() < deadline,
                            "CLUSTER REPLICATE on node {r} kept failing: {e}"
                        );
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
        }
        while !self.formed(&mut last) {
            assert!(
                Instant::now() < deadline,
                "the cluster did not become healthy within {FORM_WITHIN:?}: {last}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn everyone_knows_everyone(&self, why: &mut String) -> bool {
        for i in 0..self.nodes.len() {
            let views = match self.query_sync::<String>(i, redis::cmd("CLUSTER").arg("NODES")) {
                Ok(text) => parse_cluster_nodes(&text),
                Err(e) => {
                    *why = format!("CLUSTER NODES on node {i}: {e}");
                    return false;
                }
            };
            let known = views
                .iter()
                .filter(|v| !v.has("handshake") && !v.has("noaddr"))
                .filter(|v| self.nodes.iter().any(|n| n.id == v.id))
                .count();
            if known < self.nodes.len() {
                *why = format!("node {i} knows {known} of {} nodes", self.nodes.len());
                return false;
            }
        }
        true
    }

    /// All slots served, all nodes known, each initial master with a connected replica whose
    /// replication link is up (a replica that never synced cannot be promoted).
    fn formed(&self, why: &mut String) -> bool {
        for i in 0..self.nodes.len() {
            let info = match self.query_sync::<String>(i, redis::cmd("CLUSTER").arg("INFO")) {
                Ok(info) => info,
                Err(e) => {
                    *why = format!("CLUSTER INFO on node {i}: {e}");
                    return false;
                }
            };
            if info_field(&info, "cluster_state") != Some("ok")
                || info_field(&info, "cluster_known_nodes") != Some("6")
                || info_field(&info, "cluster_slots_ok") != Some("16384")
            {
                *why = format!("node {i} CLUSTER INFO:\n{info}");
                return false;
            }
            let views = match self.query_sync::<String>(i, redis::cmd("CLUSTER").arg("NODES")) {
                Ok(text) => parse_cluster_nodes(&text),
                Err(e) => {
                    *why = format!("CLUSTER NODES on node {i}: {e}");
                    return false;
                }
            };
            for m in 0..MASTERS {
                let master = &self.nodes[m].id;
                let has_replica = views.iter().any(|v| {
                    (v.has("slave") || v.has("replica"))
                        && !v.has("fail")
                        && !v.has("fail?")
                        && v.master_id.as_ref() == Some(master)
                        && (v.connected || v.has("myself"))
                });
                if !has_replica {
                    *why = format!("node {i} sees no replica of master {m} yet");
                    return false;
                }
            }
        }
        for r in MASTERS..2 * MASTERS {
            match self.query_sync::<String>(r, redis::cmd("INFO").arg("replication")) {
                Ok(info) if info_field(&info, "master_link_status") == Some("up") => {}
                Ok(info) => {
                    *why = format!("replica {r} not synced:\n{info}");
                    return false;
                }
                Err(e) => {
                    *why = format!("INFO replication on node {r}: {e}");
                    return false;
                }
            }
        }
        true
    }

    /// Number of nodes (six).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always false: a cluster has six nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// `redis://127.0.0.1:<port>` of every node (killed ones included: the seeds a runtime
    /// was configured with do not change when a node dies).
    pub fn seeds(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect()
    }

    /// The seeds of the nodes that are running and not paused.
    pub fn live_seeds(&self) -> Vec<String> {
        self.live()
            .map(|i| format!("redis://127.0.0.1:{}", self.nodes[i].port))
            .collect()
    }

    /// `redis+cluster://127.0.0.1:<p1>,...,127.0.0.1:<p6>`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The client port of node `i`.
    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].port
    }

    /// The process id of node `i`; panics if it was killed.
    pub fn pid(&self, i: usize) -> u32 {
        self.nodes[i]
            .child
            .as_ref()
            .unwrap_or_else(|| panic!("node {i} is not running"))
            .id()
    }

    /// The cluster node id of node `i`.
    pub fn node_id(&self, i: usize) -> &str {
        &self.nodes[i].id
    }

    /// The index of the node with cluster id `id`.
    pub fn index_of(&self, id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }

    /// Whether node `i` runs and is not paused.
    pub fn is_live(&self, i: usize) -> bool {
        self.nodes[i].state == State::Running
    }

    fn live(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&i| self.is_live(i))
    }

    fn any_live(&self) -> usize {
        self.live().next().expect("every cluster node is down")
    }

    /// The log of node `i` so far.
    pub fn log(&self, i: usize) -> String {
        self.nodes[i].log()
    }

    /// Slot ranges node `i` serves, as a live node (other than `i`) sees it now.
    fn slots_of(&self, i: usize) -> Vec<(u16, u16)> {
        let observer = self
            .live()
            .find(|&j| j != i)
            .expect("another live node to observe the cluster");
        let text: String = self
            .query_sync(observer, redis::cmd("CLUSTER").arg("NODES"))
            .unwrap_or_else(|e| panic!("CLUSTER NODES on node {observer}: {e}"));
        parse_cluster_nodes(&text)
            .into_iter()
            .find(|v| v.id == self.nodes[i].id)
            .map(|v| v.slots)
            .unwrap_or_default()
    }

    /// Kills node `i` with SIGKILL (by PID) and reaps it. Remembers the slots it served, for
    /// [`wait_for_failover`](RedisCluster::wait_for_failover).
    pub fn kill9(&mut self, i: usize) {
        let slots = if self.is_live(i) {
            self.slots_of(i)
        } else {
            Vec::new()
        };
        let node = &mut self.nodes[i];
        if let Some(mut child) = node.child.take() {
            // SIGKILL also ends a stopped (SIGSTOP) process.
            let _ = child.kill();
            let _ = child.wait();
        }
        node.state = State::Killed;
        node.stopped = Some((Instant::now(), slots));
    }

    /// Freezes node `i` with SIGSTOP: its connections stay open, nothing is answered, and the
    /// cluster fails it over after the node timeout if it is a master.
    pub fn pause(&mut self, i: usize) {
        assert!(self.is_live(i), "node {i} is not running");
        let slots = self.slots_of(i);
        signal(self.pid(i), "STOP");
        let node = &mut self.nodes[i];
        node.state = State::Paused;
        node.stopped = Some((Instant::now(), slots));
    }

    /// Resumes node `i` after [`pause`](RedisCluster::pause) with SIGCONT. A master that was
    /// failed over meanwhile rejoins as a replica of the promoted node.
    pub fn resume(&mut self, i: usize) {
        assert_eq!(self.nodes[i].state, State::Paused, "node {i} is not paused");
        signal(self.pid(i), "CONT");
        self.nodes[i].state = State::Running;
    }

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
    /// index. Slots are computed locally and each chosen key is checked with `CLUSTER KEYSLOT`.
    pub async fn one_key_per_master(&self, prefix: &str) -> Vec<(String, usize)> {
        let observer = self.any_live();
        let views = self.nodes_view(observer).await;
        let masters: Vec<usize> = views
            .iter()
            .filter(|v| v.is_healthy_master() && !v.slots.is_empty())
            .filter_map(|v| self.index_of(&v.id))
            .collect();
        let mut found: Vec<(String, usize)> = Vec::new();
        for master in masters {
            let key = self.keys_on_master(prefix, master, 1).await.remove(0);
            found.push((key, master));
        }
        found.sort_by_key(|(_, m)| *m);
        found
    }

    /// `count` lock keys `<prefix>:<n>` whose lock hashes (`dlock:{<prefix>:<n>}`) master
    /// `master` serves now, each in a different hash slot; checked with `CLUSTER KEYSLOT`.
    pub async fn keys_on_master(&self, prefix: &str, master: usize, count: usize) -> Vec<String> {
        let views = self.nodes_view(self.any_live()).await;
        let served = views
            .iter()
            .find(|v| v.id == self.nodes[master].id && v.is_healthy_master())
            .map(|v| v.slots.clone())
            .unwrap_or_else(|| panic!("node {master} is not a healthy master"));
        let mut keys: Vec<(String, u16)> = Vec::new();
        for n in 0..100_000 {
            if keys.len() == count {
                break;
            }
            let key = format!("{prefix}:{n}");
            let slot = key_slot(crate::lock_key(&key).as_bytes());
            if served.iter().any(|&(lo, hi)| lo <= slot && slot <= hi)
                && !keys.iter().any(|(_, s)| *s == slot)
            {
                keys.push((key, slot));
            }
        }
        assert_eq!(keys.len(), count, "too few keys found on node {master}");
        for (key, slot) in &keys {
            let server_slot = self.keyslot(&crate::lock_key(key)).await;
            assert_eq!(server_slot, *slot, "CLUSTER KEYSLOT disagrees for {key:?}");
        }
        keys.into_iter().map(|(k, _)| k).collect()
    }

    /// `count` different lock keys `<prefix>:<n>` whose lock hashes share one hash slot (the
    /// runtime renews such locks with one script call), with that slot; checked with
    /// `CLUSTER KEYSLOT`.
    pub async fn keys_in_one_slot(&self, prefix: &str, count: usize) -> (Vec<String>, u16) {
        assert!(count >= 1);
        let mut by_slot: std::collections::HashMap<u16, Vec<String>> =
            std::collections::HashMap::new();
        for n in 0..10_000_000u64 {
            let key = format!("{prefix}:{n}");
            let slot = key_slot(crate::lock_key(&key).as_bytes());
            let keys = by_slot.entry(slot).or_default();
            keys.push(key);
            if keys.len() == count {
                let keys = keys.clone();
                for k in &keys {
                    let server_slot = self.keyslot(&crate::lock_key(k)).await;
                    assert_eq!(server_slot, slot, "CLUSTER KEYSLOT disagrees for {k:?}");
                }
                return (keys, slot);
            }
        }
        panic!("no {count} keys share a slot");
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
        crate::script_calls_in(&info)
    }

    /// A raw slot-routed connection (the redis crate's async cluster client) through the live
    /// nodes, with generous timeouts: for inspecting lock keys behind the runtime's back.
    pub async fn conn(&self) -> ClusterConnection {
        let client = redis::cluster::ClusterClientBuilder::new(self.live_seeds())
            .connection_timeout(ADMIN_TIMEOUT)
            .response_timeout(ADMIN_TIMEOUT)
            .build()
            .expect("a cluster client for the test cluster");
        client
            .get_async_connection()
            .await
            .unwrap_or_else(|e| panic!("connect to the test cluster: {e}"))
    }

    /// Runs one raw command through a slot-routed connection and returns its reply.
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let mut conn = self.conn().await;
        cmd.query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("raw cluster command failed: {e}"))
    }

    /// `EXISTS key` on the master serving it.
    pub async fn exists(&self, key: &str) -> bool {
        let n: u64 = self.query(redis::cmd("EXISTS").arg(key)).await;
        n == 1
    }

    /// `PTTL key` on the master serving it: ms left, -1 without expiry, -2 when missing.
    pub async fn pttl(&self, key: &str) -> i64 {
        self.query(redis::cmd("PTTL").arg(key)).await
    }

    /// `DEL key` on the master serving it; true if it existed.
    pub async fn del(&self, key: &str) -> bool {
        let n: u64 = self.query(redis::cmd("DEL").arg(key)).await;
        n == 1
    }

    /// `HGET key field` on the master serving it.
    pub async fn hget(&self, key: &str, field: &str) -> Option<String> {
        self.query(redis::cmd("HGET").arg(key).arg(field)).await
    }

    /// Runs one command on node `i` itself (no redirection: a key of another node's slots is a
    /// `MOVED` error). Bounded by a 2 s connect and response timeout.
    pub async fn node_query<T: redis::FromRedisValue>(
        &self,
        i: usize,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", self.nodes[i].port))?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(ADMIN_TIMEOUT))
            .set_response_timeout(Some(ADMIN_TIMEOUT));
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        cmd.query_async(&mut conn).await
    }

    /// Whether node `i` itself has `key` (`READONLY` first, so a replica answers too).
    pub async fn exists_on(&self, i: usize, key: &str) -> bool {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", self.nodes[i].port))
            .expect("a client for one cluster node");
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(ADMIN_TIMEOUT))
            .set_response_timeout(Some(ADMIN_TIMEOUT));
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
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

    /// Runs one command on node `i` over a fresh blocking connection.
    fn query_sync<T: redis::FromRedisValue>(
        &self,
        i: usize,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        query_port_sync(self.nodes[i].port, cmd)
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for (i, node) in self.nodes.iter().enumerate() {
                eprintln!(
                    "==== redis cluster node {i} log (port {}, id {}, {:?}, {}) ====\n{}\n\
                     ==== end of node {i} log ====",
                    node.port,
                    node.id,
                    node.state,
                    node.dir.path().display(),
                    node.log()
                );
            }
        }
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                // By PID; SIGKILL also ends a paused (SIGSTOP) node.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// The hash slot of a Redis key, as Redis Cluster computes it: CRC16 (XMODEM) of the hash tag
/// (the part between the first `{` and the next `}`, if not empty) or of the whole key, mod
/// 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in tagged {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

fn query_port_sync<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut conn = client.get_connection_with_timeout(ADMIN_TIMEOUT)?;
    conn.set_read_timeout(Some(ADMIN_TIMEOUT))?;
    conn.set_write_timeout(Some(ADMIN_TIMEOUT))?;
    cmd.query(&mut conn)
}

/// `redis-server`, from `DLOCK_REDIS_SERVER` or `PATH`; 7.0 or newer.
fn redis_server_binary() -> PathBuf {
    let bin = std::env::var_os(REDIS_SERVER_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("redis-server"));
    let out = match Command::new(&bin).arg("--version").output() {
        Ok(out) if out.status.success() => out,
        Ok(out) => panic!(
            "`{} --version` failed ({}): {}",
            bin.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!(
            "redis-server not found ({}: {e}); install it with `apt-get install -y redis-server` \
             or set {REDIS_SERVER_ENV} to the binary's path",
            bin.display()
        ),
    };
    let version = String::from_utf8_lossy(&out.stdout).into_owned();
    let major = version
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse::<u32>().ok());
    match major {
        Some(m) if m >= 7 => bin,
        _ => panic!(
            "the Redis Cluster tests need redis-server 7.0 or newer (sharded pub/sub, \
             cluster-port); `{} --version` says: {version}",
            bin.display()
        ),
    }
}

/// Two distinct loopback ports that were free a moment ago (never 6379).
fn free_ports() -> (u16, u16) {
    loop {
        let a = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a loopback port");
        let b = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a loopback port");
        let pa = a.local_addr().expect("local address").port();
        let pb = b.local_addr().expect("local address").port();
        if pa != 6379 && pb != 6379 {
            return (pa, pb);
        }
    }
}

/// Spawns one cluster-enabled node in a fresh temp dir on free ports and waits until it
/// answers; retries on other ports when one was taken meanwhile.
fn spawn_node(bin: &Path) -> Node {
    let dir = tempfile::Builder::new()
        .prefix("dlock-cluster-")
        .tempdir()
        .expect("create a temp dir for a cluster node");
    let mut last_error = String::new();
    for _ in 0..20 {
        let (port, bus_port) = free_ports();
        match spawn_ready(bin, port, bus_port, dir.path()) {
            Ok(child) => {
                return Node {
                    port,
                    bus_port,
                    dir,
                    child: Some(child),
                    state: State::Running,
                    id: String::new(),
                    stopped: None,
                };
            }
            Err(None) => {
                // Port taken: a fresh nodes.conf for the next try.
                let _ = std::fs::remove_file(dir.path().join("nodes.conf"));
            }
            Err(Some(why)) => {
                last_error = why;
                break;
            }
        }
    }
    panic!("could not start a cluster node: {last_error}");
}

/// `Err(None)`: a port was taken; `Err(Some(why))`: any other failure.
fn spawn_ready(bin: &Path, port: u16, bus_port: u16, dir: &Path) -> Result<Child, Option<String>> {
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("stderr.log"))
        .map_err(|e| Some(format!("open stderr.log: {e}")))?;
    let log = dir.join("redis.log");
    let mut child = Command::new(bin)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--cluster-enabled", "yes"])
        .args(["--cluster-port", &bus_port.to_string()])
        .args(["--cluster-config-file", "nodes.conf"])
        .args(["--cluster-node-timeout", &NODE_TIMEOUT_MS.to_string()])
        // Keep the topology as formed: no replica moves to another master by itself.
        .args(["--cluster-allow-replica-migration", "no"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        // Initial sync at once (the default diskless sync waits 5 s for more replicas).
        .args([
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
        ])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map_err(|e| Some(format!("spawn {}: {e}", bin.display())))?;
    let deadline = Instant::now() + NODE_READY_WITHIN;
    let own = format!("process_id:{}", child.id());
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            if log.contains("Address already in use") {
                return Err(None);
            }
            return Err(Some(format!(
                "cluster node on port {port} exited with {status}; log:\n{log}"
            )));
        }
        // Ready means: our own process answers (a neighbour test's server could hold the port).
        if let Ok(info) = query_port_sync::<String>(port, redis::cmd("INFO").arg("server")) {
            if info.lines().any(|l| l.trim() == own) {
                return Ok(child);
            }
            if info.contains("process_id:") {
                let _ = child.kill();
                let _ = child.wait();
                return Err(None);
            }
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(Some(format!(
                "cluster node on port {port} did not answer within {NODE_READY_WITHIN:?}; \
                 log:\n{log}"
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{sig} {pid} failed: {status}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lines_parse() {
        let text = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004,host replica e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 7000 [5461->-292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f]
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30002@31002 master,fail - 1426238316232 1426238314219 2 disconnected 5461-10922
";
        let views = parse_cluster_nodes(text);
        assert_eq!(views.len(), 3);
        assert_eq!(views[0].port, 30004);
        assert_eq!(
            views[0].master_id.as_deref(),
            Some("e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca")
        );
        assert!(views[0].connected);
        assert!(views[1].has("myself") && views[1].is_healthy_master());
        assert_eq!(views[1].slots, vec![(0, 5460), (7000, 7000)]);
        assert!(views[1].serves(7000) && !views[1].serves(7001));
        assert!(!views[2].is_healthy_master() && !views[2].connected);
        assert_eq!(key_slot(b"123456789"), 12739);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"dlock:{foo}"), 12182);
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_eq!(
            info_field("cluster_state:ok\r\ncluster_size:3\r\n", "cluster_state"),
            Some("ok")
        );
    }
}
