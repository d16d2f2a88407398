//! Checks shared by the behaviours, all through the public API.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dlock_tests::{Runtime, eventually};

/// A lease no test waits out: a key that frees up within the bounds below was released.
pub(crate) const LONG_LEASE: Duration = Duration::from_secs(30);

/// Bound on a release scheduled from `Drop` (panic, cancellation) reaching the engine:
/// generous for a loaded box, far below [`LONG_LEASE`].
pub(crate) const RELEASE_WITHIN: Duration = Duration::from_millis(1500);

/// Asserts `rt` (another owner: a spawned task, outside any call chain) can take `key` in one
/// attempt, then releases it.
pub(crate) async fn assert_free(rt: &Runtime, key: &str, when: &str) {
    let (rt, key_owned) = (rt.clone(), key.to_owned());
    let out = tokio::spawn(async move {
        let guard = rt
            .lock(key_owned)
            .lease(LONG_LEASE)
            .wait(Duration::ZERO)
            .acquire()
            .await?;
        guard.release().await
    })
    .await
    .expect("task");
    if let Err(e) = out {
        panic!("{when}: {key:?} should be free for another owner, got {e:?}");
    }
}

/// Asserts `rt` (another owner: a spawned task, outside any call chain) finds `key` busy.
pub(crate) async fn assert_busy(rt: &Runtime, key: &str, when: &str) {
    let (rt, key_owned) = (rt.clone(), key.to_owned());
    let out = tokio::spawn(async move {
        rt.lock(key_owned)
            .lease(LONG_LEASE)
            .wait(Duration::ZERO)
            .acquire()
            .await
            .map(drop)
    })
    .await
    .expect("task");
    match out {
        Err(e) if e.is_timeout() => {}
        other => panic!("{when}: {key:?} must be busy for another owner, got {other:?}"),
    }
}

/// Another owner on `rt` waits at most `within` for `key`, then releases it; returns how long
/// the acquisition took. Panics if it timed out.
pub(crate) async fn acquire_within(
    rt: &Runtime,
    key: &str,
    within: Duration,
    when: &str,
) -> Duration {
    let (rt, key_owned) = (rt.clone(), key.to_owned());
    let start = Instant::now();
    let out = tokio::spawn(async move {
        let guard = rt
            .lock(key_owned)
            .lease(LONG_LEASE)
            .wait(within)
            .acquire()
            .await?;
        let took = start.elapsed();
        guard.release().await.map(|()| took)
    })
    .await
    .expect("task");
    out.unwrap_or_else(|e| {
        panic!("{when}: another owner did not get {key:?} within {within:?}: {e:?}")
    })
}

/// Sets a flag when dropped: tells whether a body future was dropped (cancelled).
pub(crate) struct SetOnDrop(pub(crate) Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Waits until the engine keeps no record of `key` at all (`is_locked` is false: no holder, and
/// on etcd and ZooKeeper no queued contender either); panics after [`RELEASE_WITHIN`].
pub(crate) async fn assert_nothing_left(rt: &Runtime, key: &str, when: &str) {
    let what = format!("{when}: the engine keeps no record of {key:?}");
    eventually(RELEASE_WITHIN, &what, || async {
        !rt.is_locked(key).await.expect("is_locked")
    })
    .await;
}
