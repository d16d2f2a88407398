//! Redis Cluster for one test: [`RedisCluster::start`] forms a cluster of three masters and
//! three replicas (one per master) from six `redis-server` processes on free loopback ports,
//! each in its own temp dir, without persistence, with `cluster-node-timeout` of
//! [`NODE_TIMEOUT_MS`] so that a failover takes a few seconds. Every node is killed (SIGKILL,
//! by PID) when the handle drops; if the test is failing then, every node's log is printed.
//!
//! The cluster is formed by hand (`CLUSTER ADDSLOTSRANGE`, `CLUSTER MEET`, `CLUSTER
//! REPLICATE`), so only `redis-server` (7.0 or newer: sharded pub/sub, `cluster-port`) is
//! needed, and node `i < 3` starts as the master of slot range `i` with node `i + 3` as its
//! replica. Roles change with faults: ask the cluster ([`RedisCluster::master_for_key`]).
//!
//! [`RedisCluster::start_with_password`] puts a password on every node (`requirepass`,
//! `masterauth`).
//!
//! Faults: [`kill9`](RedisCluster::kill9) (and [`restart`](RedisCluster::restart)),
//! [`pause`](RedisCluster::pause) / [`resume`](RedisCluster::resume), then
//! [`wait_for_failover`](RedisCluster::wait_for_failover).
//! Inspection: a raw slot-routed connection ([`conn`](RedisCluster::conn), and the
//! [`RedisKeys`] the cluster dereferences to: `cluster.exists(..)`, `cluster.pttl(..)`, ...)
//! and direct per-node queries ([`node_query`](RedisCluster::node_query),
//! [`exists_on`](RedisCluster::exists_on)).

use std::ops::Deref;
use std::time::{Duration, Instant};

use crate::process::{TestProcess, loopback_hosts, start_on_free_ports, temp_dir};
use crate::redis::{RedisKeys, query_sync, redis_server_binary, server_process};

mod inspect;
mod nodes;

pub use inspect::Failover;
use nodes::info_field;
pub use nodes::{NodeView, parse_cluster_nodes};

/// `cluster-node-timeout` of every node, in milliseconds: a master that does not answer for
/// this long is flagged failing, and its replica is promoted about a second later.
pub const NODE_TIMEOUT_MS: u64 = 1000;

/// Number of masters (and of replicas: one per master).
pub const MASTERS: usize = 3;

/// Bound on forming the cluster (all slots served, every master with a synced replica).
const FORM_WITHIN: Duration = Duration::from_secs(30);

/// Timeouts of the harness's own connections to one node.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Slot ranges of the three initial masters (what `redis-cli --cluster create` assigns).
const SLOT_RANGES: [(u16, u16); MASTERS] = [(0, 5460), (5461, 10922), (10923, 16383)];

#[derive(Debug)]
struct Node {
    process: TestProcess,
    port: u16,
    bus_port: u16,
    /// `CLUSTER MYID`.
    id: String,
    /// Set by `kill9`/`pause`: when, and the slot ranges the node owned then.
    stopped: Option<(Instant, Vec<(u16, u16)>)>,
    /// Last: deleted after the process is killed.
    _dir: tempfile::TempDir,
}

/// A Redis Cluster of three masters and three replicas owned by one test.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Node>,
    /// `requirepass` and `masterauth` of every node.
    password: Option<String>,
    /// Through the nodes that run and are not paused.
    keys: RedisKeys,
}

impl RedisCluster {
    /// Starts six nodes and forms the cluster; returns once every node says `cluster_state:ok`,
    /// knows all six nodes, and every master has a replica whose replication link is up.
    ///
    /// Panics (printing every node's log) if that takes longer than 30 s, and with
    /// installation advice when `redis-server` is missing or older than 7.0.
    pub fn start() -> RedisCluster {
        RedisCluster::launch(None)
    }

    /// Like [`start`](RedisCluster::start), with a password on every node (`requirepass`, and
    /// `masterauth` for the replicas): [`url`](RedisCluster::url) is
    /// `redis+cluster://:<password>@h1,...`, and [`seeds`](RedisCluster::seeds) each carry it.
    pub fn start_with_password(password: &str) -> RedisCluster {
        RedisCluster::launch(Some(password.to_owned()))
    }

