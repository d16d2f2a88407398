//! Metrics (feature `metrics`) through the `metrics` facade, read back with a debugging
//! recorder installed as the global recorder (a test binary of its own: one recorder for the
//! process): the histograms, counters and gauge named in the design, labelled by engine and
//! outcome, and never by key.

use std::collections::BTreeMap;
use std::time::Duration;

use dlock_tests::{
    AcquireExt, HoldExt, lost_while_paused, redis_with_timeout, runtime_with_timeout,
};
use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// What the recorder holds, summed over snapshots (each snapshot drains it): counters and
/// gauges as totals, histograms as every value recorded; by `name{label=value,...}`.
#[derive(Default, Debug)]
struct Totals {
    counters: BTreeMap<String, u64>,
    gauges: BTreeMap<String, f64>,
    histograms: BTreeMap<String, Vec<f64>>,
}

impl Totals {
    /// Drains `snapshotter` into the totals; panics on a label that names a key.
    fn take(&mut self, snapshotter: &Snapshotter) {
        for (composite, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = composite.key();
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            for label in &labels {
                assert!(
                    !label.starts_with("key=") && !label.contains("metrics:"),
                    "a lock key in the labels of {}: {labels:?}",
                    key.name()
                );
            }
            assert!(
                labels.iter().any(|l| l == "engine=redis"),
                "{} has no engine label: {labels:?}",
                key.name()
            );
            let id = format!("{}{{{}}}", key.name(), labels.join(","));
            match (composite.kind(), value) {
                (MetricKind::Counter, DebugValue::Counter(n)) => {
                    *self.counters.entry(id).or_default() += n
                }
                (MetricKind::Gauge, DebugValue::Gauge(v)) => {
                    *self.gauges.entry(id).or_default() += v.into_inner()
                }
                (MetricKind::Histogram, DebugValue::Histogram(vs)) => self
                    .histograms
                    .entry(id)
                    .or_default()
                    .extend(vs.into_iter().map(|v| v.into_inner())),
                (kind, value) => panic!("{id}: {kind:?} with {value:?}"),
            }
        }
    }

    fn counter(&self, id: &str) -> u64 {
        self.counters.get(id).copied().unwrap_or(0)
    }

    fn gauge(&self, id: &str) -> f64 {
        self.gauges.get(id).copied().unwrap_or(0.0)
    }

    fn histogram(&self, id: &str) -> &[f64] {
        self.histograms.get(id).map_or(&[], Vec::as_slice)
    }
}

/// One lock's life on Redis, step by step, with what each step adds to the metrics:
/// acquisition time (outcome `acquired`) and the held-locks gauge up; renewals `ok`; another
/// runtime's timeout (`dlock_timeouts_total`, acquisition outcome `timeout`); release (hold
/// time, gauge down); a bad key (outcome `error`); a server that stops answering (renewals
/// `failed`, then `dlock_lost_total`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_holds_renewals_timeouts_and_losses_are_measured_by_engine_and_outcome() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");
    let (mut server, rt) = redis_with_timeout(Duration::from_millis(200)).await;
    let other = runtime_with_timeout(&server, Duration::from_millis(200)).await;
    let mut totals = Totals::default();

    let held_gauge = "dlock_held_locks{engine=redis}";
    let acquired = "dlock_acquire_seconds{engine=redis,outcome=acquired}";
    let guard = rt.hold("metrics:k", Duration::from_millis(900)).await;
    totals.take(&snapshotter);
    assert_eq!(totals.gauge(held_gauge), 1.0, "{totals:?}");
    assert_eq!(totals.histogram(acquired).len(), 1, "{totals:?}");

    tokio::time::sleep(Duration::from_millis(700)).await;
    totals.take(&snapshotter);
    assert!(
        totals.counter("dlock_renewals_total{engine=redis,outcome=ok}") >= 1,
        "{totals:?}"
    );

    other
        .lock("metrics:k")
        .wait(Duration::from_millis(200))
        .times_out("held by rt")
        .await;
    totals.take(&snapshotter);
    assert_eq!(totals.counter("dlock_timeouts_total{engine=redis}"), 1);
    let timeouts = totals.histogram("dlock_acquire_seconds{engine=redis,outcome=timeout}");
    assert_eq!(timeouts.len(), 1, "{totals:?}");
    assert!(timeouts[0] >= 0.2, "timed out after {}s", timeouts[0]);

    guard.release().await.expect("release");
    totals.take(&snapshotter);
    let held = totals.histogram("dlock_held_seconds{engine=redis}");
    assert_eq!(held.len(), 1, "{totals:?}");
    assert!(held[0] >= 0.7, "held {}s", held[0]);
    assert_eq!(totals.gauge(held_gauge), 0.0, "{totals:?}");

    rt.lock("").invalid_config("an empty key").await;
    totals.take(&snapshotter);
    assert_eq!(
        totals
            .histogram("dlock_acquire_seconds{engine=redis,outcome=error}")
            .len(),
        1,
        "{totals:?}"
    );

    let guard = rt.hold("metrics:lost", Duration::from_millis(1500)).await;
    lost_while_paused(&mut server, &guard, Duration::from_secs(4)).await;
    drop(guard);
    totals.take(&snapshotter);
    assert!(
        totals.counter("dlock_renewals_total{engine=redis,outcome=failed}") >= 1,
        "{totals:?}"
    );
    assert_eq!(
        totals.counter("dlock_lost_total{engine=redis}"),
        1,
        "{totals:?}"
    );
    assert_eq!(totals.gauge(held_gauge), 0.0, "{totals:?}");
    assert_eq!(totals.histogram(acquired).len(), 2, "{totals:?}");
}
