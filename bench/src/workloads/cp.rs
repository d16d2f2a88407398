//! etcd and ZooKeeper (feature `cp-engines`): each engine's sequential acquire + release and
//! hot-key handoff, against the engine's own round trips measured in the same run.

use std::time::Instant;

use dlock_runtime::Runtime;
use dlock_testkit::etcd::EtcdServer;
use dlock_testkit::zookeeper::ZooKeeperServer;

use crate::report::Row;
use crate::stats::p50;
use crate::workloads::{hot_key, sequential};
use crate::{BoxError, Setup, start};

/// Sequential acquire + release of `rt` against `raw_pair` (the engine's own round trips,
/// described by `raw_label`), in interleaved rounds of 50, and the hot-key handoff (16 tasks,
/// counter on the standalone Redis) against the same baseline.
async fn engine_rows(
    name: &str,
    rt: Runtime,
    raw_label: &str,
    mut raw_pair: impl AsyncFnMut() -> Result<(), BoxError>,
    setup: &Setup,
) -> Result<Vec<Row>, BoxError> {
    let scale = setup.options.scale();
    sequential::lock_pairs(&rt, 50).await?;
    let (base, ours) = sequential::interleaved(
        4 * scale,
        async || {
            let mut lat = Vec::with_capacity(50);
            for _ in 0..50 {
                let t = Instant::now();
                raw_pair().await?;
                lat.push(t.elapsed());
            }
            Ok(lat)
        },
        async || sequential::lock_pairs(&rt, 50).await,
    )
    .await?;
    let b50 = p50(&base);
    let what = format!("{name}: sequential acquire+release, p50");
    let mut rows = vec![Row::versus(what, p50(&ours), b50, raw_label, "")];
    let hot = hot_key::run(rt, &setup.url, 16, 100 * scale as u64).await?;
    let what = format!("{name}: hot key handoff, p50 (16 tasks)");
    let target = "<= 1.2x one raw write (the baseline is two)";
    rows.push(
        Row::versus(what, hot.handoff_p50(), b50, raw_label, target).counter_checked(hot.exact()),
    );
    Ok(rows)
}

/// Section `cp`.
pub(super) async fn rows(setup: &Setup) -> Result<Vec<Row>, BoxError> {
    let etcd_server = start(EtcdServer::start).await?;
    let endpoints = etcd_server.endpoints();
    let etcd_rt = Runtime::builder().etcd(endpoints.clone()).build().await?;
    let mut etcd = etcd_client::Client::connect(endpoints, None).await?;
    let raw_etcd = async || {
        etcd.put("bench-raw", "x", None).await?;
        etcd.delete("bench-raw", None).await?;
        Ok(())
    };
    let mut rows = engine_rows("etcd", etcd_rt, "raw put + delete", raw_etcd, setup).await?;

    let zk_server = start(ZooKeeperServer::start).await?;
    let connect = zk_server.connect_string();
    let zk_rt = Runtime::builder().zookeeper(&connect).build().await?;
    let zk = zookeeper_client::Client::connect(&connect).await?;
    let persistent =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    let raw_zk = async || {
        zk.create("/bench-raw", b"x", &persistent).await?;
        zk.delete("/bench-raw", None).await?;
        Ok(())
    };
    rows.extend(engine_rows("ZooKeeper", zk_rt, "raw create + delete", raw_zk, setup).await?);
    Ok(rows)
}
