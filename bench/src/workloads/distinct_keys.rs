//! Distinct keys: many tasks each on a key of its own (throughput), and many locks held at
//! once (renewal traffic and memory per lock).

use std::time::Duration;

use dlock_runtime::{LockError, Runtime};

use crate::baselines::{raw_conn, script_pairs_parallel};
use crate::commandstats;
use crate::report::Row;
use crate::stats::{median, times};
use crate::{BoxError, Setup};

/// `tasks` tasks, each on its own key, `per_task` acquire + release pairs each: pairs per
/// second.
async fn lock_pairs_parallel(rt: &Runtime, tasks: usize, per_task: usize) -> Result<f64, BoxError> {
    super::pairs_per_second(tasks, per_task, |k| {
        let rt = rt.clone();
        async move {
            let key = format!("bench:par:{k}");
            for _ in 0..per_task {
                let guard = rt.lock(key.as_str()).acquire().await?;
                guard.release().await?;
            }
            Ok::<_, BoxError>(())
        }
    })
    .await
}

/// Section `par`: 64 tasks on distinct keys against the runtime's two scripts issued raw, in
/// rounds of 400 pairs a task (about a quarter of a second each), the two one after the other
/// in alternating order; the row gives the median of the rounds' rates and of their ratios
/// (one run of each swung from 0.77x to 1.21x between runs of the program).
pub(crate) async fn parallel_rows(setup: &Setup) -> Result<Vec<Row>, BoxError> {
    let rounds = if setup.options.quick { 1 } else { 5 };
    let per_task = 100 * setup.options.scale();
    let (mut raw, mut ours) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for i in super::alternate(round) {
            if i == 0 {
                ours.push(lock_pairs_parallel(&setup.rt, 64, per_task).await?);
            } else {
                raw.push(script_pairs_parallel(&setup.url, 64, per_task).await?);
            }
        }
    }
    let ratios: Vec<f64> = ours.iter().zip(&raw).map(|(o, r)| o / r).collect();
    let listed: Vec<String> = ratios.iter().map(|&x| times(x)).collect();
    Ok(vec![Row::new(
        "64 tasks, distinct keys",
        format!("{:.0} pairs/s (median of {rounds} rounds)", median(ours)),
        format!("{:.0} pairs/s (same requests, raw)", median(raw)),
        format!("{} (rounds {})", times(median(ratios)), listed.join(", ")),
        ">= 0.8x",
    )])
}

/// This process's resident memory.
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map_or(0, |pages| pages * 4096)
}

struct ManyHeld {
    held: usize,
    renew_calls_per_sec: f64,
    bytes_per_lock: f64,
    all_alive: bool,
}

/// About `count` locks (64 tasks take `count / 64` each) with a 3 s lease, held for `hold`.
async fn many_held(url: &str, count: usize, hold: Duration) -> Result<ManyHeld, BoxError> {
    let rt = super::redis_runtime(url, "many:").await?;
    let mut stats_conn = raw_conn(url).await?;
    let rss_before = rss_bytes();
    let mut set = tokio::task::JoinSet::new();
    let per_task = count / 64;
    for t in 0..64 {
        let rt = rt.clone();
        set.spawn(async move {
            let mut guards = Vec::with_capacity(per_task);
            for i in 0..per_task {
                guards.push(
                    rt.lock(format!("lock:{t}:{i}"))
                        .lease(Duration::from_secs(3))
                        .acquire()
                        .await?,
                );
            }
            Ok::<_, LockError>(guards)
        });
    }
    let mut guards = Vec::with_capacity(count);
    while let Some(r) = set.join_next().await {
        guards.extend(r??);
    }
    let rss_held = rss_bytes();
    let before = commandstats::read(&mut stats_conn).await?;
    tokio::time::sleep(hold).await;
    let after = commandstats::read(&mut stats_conn).await?;
    let renew_calls = commandstats::delta(&before, &after, &["evalsha", "eval"]);
    let all_alive = guards.iter().all(|g| !g.is_lost());
    let dbsize: u64 = redis::cmd("DBSIZE").query_async(&mut stats_conn).await?;
    let held = guards.len();
    for g in guards {
        g.release().await?;
    }
    Ok(ManyHeld {
        held,
        renew_calls_per_sec: renew_calls as f64 / hold.as_secs_f64(),
        bytes_per_lock: rss_held.saturating_sub(rss_before) as f64 / held as f64,
        // every lock hash and its fence counter still present after the hold
        all_alive: all_alive && dbsize >= 2 * held as u64,
    })
}

/// Section `many`: 10,000 locks (2,000 with `--quick`) held for 10 s (4 s).
pub(crate) async fn many_held_rows(setup: &Setup) -> Result<Vec<Row>, BoxError> {
    let quick = setup.options.quick;
    let count = if quick { 2_000 } else { 10_000 };
    let hold = Duration::from_secs(if quick { 4 } else { 10 });
    let many = many_held(&setup.url, count, hold).await?;
    let per_renewal = many.held as f64 / many.renew_calls_per_sec.max(f64::MIN_POSITIVE);
    Ok(vec![
        Row::new(
            format!("{} locks held, 3 s lease, {} s", many.held, hold.as_secs()),
            format!("{:.1} renewal calls/s", many.renew_calls_per_sec),
            format!("{} held locks", many.held),
            format!(
                "1/{per_renewal:.0} of held{}",
                if many.all_alive { "" } else { "; SOME LOST" }
            ),
            "<= 1/50 of held",
        ),
        Row::new(
            "memory per held lock",
            format!("{:.0} bytes", many.bytes_per_lock),
            "",
            "",
            "",
        ),
    ])
}
