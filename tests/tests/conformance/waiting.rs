//! Waiting: a bounded wait ends in `LockError::Timeout` on time (for every queued waiter, not
//! only the first), and a release wakes a waiter by notification, long before the holder's
//! lease would have run out.

use std::time::{Duration, Instant};

use dlock_runtime::LockError;
use dlock_tests::{AcquireExt, assert_between, release_wakes_the_waiter};

use crate::fixture::{Engine, Fixture};
use crate::support::{LONG_LEASE, assert_free, assert_nothing_left};

/// A held key: one attempt (`wait` zero) fails at once, a waiter with `wait` = 300 ms gets
/// `Timeout` naming the key after 300 ms to 1.5 s, and so does each of ten waiters queued on
/// two runtimes. The timed-out waiters leave nothing behind: after the release the key is free.
pub(crate) async fn wait_timeout_returns_timeout_within_bounds(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let [holder_rt, rt, other] = fixture.each_runtime().await;
    let key = "conformance:wait:timeout";
    let holder = holder_rt.lock(key).lease(LONG_LEASE).held("holder").await;

    let start = Instant::now();
    rt.lock(key)
        .lease(LONG_LEASE)
        .wait(Duration::ZERO)
        .times_out("the key is held")
        .await;
    assert_between(
        "wait = 0 on a held key",
        start.elapsed(),
        Duration::ZERO,
        Duration::from_secs(1),
    );

    let wait = Duration::from_millis(300);
    let start = Instant::now();
    let err = rt
        .lock(key)
        .lease(LONG_LEASE)
        .wait(wait)
        .refused("the key is held")
        .await;
    let took = start.elapsed();
    match &err {
        LockError::Timeout { key: k, waited, .. } => {
            assert_eq!(k, key);
            assert!(
                *waited >= wait,
                "{engine:?}: waited {waited:?} < wait {wait:?}"
            );
        }
        other => panic!("{engine:?}: expected Timeout, got {other:?}"),
    }
    assert!(err.is_timeout());
    assert_eq!(err.key(), Some(key));
    let message = err.to_string();
    assert!(
        message.contains(key),
        "the message names the key: {message}"
    );
    assert_between(
        "wait = 300 ms on a held key",
        took,
        wait,
        Duration::from_millis(1500),
    );

    let waiters: Vec<_> = (0..10)
        .map(|i| {
            let rt = [&rt, &other][i % 2].clone();
            tokio::spawn(async move {
                let start = Instant::now();
                let out = rt.lock(key).lease(LONG_LEASE).wait(wait).acquire().await;
                (out.map(drop), start.elapsed())
            })
        })
        .collect();
    for waiter in waiters {
        let (out, took) = waiter.await.expect("task");
        let err = out.expect_err("the key stays held");
        assert!(
            err.is_timeout(),
            "{engine:?}: expected Timeout, got {err:?}"
        );
        assert_between(
            "a queued waiter with wait = 300 ms",
            took,
            wait,
            Duration::from_millis(1500),
        );
    }
    holder.release().await.expect("release");
    assert_nothing_left(&other, key, "after the timed-out waiters and the release").await;
    assert_free(&other, key, "after the timed-out waiters and the release").await;
}

/// The holder (30 s lease) is on another runtime, so the wake-up must come through the
/// engine: five times, a waiter asleep on the key holds it within the engine's notification
/// bound (200 ms on memory and Redis, 500 ms elsewhere) of the release.
pub(crate) async fn release_wakes_a_waiter_long_before_the_lease(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let bound = fixture.params().wake_within;
    let [holder_rt, rt] = fixture.each_runtime().await;
    let key = "conformance:wait:wake";
    release_wakes_the_waiter(&holder_rt, &rt, key, (5, bound), &format!("{engine:?}")).await;
}