    fn launch(password: Option<String>) -> RedisCluster {
        let started = Instant::now();
        let mut cluster = RedisCluster {
            nodes: (0..2 * MASTERS)
                .map(|i| start_node(i, password.as_deref()))
                .collect(),
            password,
            keys: RedisKeys::cluster(Vec::new()),
        };
        cluster.keys = RedisKeys::cluster(cluster.live_seeds());
        cluster.form();
        let ports = |nodes: &[Node]| nodes.iter().map(|n| n.port).collect::<Vec<_>>();
        eprintln!(
            "redis cluster ready in {:?}: masters {:?}, replicas {:?}",
            started.elapsed(),
            ports(&cluster.nodes[..MASTERS]),
            ports(&cluster.nodes[MASTERS..])
        );
        cluster
    }

    fn form(&mut self) {
        for i in 0..self.nodes.len() {
            self.nodes[i].id = self.admin(i, redis::cmd("CLUSTER").arg("MYID"));
        }
        for (i, (lo, hi)) in SLOT_RANGES.iter().enumerate() {
            let () = self.admin(
                i,
                redis::cmd("CLUSTER").arg("ADDSLOTSRANGE").arg(lo).arg(hi),
            );
            let () = self.admin(i, redis::cmd("CLUSTER").arg("SET-CONFIG-EPOCH").arg(i + 1));
        }
        for j in 1..self.nodes.len() {
            let (port, bus_port) = (self.nodes[j].port, self.nodes[j].bus_port);
            let () = self.admin(
                0,
                redis::cmd("CLUSTER")
                    .arg("MEET")
                    .arg("127.0.0.1")
                    .arg(port)
                    .arg(bus_port),
            );
        }
        let deadline = Instant::now() + FORM_WITHIN;
        // Every node must know the others before a replica can name its master.
        self.form_until(deadline, "meet", RedisCluster::everyone_knows_everyone);
        for r in MASTERS..2 * MASTERS {
            let master = self.nodes[r - MASTERS].id.clone();
            self.form_until(deadline, "replicate", |cluster| {
                cluster
                    .query_sync::<()>(r, redis::cmd("CLUSTER").arg("REPLICATE").arg(&master))
                    .map_err(|e| format!("CLUSTER REPLICATE on node {r}: {e}"))
            });
        }
        self.form_until(deadline, "become healthy", RedisCluster::formed);
    }

    /// Runs `step` until it succeeds; panics with its last error after `deadline`.
    fn form_until(
        &self,
        deadline: Instant,
        what: &str,
        step: impl Fn(&RedisCluster) -> Result<(), String>,
    ) {
        loop {
            match step(self) {
                Ok(()) => return,
                Err(why) => assert!(
                    Instant::now() < deadline,
                    "the cluster nodes did not {what} within {FORM_WITHIN:?}: {why}"
                ),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn everyone_knows_everyone(&self) -> Result<(), String> {
        for i in 0..self.nodes.len() {
            let views = self.nodes_view_sync(i)?;
            let known = views
                .iter()
                .filter(|v| !v.has("handshake") && !v.has("noaddr"))
                .filter(|v| self.index_of(&v.id).is_some())
                .count();
            if known < self.nodes.len() {
                return Err(format!(
                    "node {i} knows {known} of {} nodes",
                    self.nodes.len()
                ));
            }
        }
        Ok(())
    }

    /// All slots served, all nodes known, each initial master with a connected replica whose
    /// replication link is up (a replica that never synced cannot be promoted).
    fn formed(&self) -> Result<(), String> {
        for i in 0..self.nodes.len() {
            let info: String = self
                .query_sync(i, redis::cmd("CLUSTER").arg("INFO"))
                .map_err(|e| format!("CLUSTER INFO on node {i}: {e}"))?;
            if info_field(&info, "cluster_state") != Some("ok")
                || info_field(&info, "cluster_known_nodes") != Some("6")
                || info_field(&info, "cluster_slots_ok") != Some("16384")
            {
                return Err(format!("node {i} CLUSTER INFO:\n{info}"));
            }
            let views = self.nodes_view_sync(i)?;
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
                    return Err(format!("node {i} sees no replica of master {m} yet"));
                }
            }
        }
        for r in MASTERS..2 * MASTERS {
            let info: String = self
                .query_sync(r, redis::cmd("INFO").arg("replication"))
                .map_err(|e| format!("INFO replication on node {r}: {e}"))?;
            if info_field(&info, "master_link_status") != Some("up") {
                return Err(format!("replica {r} not synced:\n{info}"));
            }
        }
        Ok(())
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
        (0..self.len()).map(|i| self.node_url(i)).collect()
    }

    /// The seeds of the nodes that are running and not paused.
    pub fn live_seeds(&self) -> Vec<String> {
        self.live().map(|i| self.node_url(i)).collect()
    }

    /// `redis+cluster://127.0.0.1:<p1>,...,127.0.0.1:<p6>` (`redis+cluster://:<pw>@…` with a
    /// password: written once, before the first host).
    pub fn url(&self) -> String {
        let hosts = loopback_hosts(self.nodes.iter().map(|n| n.port));
        format!("redis+cluster://{}{hosts}", self.userinfo())
    }

    /// `:<password>@`, or nothing.
    fn userinfo(&self) -> String {
        self.password
            .as_ref()
            .map(|pw| format!(":{pw}@"))
            .unwrap_or_default()
    }

    /// Has node `i` announce `ports[i]` as its client port (`cluster-announce-port`; its bus
    /// port stays its own), so that clients, which learn every node's address from the
    /// cluster, reach it there (a [`FaultProxy`](crate::FaultProxy) in front of it, say).
    /// Replicas then replicate through it too. Returns once every node's `CLUSTER SLOTS`
    /// names only those ports; panics after 30 s.
    pub fn announce_ports(&self, ports: &[u16]) {
        assert_eq!(ports.len(), self.len(), "one port per node");
        for (i, port) in ports.iter().enumerate() {
            let bus = self.nodes[i].bus_port;
            for (name, value) in [
                ("cluster-announce-port", *port),
                ("cluster-announce-bus-port", bus),
            ] {
                let () = self.admin(i, redis::cmd("CONFIG").arg("SET").arg(name).arg(value));
            }
        }
        let wanted: std::collections::BTreeSet<i64> = ports.iter().map(|&p| i64::from(p)).collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let seen: Vec<std::collections::BTreeSet<i64>> = (0..self.len())
                .map(|i| {
                    let slots: redis::Value =
                        self.admin(i, &redis::cmd("CLUSTER").arg("SLOTS").clone());
                    slot_ports(&slots)
                })
                .collect();
            if seen
                .iter()
                .all(|ports| ports.is_subset(&wanted) && !ports.is_empty())
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the nodes still announce other ports after 30 s: {seen:?}, wanted {wanted:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The client port of node `i`.
    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].port
    }

    /// The process id of node `i`; panics if it was killed.
    pub fn pid(&self, i: usize) -> u32 {
        self.nodes[i].process.pid()
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
        let process = &self.nodes[i].process;
        process.is_running() && !process.is_paused()
    }

    fn live(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&i| self.is_live(i))
    }

