//! `hold_at_least`, for scheduled jobs: a body that ends at once leaves its key taken until
//! about `hold_at_least` after the acquisition (other runtimes' tries without wait time out,
//! a waiter gets it when the hold ends, not before); a body that runs longer releases at once.

use std::time::{Duration, Instant};

use dlock_runtime::{LockBuilder, Runtime, with_lock};
use dlock_tests::{AcquireExt, LONG_LEASE, assert_between, waiter_got_it};

use crate::fixture::{Engine, Fixture};
use crate::support::{assert_busy, assert_free};

/// The hold the behaviours ask for: whole seconds (etcd's resolution) above etcd's 2 s minimum
/// lease, and long enough to try the key many times meanwhile.
const HOLD: Duration = Duration::from_secs(3);

/// How late after the hold the key may free: etcd expires leases on a half-second tick, then
/// the waiter sees the deletion; ZooKeeper's node goes by a delete the runtime sends.
const FREED_WITHIN: Duration = Duration::from_millis(2500);

/// A job's lock of `key` on `rt`: `lease = 30 s, watchdog = false, hold_at_least = hold`.
fn job(rt: &Runtime, key: &str, hold: Duration) -> LockBuilder {
    rt.lock(key)
        .lease(LONG_LEASE)
        .watchdog(false)
        .hold_at_least(hold)
}

/// A job whose body ends at once, under `lease = 30 s, watchdog = false, hold_at_least = 3 s`:
/// until about 3 s after the acquisition another runtime's tries without wait time out; a
/// waiter of a third runtime started at the release gets the key after the hold has ended, and
/// within [`FREED_WITHIN`] of that.
pub(crate) async fn a_short_run_keeps_the_key_until_hold_at_least(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let [rt, other, third] = fixture.each_runtime().await;
    let key = "conformance:hold:short-run";
    let start = Instant::now();
    let job = job(&rt, key, HOLD);
    with_lock(job, async {})
        .await
        .unwrap_or_else(|e| panic!("{engine:?}: the job: {e:?}"));
    let waiter = third.lock(key).wait(Duration::from_secs(20)).spawn();
    let mut tries = 0;
    while start.elapsed() < HOLD - Duration::from_millis(300) {
        let when = format!("{engine:?}: {:?} after the acquisition", start.elapsed());
        assert_busy(&other, key, &when).await;
        tries += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(tries >= 5, "{engine:?}: only {tries} tries within the hold");
    let within = HOLD + FREED_WITHIN + Duration::from_secs(5);
    let (guard, came) = waiter_got_it(waiter, within, "the waiter after the hold").await;
    let took = came.duration_since(start);
    println!("{engine:?}: the waiter got the key {took:?} after the acquisition");
    // A little below the hold for the engine's clock against this process's (one machine).
    assert_between(
        &format!("{engine:?}: the waiter's acquisition"),
        took,
        HOLD - Duration::from_millis(50),
        HOLD + FREED_WITHIN,
    );
    guard.release().await.expect("the waiter's release");
    assert_free(&other, key, "after the waiter's release").await;
}

/// A body that runs longer than `hold_at_least` releases as usual: the key is free for another
/// runtime as soon as the call returns.
pub(crate) async fn a_run_longer_than_hold_at_least_releases_at_once(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let [rt, other] = fixture.each_runtime().await;
    let key = "conformance:hold:long-run";
    let hold = Duration::from_secs(1);
    let job = job(&rt, key, hold);
    with_lock(job, tokio::time::sleep(hold + Duration::from_millis(500)))
        .await
        .unwrap_or_else(|e| panic!("{engine:?}: the job: {e:?}"));
    assert_free(&other, key, "right after a run longer than its hold").await;
    // And a guard dropped after its hold: released from `Drop`, at once as well.
    let guard = rt
        .lock(key)
        .lease(LONG_LEASE)
        .hold_at_least(hold)
        .held("acquire")
        .await;
    tokio::time::sleep(hold + Duration::from_millis(200)).await;
    drop(guard);
    crate::support::assert_nothing_left(&other, key, "a guard dropped after its hold").await;
}
