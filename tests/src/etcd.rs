//! etcd harness: [`EtcdServer::start`] runs one `etcd` member, [`EtcdCluster::start`] forms a
//! cluster of `n` members, each on its own pair of free loopback ports (client and peer, never
//! 2379/2380) with its data dir in one temp dir, and every member is killed (SIGKILL, by PID)
//! when the handle drops. If the test is failing then, every member's log is printed.
//!
//! A member counts as ready when its own process logged that it serves clients (so a
//! neighbour's server on a reused port cannot pass for it) and `GET /health` answers
//! `"health":"true"` (it has a leader). Heartbeat and election timeout stay at etcd's defaults
//! (100 ms / 1 s): a leader killed with SIGKILL is replaced within about 1–2 s.
//!
//! Faults: [`kill9`](EtcdCluster::kill9), [`stop`](EtcdCluster::stop),
//! [`pause`](EtcdCluster::pause) / [`resume`](EtcdCluster::resume) (SIGSTOP / SIGCONT),
//! [`restart`](EtcdCluster::restart) (same ports, same data: the member rejoins).
//! Inspection without a client crate, through etcd's JSON gateway (`/v3/...`, keys and values
//! base64): [`get`](EtcdCluster::get), [`get_prefix`](EtcdCluster::get_prefix),
//! [`put`](EtcdCluster::put), [`delete`](EtcdCluster::delete),
//! [`lease_ttl`](EtcdCluster::lease_ttl), [`status`](EtcdCluster::status),
//! [`leader_index`](EtcdCluster::leader_index), and raw [`post`](EtcdCluster::post).
//!
//! The binary is `etcd` on `PATH`, or [`ETCD_ENV`] (`DLOCK_ETCD`). Debian: `etcd-server`.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The environment variable naming the `etcd` binary (default: `etcd` on `PATH`).
pub const ETCD_ENV: &str = "DLOCK_ETCD";

/// Bound on a fresh start (all members ready, a leader elected), per attempt.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// Timeout of each harness HTTP request (connect, and each read/write).
const HTTP_TIMEOUT: Duration = Duration::from_secs(2);

/// Timeout of readiness probes, short so that a probe racing the start costs little.
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);

/// How many fresh port sets to try when a port is taken between choosing and binding it.
const START_ATTEMPTS: usize = 20;

/// Ports etcd uses by default; the harness never hands them out.
const DEFAULT_PORTS: [u16; 2] = [2379, 2380];

/// Logged by an etcd process once it serves client requests on its client listener.
const SERVING_MARKER: &str = "serving client traffic";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Paused,
    Killed,
}

#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    state: State,
    /// Length of the log file when the current process was spawned: readiness and port
    /// conflicts are judged on what this process wrote, not on an earlier run's lines.
    log_offset: u64,
}

/// A key as read through the gateway's `/v3/kv/range`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdKv {
    /// The key (lossy UTF-8).
    pub key: String,
    /// The value bytes.
    pub value: Vec<u8>,
    /// Revision of the put that created the key (the fencing token of an etcd lock).
    pub create_revision: i64,
    /// Revision of the last put.
    pub mod_revision: i64,
    /// Number of puts since creation.
    pub version: i64,
    /// The lease the key is attached to (0: none).
    pub lease: i64,
}

/// One member's `/v3/maintenance/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberStatus {
    /// This member's id.
    pub member_id: u64,
    /// The leader this member knows of (0: none).
    pub leader: u64,
    /// Raft term.
    pub raft_term: u64,
    /// The store's current revision.
    pub revision: i64,
}

impl MemberStatus {
    /// Whether this member is the leader.
    pub fn is_leader(&self) -> bool {
        self.leader != 0 && self.leader == self.member_id
    }
}

/// A cluster of etcd members owned by one test.
#[derive(Debug)]
pub struct EtcdCluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    token: String,
    members: Vec<Member>,
}

enum StartError {
    PortTaken,
    Failed(String),
}

