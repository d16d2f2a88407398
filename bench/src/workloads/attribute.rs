//! The attribute's cost: an annotated function against the same body written by hand.

use std::time::Instant;

use dlock_runtime::{LockError, Runtime, distributed_lock, lock};

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

/// The attribute against the same body by hand: many short interleaved rounds on a
/// single-threaded runtime; returns (best annotated ns/call, best by-hand ns/call, median of
/// the per-round ratios).
fn macro_cost(url: &str, rounds: usize, per_round: u64) -> Result<(f64, f64, f64), BoxError> {
    let tokio_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    tokio_rt.block_on(async {
        let rt = Runtime::from_url(url).await?;
        rt.scope(async {
            let mut best = (f64::MAX, f64::MAX);
            let mut ratios = Vec::with_capacity(rounds);
            for round in 0..rounds + 2 {
                let a = ns_per_call(per_round, annotated).await?;
                let h = ns_per_call(per_round, by_hand).await?;
                if round >= 2 {
                    best = (best.0.min(a), best.1.min(h));
                    ratios.push(a / h);
                }
            }
            ratios.sort_by(f64::total_cmp);
            Ok::<_, BoxError>((best.0, best.1, ratios[ratios.len() / 2]))
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
        let (annotated, hand, ratio) =
            tokio::task::spawn_blocking(move || macro_cost(&url, 40, per_round)).await??;
        rows.push(Row::new(
            format!("#[distributed_lock] call ({engine} backend)"),
            format!("{annotated:.0} ns (best round)"),
            format!("{hand:.0} ns (lock().acquire() + body + release() by hand, best round)"),
            format!(
                "{:+.1}% (median of 40 interleaved rounds)",
                (ratio - 1.0) * 100.0
            ),
            "<= +2%",
        ));
    }
    Ok(rows)
}
