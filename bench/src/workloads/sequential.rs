//! Sequential latency: one acquire + release after another, against two raw `EVALSHA` round
//! trips in interleaved rounds.

use std::time::{Duration, Instant};

use dlock_runtime::Runtime;

use crate::report::Row;
use crate::stats::{p50, percentile, sorted};
use crate::{BoxError, Setup, baselines};

/// `n` acquire + release pairs of one key on `rt`, after `n / 10` unmeasured.
pub(crate) async fn lock_pairs(rt: &Runtime, n: usize) -> Result<Vec<Duration>, BoxError> {
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let t = Instant::now();
        let guard = rt.lock("bench:seq").acquire().await?;
        guard.release().await?;
        if i >= n / 10 {
            lat.push(t.elapsed());
        }
    }
    Ok(lat)
}

/// `rounds` rounds of `baseline` then `ours`, so that drift on this shared machine hits both
/// series alike. Returns both series, sorted.
pub(crate) async fn interleaved(
    rounds: usize,
    mut baseline: impl AsyncFnMut() -> Result<Vec<Duration>, BoxError>,
    mut ours: impl AsyncFnMut() -> Result<Vec<Duration>, BoxError>,
) -> Result<(Vec<Duration>, Vec<Duration>), BoxError> {
    let (mut base, mut mine) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        base.extend(baseline().await?);
        mine.extend(ours().await?);
    }
    Ok((sorted(base), sorted(mine)))
}

/// Section `seq`: p50 and p99 of acquire + release against 2 raw `EVALSHA`, and against the
/// runtime's own requests issued raw, in interleaved rounds of 100.
pub(crate) async fn rows(setup: &Setup) -> Result<Vec<Row>, BoxError> {
    let (url, rt) = (&setup.url, &setup.rt);
    let (mut floor, mut same, mut ours) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..10 * setup.options.scale() {
        floor.extend(baselines::evalsha_pairs(url, 100).await?);
        same.extend(baselines::raw_request_pairs(url, 100).await?);
        ours.extend(lock_pairs(rt, 100).await?);
    }
    let (floor, same, ours) = (sorted(floor), sorted(same), sorted(ours));
    let what = "sequential acquire+release";
    let (o99, f99) = (percentile(&ours, 0.99), percentile(&floor, 0.99));
    Ok(vec![
        Row::versus(
            format!("{what}, p50"),
            p50(&ours),
            p50(&floor),
            "2 raw EVALSHA",
            "<= 1.1x",
        ),
        Row::versus(format!("{what}, p99"), o99, f99, "2 raw EVALSHA", ""),
        Row::versus(
            format!("{what}, p50, against its own requests sent raw"),
            p50(&ours),
            p50(&same),
            "the same pipeline + release script, no runtime",
            "",
        ),
    ])
}
