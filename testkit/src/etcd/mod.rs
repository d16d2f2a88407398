//! etcd for one test: [`EtcdServer::start`] runs one member, [`EtcdCluster::start`] forms a
//! cluster of `n` members, each on its own pair of free loopback ports (client and peer, never
//! 2379/2380) with its data dir and log in one temp dir. Every member is killed (SIGKILL, by
//! PID) when the handle drops; if the test is failing then, every member's log is printed.
//!
//! A member counts as ready when its own process logged that it serves clients (so a
//! neighbour's server on a reused port cannot pass for it) and it is healthy: it knows a leader
//! and answers a linearizable read. Heartbeat and election timeout stay at etcd's defaults
//! (100 ms / 1 s): a leader killed with SIGKILL is replaced within about 1–2 s on an idle box.
//!
//! Faults: [`kill9`](EtcdCluster::kill9), [`stop`](EtcdCluster::stop),
//! [`pause`](EtcdCluster::pause) / [`resume`](EtcdCluster::resume) (SIGSTOP / SIGCONT),
//! [`restart`](EtcdCluster::restart) (same ports, same data: the member rejoins).
//! Inspection goes through the `etcd-client` crate: [`get`](EtcdCluster::get),
//! [`get_prefix`](EtcdCluster::get_prefix), [`put`](EtcdCluster::put),
//! [`delete`](EtcdCluster::delete), leases ([`lease_ttl`](EtcdCluster::lease_ttl), ...),
//! [`status`](EtcdCluster::status), [`leader_index`](EtcdCluster::leader_index) and
//! [`wait_for_leader`](EtcdCluster::wait_for_leader). These calls block the calling thread (from
//! an async test, call them inside `tokio::task::block_in_place`).
//!
//! The binary is `etcd` on `PATH`, or [`ETCD_ENV`] (`DLOCK_ETCD`). Debian: `etcd-server`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::process::{
    Binary, Probe, TestProcess, find_binary, loopback_hosts, start_on_free_ports, temp_dir,
};

mod inspect;

pub use inspect::{EtcdKv, MemberStatus};

/// The environment variable naming the `etcd` binary (default: `etcd` on `PATH`).
pub const ETCD_ENV: &str = "DLOCK_ETCD";

/// Bound on a fresh start (all members ready, a leader elected), per attempt; and on a restart.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// Logged by an etcd process once it serves client requests on its client listener.
const SERVING_MARKER: &str = "serving client traffic";

#[derive(Debug)]
struct Member {
    process: TestProcess,
    client_port: u16,
    peer_port: u16,
}