impl EtcdCluster {
    /// Starts `n` members (`--initial-cluster-state new`, a unique `--initial-cluster-token`)
    /// and returns once every member is ready (serving, with a leader).
    ///
    /// Panics (printing every member's log) if that takes longer than 20 s, and with
    /// installation advice when `etcd` is missing.
    pub fn start(n: usize) -> EtcdCluster {
        assert!(n >= 1, "an etcd cluster needs at least one member");
        let bin = etcd_binary();
        let dir = tempfile::Builder::new()
            .prefix("dlock-etcd-")
            .tempdir()
            .expect("create a temp dir for etcd");
        let mut cluster = EtcdCluster {
            bin,
            dir,
            token: String::new(),
            members: Vec::new(),
        };
        let mut last_error = String::new();
        for attempt in 0..START_ATTEMPTS {
            cluster.discard_members();
            let ports = free_ports(2 * n);
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            cluster.token = format!("dlock-test-{}-{nanos}-{attempt}", std::process::id());
            cluster.members = (0..n)
                .map(|i| Member {
                    name: format!("n{i}"),
                    client_port: ports[2 * i],
                    peer_port: ports[2 * i + 1],
                    child: None,
                    state: State::Killed,
                    log_offset: 0,
                })
                .collect();
            let mut spawned = Ok(());
            for i in 0..n {
                if let Err(e) = cluster.spawn(i) {
                    spawned = Err(e);
                    break;
                }
            }
            let all: Vec<usize> = (0..n).collect();
            match spawned.and_then(|()| cluster.wait_ready(&all, READY_WITHIN)) {
                Ok(()) => return cluster,
                Err(StartError::PortTaken) => continue,
                Err(StartError::Failed(why)) => {
                    last_error = why;
                    break;
                }
            }
        }
        if last_error.is_empty() {
            last_error = format!("a port was taken in each of {START_ATTEMPTS} attempts");
        }
        panic!("could not start an etcd cluster of {n}: {last_error}");
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false: a cluster has at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Client URL of every member, `http://127.0.0.1:<port>` (killed ones too: what a client is
    /// configured with).
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.len()).map(|i| self.endpoint(i)).collect()
    }

