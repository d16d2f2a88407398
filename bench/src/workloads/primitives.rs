//! Section `prim`: read locks and semaphores on Redis, each against the plain lock in the same
//! run.
//!
//! - 8 tasks in one process, each taking one key in a loop with a short critical section
//!   (1 ms asleep), under a read lock against under the exclusive lock: sections per second.
//!   Readers hold together; the exclusive holders take turns (handed over within the process).
//! - Sequential acquire + release of one permit of a semaphore of 8 against the plain lock,
//!   interleaved rounds of 100: p50.

use std::time::{Duration, Instant};

use dlock_runtime::Runtime;

use super::redis_runtime;
use crate::report::Row;
use crate::stats::{p50, ratio, sorted, times, us};
use crate::{BoxError, Setup};

/// Tasks contending in the throughput rows.
const TASKS: usize = 8;

/// The critical section of the throughput rows.
const SECTION: Duration = Duration::from_millis(1);

/// The semaphore's size in the latency row.
const PERMITS: u32 = 8;

/// How a task takes the key.
#[derive(Clone, Copy)]
enum Take {
    Read,
    Exclusive,
    Permit,
}

async fn acquire(
    rt: &Runtime,
    key: &str,
    take: Take,
) -> Result<dlock_runtime::LockGuard, BoxError> {
    let lock = match take {
        Take::Read => rt.lock(key).read(),
        Take::Exclusive => rt.lock(key),
        Take::Permit => rt.semaphore(key, PERMITS),
    };
    Ok(lock.wait(Duration::from_secs(10)).acquire().await?)
}

/// Sections per second of `TASKS` tasks taking `key` for `run_for`.
async fn throughput(
    rt: &Runtime,
    key: &str,
    take: Take,
    run_for: Duration,
) -> Result<f64, BoxError> {
    let started = Instant::now();
    let end = started + run_for;
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let rt = rt.clone();
        let key = key.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut sections = 0u64;
            while Instant::now() < end {
                let guard = acquire(&rt, &key, take).await?;
                tokio::time::sleep(SECTION).await;
                guard.release().await?;
                sections += 1;
            }
            Ok::<u64, BoxError>(sections)
        }));
    }
    let mut sections = 0;
    for task in tasks {
        sections += task.await??;
    }
    Ok(sections as f64 / started.elapsed().as_secs_f64())
}

/// `n` sequential acquire + release pairs of `key`.
async fn pairs(rt: &Runtime, key: &str, take: Take, n: usize) -> Result<Vec<Duration>, BoxError> {
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        acquire(rt, key, take).await?.release().await?;
        lat.push(t.elapsed());
    }
    Ok(lat)
}

pub(crate) async fn rows(setup: &Setup) -> Result<Vec<Row>, BoxError> {
    let rt = redis_runtime(&setup.url, "bench-prim:").await?;
    let run_for = if setup.options.quick {
        Duration::from_millis(500)
    } else {
        Duration::from_secs(2)
    };
    let (mut read, mut exclusive) = (0.0, 0.0);
    for _ in 0..2 {
        exclusive += throughput(&rt, "bench:prim:rw", Take::Exclusive, run_for).await?;
        read += throughput(&rt, "bench:prim:rw", Take::Read, run_for).await?;
    }
    let (mut permit, mut plain) = (Vec::new(), Vec::new());
    pairs(&rt, "bench:prim:sem", Take::Permit, 50).await?;
    for _ in 0..5 * setup.options.scale() {
        plain.extend(pairs(&rt, "bench:prim:lock", Take::Exclusive, 100).await?);
        permit.extend(pairs(&rt, "bench:prim:sem", Take::Permit, 100).await?);
    }
    let (permit, plain) = (sorted(permit), sorted(plain));
    Ok(vec![
        Row::new(
            format!("{TASKS} readers vs one exclusive lock, one key, 1 ms sections (sections/s)"),
            format!("{:.0}/s read", read / 2.0),
            format!("{:.0}/s exclusive", exclusive / 2.0),
            format!("{:.2}x throughput", read / exclusive),
            "",
        ),
        Row::new(
            format!(
                "semaphore ({PERMITS} permits) acquire+release vs the plain lock, sequential p50"
            ),
            us(p50(&permit)),
            format!("{} (plain lock)", us(p50(&plain))),
            times(ratio(p50(&permit), p50(&plain))),
            "",
        ),
    ])
}
