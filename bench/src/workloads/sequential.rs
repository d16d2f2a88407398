//! Sequential latency: one acquire + release after another, against two raw `EVALSHA` round
//! trips in interleaved rounds.

use std::time::{Duration, Instant};

use dlock_runtime::Runtime;

use crate::report::Row;
use crate::stats::{median, p50, percentile, ratio, sorted, times, us};
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
    baseline: impl AsyncFnMut() -> Result<Vec<Duration>, BoxError>,
    ours: impl AsyncFnMut() -> Result<Vec<Duration>, BoxError>,
) -> Result<(Vec<Duration>, Vec<Duration>), BoxError> {
    let run = interleaved_rounds(rounds, baseline, ours).await?;
    Ok((run.base, run.ours))
}

/// Both series of [`interleaved_rounds`], and the ratio of `ours` to the baseline in each
/// round (p50 against p50).
pub(crate) struct Rounds {
    pub(crate) base: Vec<Duration>,
    pub(crate) ours: Vec<Duration>,
    pub(crate) ratios: Vec<f64>,
}

impl Rounds {
    /// "1.23x (median of 20 rounds' ratios", the caller closing the parenthesis.
    pub(crate) fn median_ratio(&self) -> String {
        median_of_rounds(&self.ratios)
    }

    /// The lowest and the highest round's ratio.
    pub(crate) fn range(&self) -> (f64, f64) {
        self.ratios
            .iter()
            .fold((f64::MAX, 0.0_f64), |(lo, hi), &x| (lo.min(x), hi.max(x)))
    }
}

/// "1.23x (median of 20 rounds' ratios" for `ratios`, the caller closing the parenthesis.
fn median_of_rounds(ratios: &[f64]) -> String {
    format!(
        "{} (median of {} rounds' ratios",
        times(median(ratios.to_vec())),
        ratios.len()
    )
}

/// [`interleaved`], keeping each round's ratio: a round's two series are measured within
/// milliseconds of each other, so the median of the rounds' ratios moves less with whatever
/// else the machine does than the ratio of the pooled series.
pub(crate) async fn interleaved_rounds(
    rounds: usize,
    mut baseline: impl AsyncFnMut() -> Result<Vec<Duration>, BoxError>,
    mut ours: impl AsyncFnMut() -> Result<Vec<Duration>, BoxError>,
) -> Result<Rounds, BoxError> {
    let (mut base, mut mine, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let b = sorted(baseline().await?);
        let o = sorted(ours().await?);
        ratios.push(ratio(p50(&o), p50(&b)));
        base.extend(b);
        mine.extend(o);
    }
    Ok(Rounds {
        base: sorted(base),
        ours: sorted(mine),
        ratios,
    })
}

/// Section `seq`: p50 and p99 of acquire + release against 2 raw `EVALSHA`, and against the
/// runtime's own requests issued raw, in interleaved rounds of 100; the target row gives the
/// median of the rounds' ratios (see [`interleaved_rounds`]) beside the pooled one.
pub(crate) async fn rows(setup: &Setup) -> Result<Vec<Row>, BoxError> {
    let (url, rt) = (&setup.url, &setup.rt);
    let (mut floor, mut same, mut ours) = (Vec::new(), Vec::new(), Vec::new());
    let mut ratios = Vec::new();
    for _ in 0..10 * setup.options.scale() {
        let round_floor = baselines::evalsha_pairs(url, 100).await?;
        same.extend(baselines::raw_request_pairs(url, 100).await?);
        let round = sorted(lock_pairs(rt, 100).await?);
        ratios.push(ratio(p50(&round), p50(&round_floor)));
        floor.extend(round_floor);
        ours.extend(round);
    }
    let (floor, same, ours) = (sorted(floor), sorted(same), sorted(ours));
    let what = "sequential acquire+release";
    let (o99, f99) = (percentile(&ours, 0.99), percentile(&floor, 0.99));
    Ok(vec![
        Row::new(
            format!("{what}, p50"),
            us(p50(&ours)),
            format!("{} (2 raw EVALSHA)", us(p50(&floor))),
            format!(
                "{}; pooled {})",
                median_of_rounds(&ratios),
                times(ratio(p50(&ours), p50(&floor)))
            ),
            "<= 1.1x",
        ),
        Row::versus(format!("{what}, p99"), o99, f99, "2 raw EVALSHA", ""),
        client_row(url, setup.options.scale()).await?,
        Row::versus(
            format!("{what}, p50, against its own requests sent raw"),
            p50(&ours),
            p50(&same),
            "the same pipeline + release script, no runtime",
            "",
        ),
    ])
}

/// One round trip through the client library every engine and baseline here uses, against
/// the same request written and read by the calling task on a plain socket, in interleaved
/// rounds: what the library's connection (a task of its own that writes the requests queued
/// to it and reads the replies) adds to a round trip on this machine.
async fn client_row(url: &str, scale: usize) -> Result<Row, BoxError> {
    let run = interleaved_rounds(
        10 * scale,
        async || baselines::socket_evalsha(url, 100).await,
        async || baselines::client_evalsha(url, 100).await,
    )
    .await?;
    Ok(Row::new(
        "1 raw EVALSHA, p50: redis client library against a plain socket",
        us(p50(&run.ours)),
        format!(
            "{} (written and read by the calling task)",
            us(p50(&run.base))
        ),
        format!("{})", run.median_ratio()),
        "",
    ))
}