    /// Client URL of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client_port)
    }

    /// `etcd://127.0.0.1:<c1>,127.0.0.1:<c2>,...` for `Runtime::from_url`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect();
        format!("etcd://{}", hosts.join(","))
    }

    /// Client port of member `i`.
    pub fn client_port(&self, i: usize) -> u16 {
        self.members[i].client_port
    }

    /// Peer port of member `i`.
    pub fn peer_port(&self, i: usize) -> u16 {
        self.members[i].peer_port
    }

    /// Process id of member `i`. Panics if it is not running.
    pub fn pid(&self, i: usize) -> u32 {
        self.members[i]
            .child
            .as_ref()
            .unwrap_or_else(|| panic!("etcd member {i} is not running"))
            .id()
    }

    /// Whether member `i` has a process (running or paused).
    pub fn is_running(&self, i: usize) -> bool {
        self.members[i].state != State::Killed
    }

    /// Whether member `i` is frozen by [`pause`](EtcdCluster::pause).
    pub fn is_paused(&self, i: usize) -> bool {
        self.members[i].state == State::Paused
    }

    /// The temp dir holding every member's data dir (`n<i>/`) and log (`n<i>.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills member `i` with SIGKILL and reaps it. Ports and data stay for
    /// [`restart`](EtcdCluster::restart).
    pub fn kill9(&mut self, i: usize) {
        let member = &mut self.members[i];
        if let Some(mut child) = member.child.take() {
            // SIGKILL also ends a stopped (SIGSTOP) process.
            let _ = child.kill();
            let _ = child.wait();
        }
        member.state = State::Killed;
    }

    /// Stops member `i` with SIGTERM (SIGKILL after 5 s) and reaps it.
    pub fn stop(&mut self, i: usize) {
        if self.members[i].state == State::Paused {
            self.resume(i);
        }
        let member = &mut self.members[i];
        if let Some(mut child) = member.child.take() {
            signal(child.id(), "TERM");
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
        member.state = State::Killed;
    }

    /// Freezes member `i` with SIGSTOP: connections stay open, requests go unanswered, its
    /// heartbeats stop (a paused leader is replaced by the others).
    pub fn pause(&mut self, i: usize) {
        signal(self.pid(i), "STOP");
        self.members[i].state = State::Paused;
    }

    /// Resumes member `i` frozen by [`pause`](EtcdCluster::pause) with SIGCONT.
    pub fn resume(&mut self, i: usize) {
        signal(self.pid(i), "CONT");
        self.members[i].state = State::Running;
    }

    /// Starts member `i` again (stopping it first if it runs) on the same ports with the same
    /// data dir, and waits until it is ready: it has rejoined and knows a leader, which needs a
    /// quorum of members running.
    pub fn restart(&mut self, i: usize) {
        if self.is_running(i) {
            self.stop(i);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self
                .spawn(i)
                .and_then(|()| self.wait_ready(&[i], READY_WITHIN))
            {
                Ok(()) => return,
                Err(StartError::PortTaken) if Instant::now() < deadline => {
                    self.kill9(i);
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(StartError::PortTaken) => panic!(
                    "etcd member {i}: port {} or {} stayed taken after it stopped",
                    self.members[i].client_port, self.members[i].peer_port
                ),
                Err(StartError::Failed(why)) => panic!("could not restart etcd member {i}: {why}"),
            }
        }
    }

    /// Whether member `i` answers `GET /health` with `"health":"true"` (false when killed,
    /// paused or without a leader).
    pub fn is_healthy(&self, i: usize) -> bool {
        health(self.members[i].client_port, PROBE_TIMEOUT)
    }

    /// Member `i`'s `/v3/maintenance/status`, or why not (killed, paused, error).
    pub fn status(&self, i: usize) -> Result<MemberStatus, String> {
        if self.members[i].state != State::Running {
            return Err(format!("etcd member {i} is {:?}", self.members[i].state));
        }
        let body = http_ok(
            self.members[i].client_port,
            "POST",
            "/v3/maintenance/status",
            "{}",
            HTTP_TIMEOUT,
        )?;
        let v = json::parse(&body)?;
        let header = v.get("header");
        Ok(MemberStatus {
            member_id: header
                .and_then(|h| h.get("member_id"))
                .map_or(0, json::Json::as_u64),
            leader: v.get("leader").map_or(0, json::Json::as_u64),
            raft_term: v.get("raftTerm").map_or(0, json::Json::as_u64),
            revision: header
                .and_then(|h| h.get("revision"))
                .map_or(0, json::Json::as_i64),
        })
    }

    /// The index of the member that is leader, asking every running (not paused) member whether
    /// it is; `None` if none is (no leader yet, or the leader is killed or paused).
    pub fn leader_index(&self) -> Option<usize> {
        self.running()
            .find(|&i| self.status(i).is_ok_and(|s| s.is_leader()))
    }

    /// Waits until one running member is leader and every running (not paused) member agrees on
    /// it; returns its index. Panics (printing logs) after `within`.
    pub fn wait_for_leader(&self, within: Duration) -> usize {
        let start = Instant::now();
        loop {
            let statuses: Vec<(usize, Result<MemberStatus, String>)> =
                self.running().map(|i| (i, self.status(i))).collect();
            let leader = statuses
                .iter()
                .find(|(_, s)| s.as_ref().is_ok_and(|s| s.is_leader()));
            if let Some(&(index, Ok(ref leader))) = leader {
                let agreed = statuses
                    .iter()
                    .all(|(_, s)| s.as_ref().is_ok_and(|s| s.leader == leader.member_id));
                if agreed {
                    return index;
                }
            }
            assert!(
                start.elapsed() < within,
                "etcd: no leader agreed on by every running member within {within:?}: \
                 {statuses:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// POSTs `body` (JSON) to the gateway path `path` (e.g. `/v3/kv/range`) of the first running
    /// member that answers 200; returns the response body, or every member's error.
    pub fn try_post(&self, path: &str, body: &str) -> Result<String, String> {
        let mut errors = Vec::new();
        for i in self.running() {
            match http_ok(
                self.members[i].client_port,
                "POST",
                path,
                body,
                HTTP_TIMEOUT,
            ) {
                Ok(reply) => return Ok(reply),
                Err(e) => errors.push(format!("member {i}: {e}")),
            }
        }
        if errors.is_empty() {
            errors.push("no etcd member is running".to_owned());
        }
        Err(errors.join("; "))
    }

    /// [`try_post`](EtcdCluster::try_post), panicking on failure.
    pub fn post(&self, path: &str, body: &str) -> String {
        self.try_post(path, body)
            .unwrap_or_else(|e| panic!("etcd POST {path} {body}: {e}"))
    }

    /// Writes `key = value` (no lease); returns the new revision.
    pub fn put(&self, key: &str, value: impl AsRef<[u8]>) -> i64 {
        let body = format!(
            r#"{{"key":"{}","value":"{}"}}"#,
            base64_encode(key.as_bytes()),
            base64_encode(value.as_ref())
        );
        let reply = self.post("/v3/kv/put", &body);
        parse_or_panic(&reply)
            .get("header")
            .and_then(|h| h.get("revision"))
            .map_or(0, json::Json::as_i64)
    }

    /// Reads `key` (linearizable).
    pub fn get(&self, key: &str) -> Option<EtcdKv> {
        let body = format!(r#"{{"key":"{}"}}"#, base64_encode(key.as_bytes()));
        self.range(&body).into_iter().next()
    }

    /// Every key starting with `prefix`, in key order.
    pub fn get_prefix(&self, prefix: &str) -> Vec<EtcdKv> {
        // The empty key is not a valid start: "\0" is the smallest key.
        let key: &[u8] = if prefix.is_empty() {
            b"\0"
        } else {
            prefix.as_bytes()
        };
        let body = format!(
            r#"{{"key":"{}","range_end":"{}"}}"#,
            base64_encode(key),
            base64_encode(&prefix_end(prefix.as_bytes()))
        );
        self.range(&body)
    }

    /// Deletes `key`; returns whether it existed.
    pub fn delete(&self, key: &str) -> bool {
        let body = format!(r#"{{"key":"{}"}}"#, base64_encode(key.as_bytes()));
        let reply = self.post("/v3/kv/deleterange", &body);
        parse_or_panic(&reply)
            .get("deleted")
            .map_or(0, json::Json::as_i64)
            > 0
    }

    /// Seconds left on lease `id` (`/v3/lease/timetolive`); `None` when it expired or never
    /// existed.
    pub fn lease_ttl(&self, id: i64) -> Option<i64> {
        let reply = self.post("/v3/lease/timetolive", &format!(r#"{{"ID":"{id}"}}"#));
        let ttl = parse_or_panic(&reply)
            .get("TTL")
            .map_or(-1, json::Json::as_i64);
        (ttl >= 0).then_some(ttl)
    }

    /// Member `i`'s log so far.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.log_path(i)).unwrap_or_default()
    }

    fn range(&self, body: &str) -> Vec<EtcdKv> {
        let reply = self.post("/v3/kv/range", body);
        let v = parse_or_panic(&reply);
        let Some(kvs) = v.get("kvs") else {
            return Vec::new();
        };
        kvs.items()
            .iter()
            .map(|kv| {
                let bytes = |field: &str| {
                    kv.get(field)
                        .and_then(json::Json::as_str)
                        .map(|s| base64_decode(s).unwrap_or_else(|e| panic!("{e} in {reply}")))
                        .unwrap_or_default()
                };
                let int = |field: &str| kv.get(field).map_or(0, json::Json::as_i64);
                EtcdKv {
                    key: String::from_utf8_lossy(&bytes("key")).into_owned(),
                    value: bytes("value"),
                    create_revision: int("create_revision"),
                    mod_revision: int("mod_revision"),
                    version: int("version"),
                    lease: int("lease"),
                }
            })
            .collect()
    }

    /// Indices of members running and not paused.
    fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.len()).filter(|&i| self.members[i].state == State::Running)
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("n{i}.log"))
    }

    fn initial_cluster(&self) -> String {
        let peers: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect();
        peers.join(",")
    }

    /// Kills every member and deletes their data dirs and logs (before a fresh start attempt).
    fn discard_members(&mut self) {
        for i in 0..self.len() {
            self.kill9(i);
            let _ = std::fs::remove_dir_all(self.dir.path().join(&self.members[i].name));
            let _ = std::fs::remove_file(self.log_path(i));
        }
        self.members.clear();
    }

    fn spawn(&mut self, i: usize) -> Result<(), StartError> {
        let log_path = self.log_path(i);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| StartError::Failed(format!("open {}: {e}", log_path.display())))?;
        let log_offset = log.metadata().map(|m| m.len()).unwrap_or(0);
        let initial_cluster = self.initial_cluster();
        let member = &self.members[i];
        let client_url = format!("http://127.0.0.1:{}", member.client_port);
        let peer_url = format!("http://127.0.0.1:{}", member.peer_port);
        let mut command = Command::new(&self.bin);
        command
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(self.dir.path().join(&member.name))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &self.token])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if cfg!(target_arch = "aarch64") {
            // etcd 3.4 refuses to start on arm64 without this.
            command.env("ETCD_UNSUPPORTED_ARCH", "arm64");
        }
        let child = command
            .spawn()
            .map_err(|e| StartError::Failed(format!("spawn {}: {e}", self.bin.display())))?;
        let member = &mut self.members[i];
        member.child = Some(child);
        member.state = State::Running;
        member.log_offset = log_offset;
        Ok(())
    }

    /// Waits until every member in `which` is ready: its own process logged that it serves
    /// clients, and `/health` says true.
    fn wait_ready(&mut self, which: &[usize], within: Duration) -> Result<(), StartError> {
        let deadline = Instant::now() + within;
        let mut pending: Vec<usize> = which.to_vec();
        loop {
            let mut still = Vec::new();
            for &i in &pending {
                let exited = match self.members[i].child.as_mut() {
                    Some(child) => child.try_wait().ok().flatten(),
                    None => return Err(StartError::Failed(format!("member {i} not spawned"))),
                };
                let log = self.log_since_spawn(i);
                if let Some(status) = exited {
                    self.members[i].child = None;
                    self.members[i].state = State::Killed;
                    if log.contains("address already in use") {
                        return Err(StartError::PortTaken);
                    }
                    return Err(StartError::Failed(format!(
                        "etcd member {i} (client port {}) exited with {status}; log:\n{log}",
                        self.members[i].client_port
                    )));
                }
                let ready = log.contains(SERVING_MARKER)
                    && health(self.members[i].client_port, PROBE_TIMEOUT);
                if !ready {
                    still.push(i);
                }
            }
            if still.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let ports: Vec<u16> = still.iter().map(|&i| self.members[i].client_port).collect();
                return Err(StartError::Failed(format!(
                    "etcd members {still:?} (client ports {ports:?}) not ready within {within:?}"
                )));
            }
            pending = still;
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_since_spawn(&self, i: usize) -> String {
        let log = std::fs::read(self.log_path(i)).unwrap_or_default();
        let from = usize::try_from(self.members[i].log_offset)
            .unwrap_or(0)
            .min(log.len());
        String::from_utf8_lossy(&log[from..]).into_owned()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for (i, member) in self.members.iter().enumerate() {
                eprintln!(
                    "==== etcd member {i} log (client port {}, peer port {}, {}) ====\n{}\n\
                     ==== end of etcd member {i} log ====",
                    member.client_port,
                    member.peer_port,
                    self.dir.path().display(),
                    self.log(i)
                );
            }
        }
        for i in 0..self.len() {
            self.kill9(i);
        }
    }
}

/// A single etcd member owned by one test: an [`EtcdCluster`] of one, with index-free
/// shorthands. Everything else is on [`cluster`](EtcdServer::cluster).
#[derive(Debug)]
pub struct EtcdServer {
    cluster: EtcdCluster,
}

impl EtcdServer {
    /// Starts one member on free loopback ports and waits until it is ready.
    ///
    /// Panics with installation advice when `etcd` is missing.
    pub fn start() -> EtcdServer {
        EtcdServer {
            cluster: EtcdCluster::start(1),
        }
    }

    /// The one-member cluster (for everything without a shorthand here).
    pub fn cluster(&self) -> &EtcdCluster {
        &self.cluster
    }

    /// `etcd://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        self.cluster.url()
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        self.cluster.endpoint(0)
    }

    /// `[endpoint()]`, for `Runtime::builder().etcd(..)`.
    pub fn endpoints(&self) -> Vec<String> {
        self.cluster.endpoints()
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.cluster.client_port(0)
    }

    /// The process id. Panics if it is not running.
    pub fn pid(&self) -> u32 {
        self.cluster.pid(0)
    }

    /// The temp dir (data dir `n0/`, log `n0.log`).
    pub fn dir(&self) -> &Path {
        self.cluster.dir()
    }

    /// SIGKILL and reap; data and port stay for [`restart`](EtcdServer::restart).
    pub fn kill9(&mut self) {
        self.cluster.kill9(0)
    }

    /// SIGTERM (SIGKILL after 5 s) and reap.
    pub fn stop(&mut self) {
        self.cluster.stop(0)
    }

    /// SIGSTOP.
    pub fn pause(&mut self) {
        self.cluster.pause(0)
    }

    /// SIGCONT.
    pub fn resume(&mut self) {
        self.cluster.resume(0)
    }

    /// Starts the server again on the same port with the same data (keys and leases survive;
    /// lease TTLs are reset by etcd on restart).
    pub fn restart(&mut self) {
        self.cluster.restart(0)
    }

    /// Whether `/health` says true.
    pub fn is_healthy(&self) -> bool {
        self.cluster.is_healthy(0)
    }

    /// Raw gateway POST (see [`EtcdCluster::post`]).
    pub fn post(&self, path: &str, body: &str) -> String {
        self.cluster.post(path, body)
    }

    /// See [`EtcdCluster::put`].
    pub fn put(&self, key: &str, value: impl AsRef<[u8]>) -> i64 {
        self.cluster.put(key, value)
    }

    /// See [`EtcdCluster::get`].
    pub fn get(&self, key: &str) -> Option<EtcdKv> {
        self.cluster.get(key)
    }

    /// See [`EtcdCluster::get_prefix`].
    pub fn get_prefix(&self, prefix: &str) -> Vec<EtcdKv> {
        self.cluster.get_prefix(prefix)
    }

    /// See [`EtcdCluster::delete`].
    pub fn delete(&self, key: &str) -> bool {
        self.cluster.delete(key)
    }

    /// See [`EtcdCluster::lease_ttl`].
    pub fn lease_ttl(&self, id: i64) -> Option<i64> {
        self.cluster.lease_ttl(id)
    }

    /// The server log so far.
    pub fn log(&self) -> String {
        self.cluster.log(0)
    }
}

