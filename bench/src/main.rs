//! The benchmark program: every figure next to a baseline measured in the same run.
//!
//! ```text
//! cargo run --release -p dlock-bench                         # full run, about a minute
//! cargo run --release -p dlock-bench -- --quick              # smaller counts
//! cargo run --release -p dlock-bench -- --only seq,hot       # some sections only
//! cargo run --release -p dlock-bench --features cp-engines   # with etcd and ZooKeeper
//! ```
//!
//! It starts its own `redis-server` (override with `DLOCK_REDIS_SERVER`) on a free loopback
//! port with no persistence, and prints one Markdown table, a section per workload family:
//! - `seq`: sequential acquire + release, against two raw `EVALSHA` round trips of a trivial
//!   script;
//! - `par`: 64 tasks on distinct keys, against the same two raw calls issued by 64 tasks;
//! - `hot`: a hot key: 256 tasks in one process on one key, critical section `GET` + `SET` of a
//!   counter; sales/s, handoff latency (release sent by one holder to acquisition by the next,
//!   against one raw round trip), and Redis commands per sale from `INFO commandstats`;
//! - `many`: 10,000 locks held at once with a 3 s lease for 10 s: renewal calls per second and
//!   the process's memory per held lock;
//! - `macro`: the attribute's cost: an annotated function against the same body written by
//!   hand with `lock().acquire()` + body + `release()`, on the memory and Redis backends;
//! - `multi`: Redlock (3 and 5 nodes) and a Cluster (3 masters, a replica each) against
//!   standalone Redis, and the floor of a fan-out on this machine;
//! - `cp` (feature `cp-engines`): etcd and ZooKeeper against their own raw round trips;
//! - `peer`: dlock against rslock 0.10 in the same run: sequential latency, commands per
//!   acquire + release, distinct keys, a hot key in one process and across 4 processes (the
//!   program re-executed with the hidden `peer-worker` subcommand);
//! - `prim`: read locks and semaphores: 8 tasks reading under a read lock against the same
//!   under the exclusive lock (throughput), and a semaphore's sequential acquire + release
//!   against the plain lock's.
//! - `multikey`: a multi-key lock of two keys on one server (one script) against one key.
//!
//! Layout: [`options`] reads the command line, [`workloads`] holds one module per family,
//! [`baselines`] the raw client calls they are compared with, [`stats`] percentiles and ratios,
//! [`commandstats`] Redis's command counters, [`report`] the table. Every server process comes
//! from the test process kit (`dlock-testkit`) through [`start`], and is killed by PID when its
//! handle drops.

mod baselines;
mod commandstats;
mod cpu;
mod options;
mod report;
mod stats;
mod workloads;

use std::error::Error;

use dlock_runtime::Runtime;
use dlock_testkit::RedisServer;

use crate::options::{Options, Section};
use crate::workloads::{
    attribute, distinct_keys, fan_out, hot_key, multi_key, peer, primitives, sequential,
};

type BoxError = Box<dyn Error + Send + Sync>;

/// What every section gets: the standalone server's URL, a runtime on it, and the options.
struct Setup {
    url: String,
    /// The standalone server's process id (its CPU time is read by some rows).
    server_pid: u32,
    rt: Runtime,
    options: Options,
}

/// Runs `start`, a test process kit call that blocks until its server serves, off the async
/// workers. The kit panics with installation advice when a binary is missing; that panic
/// becomes this error.
async fn start<T: Send + 'static>(
    start: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BoxError> {
    Ok(tokio::task::spawn_blocking(start).await?)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some((first, rest)) = args.split_first()
        && first == peer::worker::SUBCOMMAND
    {
        return peer::worker::run(rest).await;
    }
    let options = match Options::parse(args) {
        Ok(Some(options)) => options,
        Ok(None) => {
            println!("{}", options::USAGE);
            return Ok(());
        }
        Err(e) => {
            eprintln!("dlock-bench: {e}\n\n{}", options::USAGE);
            std::process::exit(2);
        }
    };
    let server = start(RedisServer::start).await?;
    let url = server.url();
    let rt = Runtime::builder().redis(&url).build().await?;
    let setup = Setup {
        url,
        server_pid: server.pid(),
        rt,
        options,
    };

    // Warm up connections, scripts and the allocator.
    sequential::lock_pairs(&setup.rt, 500).await?;
    baselines::evalsha_pairs(&setup.url, 500).await?;

    let mut rows = Vec::new();
    for section in Section::ALL {
        if !setup.options.wants(section) {
            continue;
        }
        rows.extend(match section {
            Section::Seq => sequential::rows(&setup).await?,
            Section::Par => distinct_keys::parallel_rows(&setup).await?,
            Section::Hot => hot_key::rows(&setup).await?,
            Section::Many => distinct_keys::many_held_rows(&setup).await?,
            Section::Macro => attribute::rows(&setup).await?,
            Section::Multi => fan_out::rows(&setup).await?,
            Section::Cp => workloads::cp_rows(&setup).await?,
            Section::Peer => peer::rows(&setup).await?,
            Section::Prim => primitives::rows(&setup).await?,
            Section::MultiKey => multi_key::rows(&setup).await?,
        });
    }
    report::print(&rows);
    drop(server);
    Ok(())
}
