//! Fan-out: Redlock on 3 and 5 nodes and a Redis Cluster of 3 masters (each with a replica),
//! against standalone Redis: sequential latency in interleaved rounds, and hot-key handoff.

use dlock_runtime::Runtime;
use dlock_testkit::RedisServer;
use dlock_testkit::cluster::RedisCluster;

use crate::report::Row;
use crate::stats::p50;
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
        let (one, all) = baselines::fan_out_floor(&urls(servers), 1000 * scale).await?;
        rows.push(Row::versus(
            format!(
                "fan-out floor: 1 raw EVALSHA to {} servers at once, p50",
                servers.len()
            ),
            p50(&all),
            p50(&one),
            "to 1 server",
            "",
        ));
    }
    for (name, rt, target) in &engines {
        sequential::lock_pairs(rt, 200).await?;
        let (base, ours) = sequential::interleaved(
            5 * scale,
            async || sequential::lock_pairs(&setup.rt, 100).await,
            async || sequential::lock_pairs(rt, 100).await,
        )
        .await?;
        rows.push(Row::versus(
            format!("{name}: sequential acquire+release, p50"),
            p50(&ours),
            p50(&base),
            "standalone Redis",
            target,
        ));
    }
    let url = &setup.url;
    let standalone_hot = super::redis_runtime(url, "hot1:").await?;
    let base = hot_key::run(standalone_hot, url, 64, 500 * scale as u64).await?;
    for (name, rt, _) in engines {
        let hot = hot_key::run(rt, url, 64, 500 * scale as u64).await?;
        let label = "standalone Redis, 64 tasks";
        rows.push(hot.handoff_row(name, 64, base.handoff_p50(), label));
    }
    Ok(rows)
}