/// Standard base64 with padding (what the gateway uses for keys and values).
pub fn base64_encode(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let sextet = |shift: u32| char::from(ALPHABET[((n >> shift) & 63) as usize]);
        out.push(sextet(18));
        out.push(sextet(12));
        out.push(if chunk.len() > 1 { sextet(6) } else { '=' });
        out.push(if chunk.len() > 2 { sextet(0) } else { '=' });
    }
    out
}

/// Decodes standard (or URL-safe) base64; padding optional.
pub fn base64_decode(text: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'=' => break,
            _ => return Err(format!("invalid base64 {text:?}")),
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

/// The `range_end` that selects every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Empty prefix (or all 0xff): from the key to the end of the keyspace.
    vec![0]
}

fn etcd_binary() -> PathBuf {
    let bin = std::env::var_os(ETCD_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("etcd"));
    match Command::new(&bin).arg("--version").output() {
        Ok(out) if out.status.success() => bin,
        Ok(out) => panic!(
            "`{} --version` failed ({}): {}",
            bin.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!(
            "etcd not found ({}: {e}); install it with `apt-get install -y etcd-server` \
             (or run scripts/test as root) or set {ETCD_ENV} to the binary's path",
            bin.display()
        ),
    }
}

/// `n` distinct loopback ports that were free a moment ago (never etcd's defaults). All
/// listeners are held until every port is chosen, so the ports differ from each other.
fn free_ports(n: usize) -> Vec<u16> {
    let mut listeners = Vec::with_capacity(n);
    while listeners.len() < n {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a loopback port");
        let port = listener.local_addr().expect("local address").port();
        if !DEFAULT_PORTS.contains(&port) {
            listeners.push((port, listener));
        }
    }
    listeners.into_iter().map(|(port, _)| port).collect()
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{sig} {pid} failed: {status}");
}

fn health(port: u16, timeout: Duration) -> bool {
    http(port, "GET", "/health", "", timeout)
        .is_ok_and(|(status, body)| status == 200 && body.contains(r#""health":"true""#))
}

/// One HTTP/1.0 request on a fresh connection; `Ok((status, body))`.
fn http(
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> Result<(u16, String), String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let exchange = || -> std::io::Result<Vec<u8>> {
        let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let request = format!(
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes())?;
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply)?;
        Ok(reply)
    };
    let reply = exchange().map_err(|e| format!("{method} {addr}{path}: {e}"))?;
    let text = String::from_utf8_lossy(&reply);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{method} {addr}{path}: incomplete reply {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{method} {addr}{path}: bad status line in {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// [`http`], with any status but 200 turned into an error.
fn http_ok(
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> Result<String, String> {
    match http(port, method, path, body, timeout)? {
        (200, reply) => Ok(reply),
        (status, reply) => Err(format!(
            "{method} port {port}{path}: HTTP {status}: {reply}"
        )),
    }
}

fn parse_or_panic(text: &str) -> json::Json {
    json::parse(text).unwrap_or_else(|e| panic!("etcd gateway reply is not JSON ({e}): {text}"))
}

/// Just enough JSON for the gateway's replies (no dependency).
mod json {
    #[derive(Debug, Clone, PartialEq)]
    pub(super) enum Json {
        Null,
        Bool(bool),
        /// Kept as text: etcd's ids are 64-bit (the gateway writes them as strings anyway).
        Num(String),
        Str(String),
        Arr(Vec<Json>),
        Obj(Vec<(String, Json)>),
    }

    impl Json {
        pub(super) fn get(&self, key: &str) -> Option<&Json> {
            match self {
                Json::Obj(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
                _ => None,
            }
        }

        pub(super) fn items(&self) -> &[Json] {
            match self {
                Json::Arr(items) => items,
                _ => &[],
            }
        }

        pub(super) fn as_str(&self) -> Option<&str> {
            match self {
                Json::Str(s) => Some(s),
                _ => None,
            }
        }

        /// A number or a numeric string (int64 fields are strings in the gateway's JSON).
        pub(super) fn as_u64(&self) -> u64 {
            match self {
                Json::Num(s) | Json::Str(s) => s.parse().unwrap_or(0),
                _ => 0,
            }
        }

        pub(super) fn as_i64(&self) -> i64 {
            match self {
                Json::Num(s) | Json::Str(s) => s.parse().unwrap_or(0),
                _ => 0,
            }
        }
    }

    pub(super) fn parse(text: &str) -> Result<Json, String> {
        let mut p = Parser {
            b: text.as_bytes(),
            i: 0,
        };
        let v = p.value()?;
        p.ws();
        if p.i != p.b.len() {
            return Err(format!("trailing bytes at {}", p.i));
        }
        Ok(v)
    }

    struct Parser<'a> {
        b: &'a [u8],
        i: usize,
    }

    impl Parser<'_> {
        fn ws(&mut self) {
            while matches!(self.b.get(self.i), Some(b' ' | b'\n' | b'\r' | b'\t')) {
                self.i += 1;
            }
        }

        fn eat(&mut self, c: u8) -> bool {
            self.ws();
            if self.b.get(self.i) == Some(&c) {
                self.i += 1;
                true
            } else {
                false
            }
        }

        fn expect(&mut self, c: u8) -> Result<(), String> {
            if self.eat(c) {
                Ok(())
            } else {
                Err(format!("expected {:?} at byte {}", char::from(c), self.i))
            }
        }

        fn value(&mut self) -> Result<Json, String> {
            self.ws();
            match self.b.get(self.i).copied() {
                Some(b'{') => {
                    self.i += 1;
                    let mut fields = Vec::new();
                    if self.eat(b'}') {
                        return Ok(Json::Obj(fields));
                    }
                    loop {
                        self.ws();
                        let key = self.string()?;
                        self.expect(b':')?;
                        fields.push((key, self.value()?));
                        if !self.eat(b',') {
                            self.expect(b'}')?;
                            return Ok(Json::Obj(fields));
                        }
                    }
                }
                Some(b'[') => {
                    self.i += 1;
                    let mut items = Vec::new();
                    if self.eat(b']') {
                        return Ok(Json::Arr(items));
                    }
                    loop {
                        items.push(self.value()?);
                        if !self.eat(b',') {
                            self.expect(b']')?;
                            return Ok(Json::Arr(items));
                        }
                    }
                }
                Some(b'"') => Ok(Json::Str(self.string()?)),
                Some(b't') => self.literal("true", Json::Bool(true)),
                Some(b'f') => self.literal("false", Json::Bool(false)),
                Some(b'n') => self.literal("null", Json::Null),
                Some(c) if c == b'-' || c.is_ascii_digit() => {
                    let start = self.i;
                    while matches!(self.b.get(self.i), Some(c) if c.is_ascii_digit() || b"+-.eE".contains(c))
                    {
                        self.i += 1;
                    }
                    Ok(Json::Num(
                        String::from_utf8_lossy(&self.b[start..self.i]).into_owned(),
                    ))
                }
                other => Err(format!(
                    "unexpected {:?} at byte {}",
                    other.map(char::from),
                    self.i
                )),
            }
        }

        fn literal(&mut self, word: &str, value: Json) -> Result<Json, String> {
            if self.b[self.i..].starts_with(word.as_bytes()) {
                self.i += word.len();
                Ok(value)
            } else {
                Err(format!("bad literal at byte {}", self.i))
            }
        }

        fn hex4(&mut self) -> Result<u32, String> {
            let digits = self
                .b
                .get(self.i..self.i + 4)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad \\u escape at byte {}", self.i))?;
            self.i += 4;
            Ok(digits)
        }

        fn string(&mut self) -> Result<String, String> {
            if self.b.get(self.i) != Some(&b'"') {
                return Err(format!("expected a string at byte {}", self.i));
            }
            self.i += 1;
            let mut out = Vec::new();
            loop {
                let c = *self.b.get(self.i).ok_or("unterminated string")?;
                self.i += 1;
                match c {
                    b'"' => return String::from_utf8(out).map_err(|e| e.to_string()),
                    b'\\' => {
                        let e = *self.b.get(self.i).ok_or("unterminated escape")?;
                        self.i += 1;
                        let ch = match e {
                            b'"' => '"',
                            b'\\' => '\\',
                            b'/' => '/',
                            b'b' => '\u{8}',
                            b'f' => '\u{c}',
                            b'n' => '\n',
                            b'r' => '\r',
                            b't' => '\t',
                            b'u' => {
                                let mut code = self.hex4()?;
                                if (0xd800..0xdc00).contains(&code)
                                    && self.b[self.i..].starts_with(b"\\u")
                                {
                                    self.i += 2;
                                    let low = self.hex4()?;
                                    code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
                                }
                                char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER)
                            }
                            _ => return Err(format!("bad escape at byte {}", self.i)),
                        };
                        let mut buf = [0u8; 4];
                        out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                    }
                    _ => out.push(c),
                }
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::{Json, parse};

        #[test]
        fn parses_a_gateway_reply() {
            let v = parse(
                r#"{"header":{"member_id":"13668033151171901709","revision":"2"},
                   "kvs":[{"key":"Zm9v","version":"1"}],"count":"1","more":false,"x":[],
                   "s":"a\"\u00e9\ud83d\ude00"}"#,
            )
            .expect("valid JSON");
            let header = v.get("header").expect("header");
            assert_eq!(
                header.get("member_id").map(Json::as_u64),
                Some(13_668_033_151_171_901_709)
            );
            assert_eq!(v.get("kvs").map(|k| k.items().len()), Some(1));
            assert_eq!(v.get("more"), Some(&Json::Bool(false)));
            assert_eq!(v.get("s").and_then(Json::as_str), Some("a\"é😀"));
            assert!(parse("{").is_err());
            assert!(parse(r#"{"a":1} x"#).is_err());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{base64_decode, base64_encode, prefix_end};

    #[test]
    fn base64_round_trips() {
        for (raw, text) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (b"\xff\xfe\x00", "//4A"),
        ] {
            assert_eq!(base64_encode(raw), text);
            assert_eq!(base64_decode(text).expect("valid base64"), raw);
        }
        assert!(base64_decode("a*b").is_err());
    }

    #[test]
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(prefix_end(b"dlock:"), b"dlock;");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b""), b"\0");
    }
}
