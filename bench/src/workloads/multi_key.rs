//! Section `multikey`: a multi-key lock (`lock_all`) of two keys on one server, which one
//! script takes at once, against a one-key lock, in interleaved rounds.

use std::time::{Duration, Instant};

use dlock_runtime::Runtime;

use crate::report::Row;
use crate::stats::{p50, percentile};
use crate::workloads::sequential::{interleaved, lock_pairs};
use crate::{BoxError, Setup};

/// `n` acquire + release pairs of the two-key set on `rt`, after `n / 10` unmeasured.
async fn lock_all_pairs(rt: &Runtime, n: usize) -> Result<Vec<Duration>, BoxError> {
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let t = Instant::now();
        let guard = rt
            .lock_all(["bench:multikey:a", "bench:multikey:b"])
            .acquire()
            .await?;
        guard.release().await?;
        if i >= n / 10 {
            lat.push(t.elapsed());
        }
    }
    Ok(lat)
}

/// p50 and p99 of a two-key set's acquire + release against one key's, in interleaved rounds
/// of 100.
pub(crate) async fn rows(setup: &Setup) -> Result<Vec<Row>, BoxError> {
    let rt = &setup.rt;
    let (one, two) = interleaved(
        10 * setup.options.scale(),
        async || lock_pairs(rt, 100).await,
        async || lock_all_pairs(rt, 100).await,
    )
    .await?;
    let what = "multi-key (2 keys, one slot) acquire+release";
    Ok(vec![
        Row::versus(
            format!("{what}, p50"),
            p50(&two),
            p50(&one),
            "1 key acquire+release",
            "",
        ),
        Row::versus(
            format!("{what}, p99"),
            percentile(&two, 0.99),
            percentile(&one, 0.99),
            "1 key, p99",
            "",
        ),
    ])
}
