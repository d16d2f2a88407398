//! Fan-out: Redlock on 3 and 5 nodes and a Redis Cluster of 3 masters (each with a replica),
//! against standalone Redis: sequential latency in interleaved rounds, and hot-key handoff.

use std::time::Duration;

use dlock_runtime::Runtime;
use dlock_testkit::RedisServer;
use dlock_testkit::cluster::RedisCluster;

use crate::report::Row;
use crate::stats::{median, p50, ratio, times, us};
use crate::workloads::{hot_key, sequential};
use crate::{BoxError, Setup, baselines, start};

/// `n` standalone servers, for Redlock.
async fn nodes(n: usize) -> Result<Vec<RedisServer>, BoxError> {
    start(move || (0..n).map(|_| RedisServer::start()).collect()).await
}

fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(RedisServer::url).collect()
}

/// Section `multi`.
pub(crate) async fn rows(setup: &Setup) -> Result<Vec<Row>, BoxError> {
    let scale = setup.options.scale();
    let mut rows = Vec::new();
    let three = nodes(3).await?;
    let five = nodes(5).await?;
    let cluster = start(RedisCluster::start).await?;
    let engines = [
        (
            "Redlock, 3 nodes",
            Runtime::builder().redlock(urls(&three)).build().await?,
            "<= 1.3x",
        ),
        (
            "Redlock, 5 nodes",
            Runtime::builder().redlock(urls(&five)).build().await?,
            "",
        ),
        (
            "Cluster, 3 masters",
            Runtime::builder()
                .redis_cluster(cluster.seeds())
                .build()
                .await?,
            "",
        ),
    ];
    // The floor of a fan-out on this machine: one trivial EVALSHA sent to N servers at once,
    // against the same call to one server.
    for servers in [&three, &five] {
        let floor = baselines::fan_out_floor(&urls(servers), 1000 * scale).await?;
        let n = servers.len();
        rows.push(Row::versus(
            format!("fan-out floor: 1 raw EVALSHA to {n} servers at once, p50"),
            p50(&floor.all),
            p50(&floor.one),
            "to 1 server",
            "",
        ));
        rows.push(Row::versus(
            format!(
                "fan-out floor: 1 raw EVALSHA to {n} servers, answered by {} of them, p50",
                n / 2 + 1
            ),
            p50(&floor.majority),
            p50(&floor.one),
            "to 1 server",
            "",
        ));
    }
    for (name, rt, target) in &engines {
        sequential::lock_pairs(rt, 200).await?;
        let run = sequential::interleaved_rounds(
            5 * scale,
            async || sequential::lock_pairs(&setup.rt, 100).await,
            async || sequential::lock_pairs(rt, 100).await,
        )
        .await?;
        let (lo, hi) = run.range();
        rows.push(Row::new(
            format!("{name}: sequential acquire+release, p50"),
            us(p50(&run.ours)),
            format!("{} (standalone Redis)", us(p50(&run.base))),
            format!(
                "{}, from {} to {}; pooled {})",
                run.median_ratio(),
                times(lo),
                times(hi),
                times(ratio(p50(&run.ours), p50(&run.base)))
            ),
            target,
        ));
    }
    // Hand-offs take microseconds, so one run's median moves with whatever else the machine
    // does: each engine runs in several rounds, each right after a standalone run, and the row
    // gives the median of the rounds' ratios.
    let url = &setup.url;
    let standalone_hot = super::redis_runtime(url, "hot1:").await?;
    let (sales, rounds) = (500 * scale as u64, if setup.options.quick { 1 } else { 5 });
    let mut runs: Vec<Vec<(Duration, Duration, bool)>> = vec![Vec::new(); engines.len()];
    for _ in 0..rounds {
        for ((_, rt, _), runs) in engines.iter().zip(&mut runs) {
            let base = hot_key::run(standalone_hot.clone(), url, 64, sales).await?;
            let hot = hot_key::run(rt.clone(), url, 64, sales).await?;
            runs.push((hot.handoff_p50(), base.handoff_p50(), hot.exact()));
        }
    }
    for ((name, _, _), runs) in engines.iter().zip(runs) {
        let target = if name.starts_with("Cluster") {
            "<= 1.2x standalone"
        } else {
            ""
        };
        rows.push(handoff_row(name, &runs, target));
    }
    Ok(rows)
}

/// The hand-off row of `name` over its rounds of (its p50, the standalone p50 measured right
/// before, counter exact).
fn handoff_row(name: &str, runs: &[(Duration, Duration, bool)], target: &str) -> Row {
    let ours = median(runs.iter().map(|r| r.0.as_secs_f64()).collect());
    let base = median(runs.iter().map(|r| r.1.as_secs_f64()).collect());
    let ratios: Vec<f64> = runs.iter().map(|r| ratio(r.0, r.1)).collect();
    let listed: Vec<String> = ratios.iter().map(|&x| times(x)).collect();
    Row::new(
        format!("{name}: hot key handoff, p50 (64 tasks)"),
        us(Duration::from_secs_f64(ours)),
        format!(
            "{} (standalone Redis, 64 tasks, run right before; median of {} rounds)",
            us(Duration::from_secs_f64(base)),
            runs.len()
        ),
        format!("{} (rounds {})", times(median(ratios)), listed.join(", ")),
        target,
    )
    .counter_checked(runs.iter().all(|r| r.2))
}