/// A cluster of etcd members owned by one test.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    /// Last: deleted after the processes are killed.
    dir: tempfile::TempDir,
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
        let dir = temp_dir("dlock-etcd-");
        let mut attempt = 0;
        let members = start_on_free_ports(&format!("an etcd cluster of {n}"), 2 * n, |ports| {
            attempt += 1;
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let token = format!("dlock-test-{}-{nanos}-{attempt}", std::process::id());
            let peers: Vec<String> = (0..n)
                .map(|i| format!("n{i}=http://127.0.0.1:{}", ports[2 * i + 1]))
                .collect();
            let mut members = Vec::with_capacity(n);
            for i in 0..n {
                // A fresh data dir and log for each attempt.
                let _ = std::fs::remove_dir_all(dir.path().join(format!("n{i}")));
                let _ = std::fs::remove_file(dir.path().join(format!("n{i}.log")));
                let (client_port, peer_port) = (ports[2 * i], ports[2 * i + 1]);
                let mut process =
                    member_process(&bin, dir.path(), i, client_port, peer_port, &peers, &token);
                process.spawn()?;
                members.push(Member {
                    process,
                    client_port,
                    peer_port,
                });
            }
            let deadline = Instant::now() + READY_WITHIN;
            for member in &mut members {
                member.process.wait_ready(deadline)?;
            }
            Ok(members)
        });
        EtcdCluster { members, dir }
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
        let hosts = loopback_hosts(self.members.iter().map(|m| m.client_port));
        format!("etcd://{hosts}")
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
        self.members[i].process.pid()
    }

    /// Whether member `i` has a process (running or paused).
    pub fn is_running(&self, i: usize) -> bool {
        self.members[i].process.is_running()
    }

    /// Whether member `i` is frozen by [`pause`](EtcdCluster::pause).
    pub fn is_paused(&self, i: usize) -> bool {
        self.members[i].process.is_paused()
    }

    /// The temp dir holding every member's data dir (`n<i>/`) and log (`n<i>.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills member `i` with SIGKILL and reaps it. Ports and data stay for
    /// [`restart`](EtcdCluster::restart).
    pub fn kill9(&mut self, i: usize) {
        self.members[i].process.kill9();
    }

    /// Stops member `i` with SIGTERM (SIGKILL after 5 s) and reaps it.
    pub fn stop(&mut self, i: usize) {
        self.members[i].process.stop();
    }

    /// Freezes member `i` with SIGSTOP: connections stay open, requests go unanswered, its
    /// heartbeats stop (a paused leader is replaced by the others).
    pub fn pause(&mut self, i: usize) {
        self.members[i].process.pause();
    }

    /// Resumes member `i` frozen by [`pause`](EtcdCluster::pause) with SIGCONT.
    pub fn resume(&mut self, i: usize) {
        self.members[i].process.resume();
    }

    /// Starts member `i` again (stopping it first if it runs) on the same ports with the same
    /// data dir, and waits until it is ready: it has rejoined and knows a leader, which needs a
    /// quorum of members running.
    pub fn restart(&mut self, i: usize) {
        self.members[i].process.restart();
    }

    /// Member `i`'s log so far.
    pub fn log(&self, i: usize) -> String {
        self.members[i].process.log()
    }

    /// Indices of members running and not paused.
    fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.len()).filter(|&i| self.is_running(i) && !self.is_paused(i))
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

    /// Whether the member is healthy (see [`EtcdCluster::is_healthy`]).
    pub fn is_healthy(&self) -> bool {
        self.cluster.is_healthy(0)
    }

    /// The server log so far.
    pub fn log(&self) -> String {
        self.cluster.log(0)
    }
}

/// An [`EtcdServer`] is its one-member cluster: `etcd.get(..)`, `etcd.put(..)`, ...
impl std::ops::Deref for EtcdServer {
    type Target = EtcdCluster;

    fn deref(&self) -> &EtcdCluster {
        &self.cluster
    }
}

fn etcd_binary() -> Binary {
    find_binary(
        ETCD_ENV,
        "etcd",
        "--version",
        "install it with `apt-get install -y etcd-server` (or run scripts/test as root)",
    )
}

/// Member `i` of a new cluster whose peers are `peers` (`n<j>=http://127.0.0.1:<peer port>`),
/// with its data dir `n<i>/` and log `n<i>.log` in `dir`.
fn member_process(
    bin: &Binary,
    dir: &Path,
    i: usize,
    client_port: u16,
    peer_port: u16,
    peers: &[String],
    token: &str,
) -> TestProcess {
    let client_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let mut command = Command::new(&bin.path);
    command
        .args(["--name", &format!("n{i}")])
        .arg("--data-dir")
        .arg(dir.join(format!("n{i}")))
        .args(["--listen-client-urls", &client_url])
        .args(["--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &peers.join(",")])
        .args(["--initial-cluster-state", "new"])
        .args(["--initial-cluster-token", token])
        .args(["--logger", "zap", "--log-outputs", "stderr"]);
    if cfg!(target_arch = "aarch64") {
        // etcd 3.4 refuses to start on arm64 without this.
        command.env("ETCD_UNSUPPORTED_ARCH", "arm64");
    }
    let log: PathBuf = dir.join(format!("n{i}.log"));
    TestProcess::new(
        format!("etcd member {i} (client port {client_port}, peer port {peer_port})"),
        command,
        log,
    )
    .ready_when(READY_WITHIN, move |_, log| {
        if log.contains(SERVING_MARKER) && inspect::healthy(&client_url, inspect::PROBE_TIMEOUT) {
            Probe::Ready
        } else {
            Probe::NotYet
        }
    })
}
