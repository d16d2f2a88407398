//! A scheduled job run by several processes on one interval, executed once per period:
//! `hold_at_least` (ShedLock's `lockAtLeastFor`).
//!
//! ```text
//! #[distributed_lock(key = "job:report", lease = "1900ms", watchdog = false, hold_at_least = "1500ms")]
//! async fn report(period: u64, node: u32) -> Result<(), LockError>   // done in 50 ms
//! ```
//!
//! Every node fires at each 2 s boundary of the wall clock, but node `N`'s clock is `N × 300 ms`
//! late (clocks of different machines never agree). The job itself takes 50 ms: without
//! `hold_at_least` the lock would be free again when the late nodes fire, and the job would run
//! two or three times in one period. With it, the key stays taken for 1.5 s after the first
//! node took it, so the late nodes find it taken (`LockError::Timeout`, no wait) and skip.
//! `lease = "1900ms"` with `watchdog = false` is the "at most": a node that dies mid-job
//! blocks the key for under one period.
//!
//! Each node prints one line per period, `period P: ran on node N` or `period P: skipped on
//! node N`. Three nodes on one Redis, five periods each:
//!
//! ```text
//! for n in 0 1 2; do DLOCK_URL=redis://127.0.0.1:6379 cargo run -p dlock-examples --bin scheduled -- --node $n --periods 5 & done; wait
//! ```
//!
//! Without `DLOCK_URL` it runs on the in-process memory engine (one node only).

use std::error::Error;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dlock_runtime::{LockError, Runtime, distributed_lock};

type BoxError = Box<dyn Error + Send + Sync>;

/// The job's interval.
const PERIOD: Duration = Duration::from_secs(2);
/// How late each node's clock is, times its number.
const SKEW: Duration = Duration::from_millis(300);
/// How long one run of the job takes.
const WORK: Duration = Duration::from_millis(50);

/// The job: runs at most once per period across every node.
#[distributed_lock(
    key = "job:report",
    lease = "1900ms",
    watchdog = false,
    hold_at_least = "1500ms"
)]
async fn report(period: u64, node: u32) -> Result<(), LockError> {
    println!("period {period}: ran on node {node}");
    tokio::time::sleep(WORK).await;
    Ok(())
}

/// `--node N --periods P` (defaults 0 and 5).
fn args() -> Result<(u32, u64), BoxError> {
    let (mut node, mut periods) = (0, 5);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().ok_or_else(|| format!("{arg} needs a value"))?;
        match arg.as_str() {
            "--node" => node = value.parse()?,
            "--periods" => periods = value.parse()?,
            other => {
                return Err(format!("unknown argument {other}; expected --node, --periods").into());
            }
        }
    }
    Ok((node, periods))
}

/// The wall clock since the epoch.
fn now() -> Result<Duration, BoxError> {
    Ok(SystemTime::now().duration_since(UNIX_EPOCH)?)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (node, periods) = args()?;
    Runtime::from_env().await?.install()?;
    let period_ms = PERIOD.as_millis();
    // The first whole period that starts from now, and the ones after it.
    let first = u64::try_from(now()?.as_millis() / period_ms + 1)?;
    for period in first..first + periods {
        // This node fires `node × SKEW` after the period's start.
        let fire_at = Duration::from_millis(period * u64::try_from(period_ms)?) + SKEW * node;
        tokio::time::sleep(fire_at.saturating_sub(now()?)).await;
        match report(period, node).await {
            Ok(()) => {}
            Err(err) if err.is_timeout() => println!("period {period}: skipped on node {node}"),
            Err(err) => return Err(err.into()),
        }
    }
    Ok(())
}
