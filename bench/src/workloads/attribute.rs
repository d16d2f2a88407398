//! The attribute's cost: an annotated function against the same body written by hand.

use std::time::Instant;

use dlock_runtime::{LockError, Runtime, distributed_lock, lock, with_lock};

use crate::report::Row;
use crate::{BoxError, Setup};

#[distributed_lock(key = "bench:{i}")]
async fn annotated(i: u64) -> Result<u64, LockError> {
    Ok(std::hint::black_box(i) + 1)
}

async fn by_hand(i: u64) -> Result<u64, LockError> {
    let guard = lock(format!("bench:{i}")).acquire().await?;
    let out = std::hint::black_box(i) + 1;
    guard.release().await?;
    Ok(out)
}

/// The same body through `with_lock`: what the attribute expands to, written by hand.
async fn by_with_lock(i: u64) -> Result<u64, LockError> {
    with_lock(lock(format!("bench:{i}")), async {
        Ok(std::hint::black_box(i) + 1)
    })
    .await?
}

/// Nanoseconds per call of `f` over `calls` calls.
async fn ns_per_call(
    calls: u64,
    mut f: impl AsyncFnMut(u64) -> Result<u64, LockError>,
) -> Result<f64, LockError> {
    let t = Instant::now();
    for i in 0..calls {
        f(i % 64).await?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e9 / calls as f64)
}

/// The attribute's cost in one run: best ns a call of the annotated function, of the body
/// with a guard by hand and through `with_lock`, and the medians of the per-round ratios of
/// the annotated function to each.
struct MacroCost {
    annotated: f64,
    hand: f64,
    with_lock: f64,
    to_hand: f64,
    to_with_lock: f64,
}

/// The attribute against the same body by hand and through `with_lock`: many short
/// interleaved rounds on a single-threaded runtime.
fn macro_cost(url: &str, rounds: usize, per_round: u64) -> Result<MacroCost, BoxError> {
    let tokio_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    tokio_rt.block_on(async {
        let rt = Runtime::from_url(url).await?;
        rt.scope(async {
            let mut best = (f64::MAX, f64::MAX, f64::MAX);
            let mut to_hand = Vec::with_capacity(rounds);
            let mut to_with_lock = Vec::with_capacity(rounds);
            for round in 0..rounds + 2 {
                let a = ns_per_call(per_round, annotated).await?;
                let h = ns_per_call(per_round, by_hand).await?;
                let w = ns_per_call(per_round, by_with_lock).await?;
                if round >= 2 {
                    best = (best.0.min(a), best.1.min(h), best.2.min(w));
                    to_hand.push(a / h);
                    to_with_lock.push(a / w);
                }
            }
            Ok::<_, BoxError>(MacroCost {
                annotated: best.0,
                hand: best.1,
                with_lock: best.2,
                to_hand: crate::stats::median(to_hand),
                to_with_lock: crate::stats::median(to_with_lock),
            })
        })
        .await
    })
}

/// Section `macro`: on the memory backend and on the standalone Redis.
pub(crate) async fn rows(setup: &Setup) -> Result<Vec<Row>, BoxError> {
    let scale = setup.options.scale() as u64;
    let mut rows = Vec::new();
    for (engine, url, per_round) in [
        ("memory", "memory://".to_owned(), 2_000 * scale),
        ("redis", setup.url.clone(), 100 * scale),
    ] {
        let cost = tokio::task::spawn_blocking(move || macro_cost(&url, 40, per_round)).await??;
        // One row for each way of writing the call by hand: what follows "call" in the row's
        // name, the form by hand, its best round, the ratio, whose median it is, the target.
        for (against, by_hand, hand_ns, ratio, rounds, target) in [
            (
                "",
                "lock().acquire() + body + release()",
                cost.hand,
                cost.to_hand,
                "of 40 interleaved rounds",
                "<= +2%",
            ),
            (
                " against with_lock",
                "with_lock(lock(..), body)",
                cost.with_lock,
                cost.to_with_lock,
                "of the same rounds",
                "",
            ),
        ] {
            rows.push(Row::new(
                format!("#[distributed_lock] call{against} ({engine} backend)"),
                format!("{:.0} ns (best round)", cost.annotated),
                format!("{hand_ns:.0} ns ({by_hand} by hand, best round)"),
                format!("{:+.1}% (median {rounds})", (ratio - 1.0) * 100.0),
                target,
            ));
        }
    }
    Ok(rows)
}
