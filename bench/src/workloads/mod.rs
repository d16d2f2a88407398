//! The workloads, one module per family; each section returns its rows of the table.

pub(crate) mod attribute;
#[cfg(feature = "cp-engines")]
mod cp;
pub(crate) mod distinct_keys;
pub(crate) mod fan_out;
pub(crate) mod hot_key;
pub(crate) mod multi_key;
pub(crate) mod peer;
pub(crate) mod primitives;
pub(crate) mod sequential;

use std::time::Instant;

use dlock_runtime::Runtime;

use crate::report::Row;
use crate::{BoxError, Setup};

/// The order two contenders (0 and 1; in the `peer` section dlock and rslock) run in round
/// `round`: alternating, so that neither always goes first.
fn alternate(round: usize) -> [usize; 2] {
    if round.is_multiple_of(2) {
        [0, 1]
    } else {
        [1, 0]
    }
}

/// Runs `task(k)` for every `k` in `0..tasks` at once, each task making `per_task` acquire +
/// release pairs: pairs per second, from before the first task starts to the end of the last.
pub(crate) async fn pairs_per_second<F>(
    tasks: usize,
    per_task: usize,
    mut task: impl FnMut(usize) -> F,
) -> Result<f64, BoxError>
where
    F: Future<Output = Result<(), BoxError>> + Send + 'static,
{
    let t = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for k in 0..tasks {
        set.spawn(task(k));
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok((tasks * per_task) as f64 / t.elapsed().as_secs_f64())
}

/// A runtime of its own on the standalone server, its keys under `prefix`, so that a workload
/// shares neither connections nor keys with the others.
async fn redis_runtime(url: &str, prefix: &str) -> Result<Runtime, BoxError> {
    Ok(Runtime::builder()
        .redis(url)
        .key_prefix(prefix)
        .build()
        .await?)
}

/// The etcd and ZooKeeper rows; without the `cp-engines` feature none, and a note on stderr.
pub(crate) async fn cp_rows(setup: &Setup) -> Result<Vec<Row>, BoxError> {
    #[cfg(feature = "cp-engines")]
    return cp::rows(setup).await;
    #[cfg(not(feature = "cp-engines"))]
    {
        let _ = setup;
        eprintln!("etcd and ZooKeeper rows: run with --features cp-engines");
        Ok(Vec::new())
    }
}