    fn any_live(&self) -> usize {
        self.live().next().expect("every cluster node is down")
    }

    /// The log of node `i` so far.
    pub fn log(&self, i: usize) -> String {
        self.nodes[i].process.log()
    }

    /// Kills node `i` with SIGKILL (by PID) and reaps it. Remembers the slots it served, for
    /// [`wait_for_failover`](RedisCluster::wait_for_failover).
    pub fn kill9(&mut self, i: usize) {
        let slots = if self.is_live(i) {
            self.slots_of(i)
        } else {
            Vec::new()
        };
        self.nodes[i].process.kill9();
        self.stopped(i, slots);
    }

    /// Freezes node `i` with SIGSTOP: its connections stay open, nothing is answered, and the
    /// cluster fails it over after the node timeout if it is a master.
    pub fn pause(&mut self, i: usize) {
        assert!(self.is_live(i), "node {i} is not running");
        let slots = self.slots_of(i);
        self.nodes[i].process.pause();
        self.stopped(i, slots);
    }

    /// Resumes node `i` after [`pause`](RedisCluster::pause) with SIGCONT. A master that was
    /// failed over meanwhile rejoins as a replica of the promoted node.
    pub fn resume(&mut self, i: usize) {
        assert!(self.nodes[i].process.is_paused(), "node {i} is not paused");
        self.nodes[i].process.resume();
        self.keys = RedisKeys::cluster(self.live_seeds());
    }

    /// Starts node `i` again on its port and in its directory: after [`kill9`](RedisCluster::kill9)
    /// at once, otherwise after SIGTERM. It keeps its node id and cluster configuration
    /// (`nodes.conf`) but no data: there is no persistence. A master restarted before its
    /// replica was promoted comes back as the master of its slots, empty; one restarted after
    /// a failover rejoins as a replica of the promoted node.
    pub fn restart(&mut self, i: usize) {
        self.nodes[i].process.restart();
        self.keys = RedisKeys::cluster(self.live_seeds());
    }

    fn stopped(&mut self, i: usize, slots: Vec<(u16, u16)>) {
        self.nodes[i].stopped = Some((Instant::now(), slots));
        self.keys = RedisKeys::cluster(self.live_seeds());
    }

