//! Mutual exclusion across processes: contenders on several runtimes never overlap, and a
//! read-sleep-write counter they share ends exact.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock_tests::{LONG_WAIT, held_long};

use crate::fixture::{Engine, Fixture};
use crate::support::assert_nothing_left;

/// Three runtimes with seventeen tasks each take one key ten times each. Inside, an overlap
/// detector must read zero, and a counter is read, the task sleeps, and the counter is written
/// back plus one: without exclusion, updates are lost. Afterwards the engine keeps no record of
/// the key (no holder, no queued contender).
pub(crate) async fn mutual_exclusion_with_many_contenders(engine: Engine) {
    const RUNTIMES: usize = 3;
    const TASKS_PER_RUNTIME: usize = 17;
    const ITERATIONS: u64 = 10;
    let fixture = Fixture::start(engine).await;
    let key = "conformance:exclusion";
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicU64::new(0));
    let tasks = (RUNTIMES, TASKS_PER_RUNTIME);
    fixture
        .tasks_on_each(tasks, Duration::from_secs(120), |rt| {
            let (counter, inside) = (counter.clone(), inside.clone());
            async move {
                let what = format!("{engine:?}: acquire");
                for _ in 0..ITERATIONS {
                    let guard = held_long(rt.lock(key), LONG_WAIT, &what).await;
                    let others = inside.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(others, 0, "{engine:?}: two holders inside at once");
                    let value = counter.load(Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    counter.store(value + 1, Ordering::SeqCst);
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard
                        .release()
                        .await
                        .unwrap_or_else(|e| panic!("{engine:?}: release: {e:?}"));
                }
            }
        })
        .await;
    assert_eq!(
        counter.load(Ordering::SeqCst),
        (RUNTIMES * TASKS_PER_RUNTIME) as u64 * ITERATIONS,
        "{engine:?}: lost updates"
    );
    assert_nothing_left(&fixture.runtime().await, key, "after the last release").await;
}
