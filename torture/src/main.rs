//! The torture program: is mutual exclusion, backed by fencing, still safe when processes are
//! killed, frozen past their lease, and the lock engine restarts?
//!
//! ```text
//! cargo run --release -p dlock-torture -- --engine ENGINE --procs P --tasks T --seconds S --faults LIST
//! ```
//!
//! For each engine it starts the engine's servers and a separate `redis-server` for the store
//! (all from the test process kit, on free loopback ports), then `P` worker processes (this
//! program re-executed with a hidden `worker` subcommand), each running `T` tasks that take
//! one of a few keys in a loop and, holding it, do a fenced read-modify-write of the key's
//! counter in the store ([`worker`]). The memory engine is in-process: its `P × T` tasks run
//! in this process and process faults do not apply. Meanwhile the injector ([`faults`]) kills,
//! pauses and restarts. At the end the workers stop (SIGTERM: each finishes its section), no
//! key may be left locked once the dead-holder bound has passed, and the checker ([`check`])
//! reads the store's log: overlapping holders, stale fences accepted, lost updates. One table
//! row per engine ([`report`]); the exit status is 1 on any violation.
//!
//! Layout: [`cli`] (arguments), [`engine`] (servers, leases, restarts, the keys-left check),
//! [`pool`] (worker processes), [`worker`], [`faults`], [`network`] (each worker's links to
//! the engine, network faults), [`store`] (counters and log), [`check`], [`report`].

mod check;
mod cli;
mod engine;
mod faults;
mod network;
mod pool;
mod report;
mod rng;
mod store;
mod worker;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dlock_testkit::RedisServer;

use crate::cli::{Command, Engine, Fault, Options, USAGE, WorkerArgs};
use crate::engine::{LockEngine, Profile, keys_left};
use crate::faults::{Injected, RunEnd, inject};
use crate::pool::{Failure, Pool};
use crate::report::Row;
use crate::rng::Rng;
use crate::store::{Store, key_name};
use crate::worker::{Stop, Tally, Worker};

/// Slack on the dead-holder bound before the keys-left check (a loaded machine; etcd revokes
/// expired leases in rounds of 500 ms).
const KEYS_LEFT_SLACK: Duration = Duration::from_secs(1);