    /// Slot ranges node `i` serves, as a live node (other than `i`) sees it now.
    fn slots_of(&self, i: usize) -> Vec<(u16, u16)> {
        let observer = self
            .live()
            .find(|&j| j != i)
            .expect("another live node to observe the cluster");
        self.nodes_view_sync(observer)
            .unwrap_or_else(|e| panic!("{e}"))
            .into_iter()
            .find(|v| v.id == self.nodes[i].id)
            .map(|v| v.slots)
            .unwrap_or_default()
    }

    fn node_url(&self, i: usize) -> String {
        format!(
            "redis://{}127.0.0.1:{}",
            self.userinfo(),
            self.nodes[i].port
        )
    }

    /// `CLUSTER NODES` of node `i` over a blocking connection, parsed.
    fn nodes_view_sync(&self, i: usize) -> Result<Vec<NodeView>, String> {
        self.query_sync::<String>(i, redis::cmd("CLUSTER").arg("NODES"))
            .map(|text| parse_cluster_nodes(&text))
            .map_err(|e| format!("CLUSTER NODES on node {i}: {e}"))
    }

    /// Runs one command on node `i` over a fresh blocking connection.
    fn query_sync<T: redis::FromRedisValue>(
        &self,
        i: usize,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        query_sync(&self.node_url(i), cmd, ADMIN_TIMEOUT)
    }

    /// [`query_sync`](RedisCluster::query_sync) while forming: panics on failure.
    fn admin<T: redis::FromRedisValue>(&self, i: usize, cmd: &redis::Cmd) -> T {
        self.query_sync(i, cmd)
            .unwrap_or_else(|e| panic!("{cmd:?} on node {i}: {e}"))
    }
}

impl Deref for RedisCluster {
    type Target = RedisKeys;

    /// The raw, slot-routed view of the cluster's keys, through the live nodes.
    fn deref(&self) -> &RedisKeys {
        &self.keys
    }
}

/// Starts node `i`: cluster-enabled, in a fresh temp dir, on free client and bus ports, with
/// `password` (if any) required of clients and given to its master when it replicates.
fn start_node(i: usize, password: Option<&str>) -> Node {
    let bin = redis_server_binary();
    let major = bin
        .version
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse::<u32>().ok());
    assert!(
        major.is_some_and(|m| m >= 7),
        "the Redis Cluster tests need redis-server 7.0 or newer (sharded pub/sub, \
         cluster-port); `{} --version` says: {}",
        bin.path.display(),
        bin.version
    );
    let dir = temp_dir("dlock-cluster-");
    let (process, port, bus_port) = start_on_free_ports("a cluster node", 2, |ports| {
        let (port, bus_port) = (ports[0], ports[1]);
        // A fresh nodes.conf for each try.
        let _ = std::fs::remove_file(dir.path().join("nodes.conf"));
        let mut args = [
            "--port",
            &port.to_string(),
            "--cluster-enabled",
            "yes",
            "--cluster-port",
            &bus_port.to_string(),
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &NODE_TIMEOUT_MS.to_string(),
            // Keep the topology as formed: no replica moves to another master by itself.
            "--cluster-allow-replica-migration",
            "no",
            // Initial sync at once (the default diskless sync waits 5 s for more replicas).
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
        ]
        .map(str::to_owned)
        .to_vec();
        let mut probe = format!("redis://127.0.0.1:{port}");
        if let Some(password) = password {
            for arg in ["--requirepass", password, "--masterauth", password] {
                args.push(arg.to_owned());
            }
            probe = format!("redis://:{password}@127.0.0.1:{port}");
        }
        let mut process = server_process(
            &bin,
            dir.path(),
            format!("redis cluster node {i} on port {port}"),
            &args,
            probe,
        );
        process.start().map(|()| (process, port, bus_port))
    });
    Node {
        process,
        port,
        bus_port,
        id: String::new(),
        stopped: None,
        _dir: dir,
    }
}

/// The client ports a `CLUSTER SLOTS` answer names (masters and replicas of every range).
fn slot_ports(slots: &redis::Value) -> std::collections::BTreeSet<i64> {
    let mut ports = std::collections::BTreeSet::new();
    if let redis::Value::Array(ranges) = slots {
        for range in ranges {
            if let redis::Value::Array(fields) = range {
                for node in fields.iter().skip(2) {
                    if let redis::Value::Array(node) = node
                        && let Some(redis::Value::Int(port)) = node.get(1)
                    {
                        ports.insert(*port);
                    }
                }
            }
        }
    }
    ports
}