fn main() -> ExitCode {
    let command = match Command::parse(std::env::args().skip(1)) {
        Ok(command) => command,
        Err(e) => {
            eprintln!("torture: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("torture: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match command {
        Command::Help => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Command::Worker(args) => match runtime.block_on(worker::run_process(args)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("torture worker: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Run(options) => runtime.block_on(run(options)),
    }
}

async fn run(options: Options) -> ExitCode {
    let seed = options.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let faults: Vec<&str> = options.faults.iter().map(|f| f.name()).collect();
    println!(
        "torture: {}: {} worker processes x {} tasks on {} keys, {} s{} per engine, faults {}, seed {seed}",
        options.mode,
        options.procs,
        options.tasks,
        options.keys,
        options.run_for.as_secs(),
        if options.min_sections > 0 {
            format!(" and {} sections", options.min_sections)
        } else {
            String::new()
        },
        if faults.is_empty() {
            "none".to_owned()
        } else {
            faults.join(",")
        },
    );
    if options.no_lock {
        println!(
            "torture: --no-lock: the sections run without the lock; the checker must fail the run"
        );
    }
    let mut rng = Rng::new(seed);
    let mut rows = Vec::new();
    for &engine in &options.engines {
        let profile = Profile::of(engine);
        eprintln!(
            "== {engine}: lease {:?}, dead holder freed within {:?} (+{:?} after a restart), \
             pauses of {:?}",
            profile.lease,
            profile.dead_holder,
            profile.restart_extends,
            profile.pause()
        );
        match run_engine(engine, &options, &mut rng).await {
            Ok(row) => {
                println!("{}", report::render(std::slice::from_ref(&row)));
                rows.push(row);
            }
            Err(e) => {
                eprintln!("torture: {engine}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if rows.len() > 1 {
        println!("{}", report::render(&rows));
    }
    if rows.iter().any(|row| !row.verdict().violations.is_empty()) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// One engine's run: servers, workers and faults, stop, keys-left check, checker.
async fn run_engine(engine: Engine, options: &Options, rng: &mut Rng) -> Result<Row, String> {
    let started = Instant::now();
    let profile = Profile::of(engine);
    let keys: Vec<String> = (0..options.keys).map(key_name).collect();
    let store_server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .map_err(|e| format!("start the store's redis-server: {e}"))?;
    let mut lock_engine = LockEngine::start(engine).await?;
    let end = RunEnd {
        at: Instant::now() + options.run_for,
        sections: options.min_sections,
        store: Store::connect(&store_server.url()).await?,
    };

    let (tally, failures, injected) = if engine.has_processes() {
        let template = worker_args(0, lock_engine.url(), &store_server, options, profile);
        // Each worker through links of its own, where a network fault may need them.
        let links = options
            .faults
            .iter()
            .any(|f| f.is_network())
            .then(|| network::Links::for_engine(&lock_engine))
            .flatten();
        let mut pool = Pool::start(template, options.procs, links)?;
        let faults = (profile, keys.as_slice());
        let injected = inject(
            &mut pool,
            &mut lock_engine,
            &options.faults,
            faults,
            &end,
            rng,
        )
        .await;
        let (tally, failures) = tokio::task::block_in_place(|| pool.stop());
        (tally, failures, Some(injected?))
    } else {
        let (tally, failures) =
            run_in_process(&lock_engine, &store_server, options, profile, &end).await?;
        (tally, failures, None)
    };

    if let Some(Injected {
        last: Some(last),
        last_restart,
        ..
    }) = injected
    {
        let free_at = profile.all_free_at(last, last_restart) + KEYS_LEFT_SLACK;
        tokio::time::sleep(free_at.saturating_duration_since(Instant::now())).await;
    }
    let rt = lock_engine.runtime().await?;
    let keys_left = keys_left(&rt, &keys, options.mode).await;

    let store = &end.store;
    let records = store.records().await?;
    let mut finals = Vec::new();
    for key in &keys {
        finals.push((key.clone(), store.counter(key).await?));
    }
    let findings = check::check(&records, &finals, options.mode);
    Ok(Row {
        engine,
        mode: options.mode,
        faults: options.faults.clone(),
        injected,
        tally,
        findings,
        keys_left,
        failures,
        took: started.elapsed(),
    })
}

/// The arguments of worker `id` on `lock_url`, writing to `store_server`, as `options` and the
/// engine's `profile` say.
fn worker_args(
    id: u32,
    lock_url: String,
    store_server: &RedisServer,
    options: &Options,
    profile: Profile,
) -> WorkerArgs {
    WorkerArgs {
        id,
        lock_url,
        store_url: store_server.url(),
        tasks: options.tasks,
        keys: options.keys,
        lease: profile.lease,
        wait: profile.wait,
        locked: !options.no_lock,
        mode: options.mode,
        block: options.faults.contains(&Fault::Block),
    }
}

/// The memory engine: `procs × tasks` tasks in this process, on the one in-process runtime.
async fn run_in_process(
    lock_engine: &LockEngine,
    store_server: &RedisServer,
    options: &Options,
    profile: Profile,
    end: &RunEnd,
) -> Result<(Tally, Vec<Failure>), String> {
    let rt = lock_engine.runtime().await?;
    let store = Store::connect(&store_server.url()).await?;
    let stop = Stop::default();
    let runs: Vec<_> = (1..=options.procs)
        .map(|id| {
            let args = worker_args(
                id as u32,
                "memory://".into(),
                store_server,
                options,
                profile,
            );
            let worker = Arc::new(Worker::new(&args, rt.clone(), store.clone()));
            tokio::spawn(worker.run(options.tasks, stop.clone()))
        })
        .collect();
    tokio::time::sleep(end.at.saturating_duration_since(Instant::now())).await;
    while !end.reached().await? {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.set();
    let mut tally = Tally::default();
    let mut failures = Vec::new();
    for (i, run) in runs.into_iter().enumerate() {
        match run.await {
            Ok(t) => tally.add(t),
            Err(e) => failures.push(Failure {
                id: i as u32 + 1,
                what: format!("in-process worker failed: {e}"),
                log_tail: String::new(),
            }),
        }
    }
    Ok((tally, failures))
}
