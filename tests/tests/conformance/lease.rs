//! Leases: the watchdog keeps a short lease alive for several leases, `watchdog(false)` makes the
//! lease a hard cap (the lock expires, `lost()` resolves, `with_lock` ends in `Err(Lost)`), and a
//! lock record deleted behind the holder's back is seen as lost at the next renewal.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dlock_runtime::{LockError, with_lock};
use dlock_tests::{AcquireExt, HoldExt, LongBody, assert_between, waiter_got_it, while_held};

use crate::fixture::{Engine, Fixture};
use crate::support::{RELEASE_WITHIN, acquire_within, assert_busy, assert_free};

/// The lease of the loss tests: renewed every 2 s, so a loss seen within [`LOSS_SEEN_WITHIN`]
/// was seen by a renewal, not by the lease running out.
const LOSS_LEASE: Duration = Duration::from_secs(6);

/// Bound on `lost()` after the lock record is deleted: one renewal interval plus margin.
const LOSS_SEEN_WITHIN: Duration = Duration::from_millis(3500);

/// A lock with the engine's shortest lease (1 s; 2 s on etcd and ZooKeeper) is held for five to
/// six seconds: throughout, another runtime finds it busy and the guard is not lost; then the
/// release succeeds (still the owner) and frees the key.
pub(crate) async fn watchdog_keeps_a_short_lease_alive(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let params = fixture.params();
    let [rt, other] = fixture.each_runtime().await;
    let key = "conformance:lease:renewed";
    let guard = rt.lock(key).lease(params.short_lease).held("acquire").await;
    let every = Duration::from_millis(100);
    let checks = while_held(&guard, params.hold_for, every, |at| {
        let (other, when) = (
            &other,
            format!("{at:?} into a {:?} lease", params.short_lease),
        );
        async move { assert_busy(other, key, &when).await }
    })
    .await;
    assert!(checks >= 10, "{engine:?}: only {checks} checks");
    guard.release().await.unwrap_or_else(|e| {
        panic!(
            "{engine:?}: release after {:?} on a {:?} lease: {e:?}",
            params.hold_for, params.short_lease
        )
    });
    assert_free(&other, key, "after the release").await;
}

/// The bodies of `with_lock` on one key and on a set, each held with the engine's shortest
/// lease for several leases: throughout, another runtime finds every key busy, the call
/// returns the body's output (not `Err(Lost)`), and the keys are free after it. (A scoped
/// hold is tracked by the watchdog from its body's first wait.)
pub(crate) async fn with_lock_bodies_keep_a_short_lease_alive(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let params = fixture.params();
    let [rt, other] = fixture.each_runtime().await;
    let body = |keys: &'static [&'static str]| {
        let other = &other;
        async move {
            let started = Instant::now();
            let mut checks = 0;
            while started.elapsed() < params.hold_for {
                tokio::time::sleep(Duration::from_millis(250)).await;
                for key in keys {
                    let when = format!(
                        "{:?} into a {:?} lease",
                        started.elapsed(),
                        params.short_lease
                    );
                    assert_busy(other, key, &when).await;
                }
                checks += 1;
            }
            checks
        }
    };
    let one: &'static [&'static str] = &["conformance:lease:scoped"];
    let out = with_lock(rt.lock(one[0]).lease(params.short_lease), body(one)).await;
    let checks = out.unwrap_or_else(|e| panic!("{engine:?}: with_lock on one key: {e:?}"));
    assert!(checks >= 10, "{engine:?}: only {checks} checks");
    assert_free(&other, one[0], "after with_lock on one key returned").await;

    let set: &'static [&'static str] =
        &["conformance:lease:scoped:a", "conformance:lease:scoped:b"];
    let out = with_lock(
        rt.lock_all(set.iter().copied()).lease(params.short_lease),
        body(set),
    )
    .await;
    let checks = out.unwrap_or_else(|e| panic!("{engine:?}: with_lock on a set: {e:?}"));
    assert!(checks >= 10, "{engine:?}: only {checks} checks");
    for key in set {
        assert_free(&other, key, "after with_lock on a set returned").await;
    }
}

/// A holder that blocks its thread (a synchronous call inside async code) for several of the
/// engine's shortest leases keeps the lease: the watchdog renews it from the runtime's other
/// worker meanwhile. First a guard taken by hand, then a `with_lock` body that blocks in its
/// first step (before the body ever waits). Another runtime finds the key busy throughout,
/// each holder ends without a loss (the body's output returned), and the key is free after.
pub(crate) async fn a_holder_blocking_its_thread_keeps_its_lease(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let params = fixture.params();
    let [rt, other] = fixture.each_runtime().await;
    let lease = params.short_lease;

    let key = "conformance:lease:blocking-guard";
    while_blocking(&fixture, &other, (key, lease), |started, done| {
        let rt = rt.clone();
        async move {
            let guard = rt.lock(key).lease(lease).acquire().await?;
            started.store(true, Ordering::Release);
            std::thread::sleep(params.hold_for);
            done.store(true, Ordering::Release);
            guard.release().await.map(|()| 7)
        }
    })
    .await;

    let key = "conformance:lease:blocking-body";
    while_blocking(&fixture, &other, (key, lease), |started, done| {
        with_lock(rt.lock(key).lease(lease), async move {
            started.store(true, Ordering::Release);
            // No await until it returns.
            std::thread::sleep(params.hold_for);
            done.store(true, Ordering::Release);
            7
        })
    })
    .await;
}

/// Runs `holder` (given a flag to set once it holds `key`, and one to set when it is done) as
/// a task, which blocks one worker of the test's runtime, while a checker asserts every 250 ms
/// that another runtime of `fixture` finds `key` busy until the holder is done. The checker has
/// a thread and a tokio runtime of its own: a worker blocked by the holder may be the one that
/// was serving the test runtime's timers and sockets (tokio leaves them to the worker that
/// parked last), which then wait until another worker parks. Then asserts that the holder returned `Ok(7)` (no loss),
/// that the checker ran at least 10 times, and that `key` is free for `other`.
async fn while_blocking<F>(
    fixture: &Fixture,
    other: &dlock_tests::Runtime,
    (key, lease): (&'static str, Duration),
    holder: impl FnOnce(Arc<AtomicBool>, Arc<AtomicBool>) -> F,
) where
    F: Future<Output = Result<i32, LockError>> + Send + 'static,
{
    let engine = fixture.engine;
    let started = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let holding = tokio::spawn(holder(started.clone(), done.clone()));
    let check = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the checker's runtime")
            .block_on(async {
                let other = fixture.runtime().await;
                let mut checks = 0;
                let mut since = None;
                loop {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    if done.load(Ordering::Acquire) {
                        break;
                    }
                    if !started.load(Ordering::Acquire) {
                        continue;
                    }
                    let since = *since.get_or_insert_with(Instant::now);
                    let when = format!(
                        "{:?} into a hold blocking its thread (lease {lease:?})",
                        since.elapsed()
                    );
                    // The holder may end between the look at `done` above and this attempt:
                    // the key is then free by right. It must be busy while the holder has not
                    // ended when the answer comes.
                    let lock = other.lock(key).lease(lease).wait(Duration::ZERO);
                    match lock.spawn().await.expect("the checker's attempt").0 {
                        Err(e) if e.is_timeout() => {}
                        Ok(guard) if done.load(Ordering::Acquire) => {
                            guard.release().await.expect("the checker's release");
                            break;
                        }
                        other => {
                            panic!("{when}: {key:?} must be busy for another owner, got {other:?}")
                        }
                    }
                    checks += 1;
                }
                checks
            })
    };
    // Blocks this thread (the test's main thread, not a worker) until the holder is done.
    let checks = std::thread::scope(|s| s.spawn(check).join());
    let outcome = holding.await.expect("the holder task");
    let checks = checks.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    assert_eq!(
        outcome.map_err(|e| format!("{engine:?}: {key}: {e:?}")),
        Ok(7)
    );
    assert!(checks >= 10, "{engine:?}: {key}: only {checks} checks");
    assert_free(other, key, "after the blocking holder ended").await;
}

/// Without the watchdog, the engine's shortest lease is a hard cap: `lost()` resolves about one
/// lease after the acquisition, a waiter on another runtime gets the key then (with a greater
/// fence), the expired holder's release does not free the new holder's lock, and `with_lock`
/// drops its body, returns `Err(Lost)` at the lease and leaves the key free. On ZooKeeper,
/// where a node lives as long as the session, this holds because the runtime removes the node
/// at the hard cap even while the lost guard is kept.
pub(crate) async fn watchdog_off_lease_is_a_hard_cap(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let params = fixture.params();
    let lease = params.short_lease;
    let [rt, other, third] = fixture.each_runtime().await;

    let key = "conformance:lease:hard-cap";
    let start = Instant::now();
    let guard = rt.hold_capped(key, lease).await;
    let guard_fence = guard.fence();
    let waiter = other.lock(key).wait(Duration::from_secs(20)).spawn();
    tokio::time::timeout(lease + Duration::from_secs(5), guard.lost())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{engine:?}: lost() must resolve once a {lease:?} lease without watchdog runs out"
            )
        });
    assert!(guard.is_lost());
    assert_between(
        "lost() at the hard cap",
        start.elapsed(),
        lease / 2,
        lease + Duration::from_millis(1500),
    );
    let what = format!("{engine:?}: the waiter gets the expired key");
    let (next, came) = waiter_got_it(waiter, Duration::from_secs(25), &what).await;
    let taken_after = came - start;
    let late = guard.release().await;
    assert!(
        matches!(late, Err(ref e) if e.is_lost()),
        "{engine:?}: release of an expired lock must say it was lost, got {late:?}"
    );
    println!("{engine:?}: the waiter got the key {taken_after:?} after the first acquisition");
    assert_between(
        "another runtime gets the key after the hard cap",
        taken_after,
        lease * 9 / 10,
        lease + Duration::from_secs(2),
    );
    if params.fences {
        assert!(
            next.fence() > guard_fence,
            "{engine:?}: {:?} after {guard_fence:?}",
            next.fence()
        );
    }
    assert_busy(&third, key, "after the expired holder's release").await;
    next.release().await.expect("release");

    let key = "conformance:lease:hard-cap-with-lock";
    let body = LongBody::default();
    let start = Instant::now();
    let out = tokio::time::timeout(
        lease + Duration::from_secs(10),
        with_lock(rt.lock(key).lease(lease).watchdog(false), body.run(None)),
    )
    .await
    .unwrap_or_else(|_| panic!("{engine:?}: with_lock must end once the lease is lost"));
    let took = start.elapsed();
    body.assert_cancelled_with_lost(&format!("{engine:?}"), key, out);
    assert_between(
        "with_lock Err(Lost) at the hard cap",
        took,
        lease / 2,
        lease + Duration::from_millis(2000),
    );
    acquire_within(
        &other,
        key,
        RELEASE_WITHIN,
        "after with_lock returned Err(Lost)",
    )
    .await;
}

/// The lock record deleted behind the holder's back (the engine's own way, see
/// [`Fixture::delete_lock`]) with a 6 s lease: `lost()` resolves within 3.5 s, and a `with_lock`
/// body is dropped and the call returns `Err(Lost)` within 3.5 s.
pub(crate) async fn deleted_key_is_lost(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let [rt, other] = fixture.each_runtime().await;

    let key = "conformance:lease:deleted";
    let guard = rt.lock(key).lease(LOSS_LEASE).held("acquire").await;
    fixture.delete_lock(key).await;
    let deleted = Instant::now();
    tokio::time::timeout(LOSS_SEEN_WITHIN, guard.lost())
        .await
        .unwrap_or_else(|_| panic!("{engine:?}: lost() within {LOSS_SEEN_WITHIN:?} of the delete"));
    println!(
        "{engine:?}: lost() {:?} after the delete (lease {LOSS_LEASE:?})",
        deleted.elapsed()
    );
    assert!(guard.is_lost());
    let late = guard.release().await;
    assert!(
        matches!(late, Err(ref e) if e.is_lost()),
        "{engine:?}: release of a lost lock must say so, got {late:?}"
    );
    assert_free(&other, key, "after the loss").await;

    let key = "conformance:lease:deleted-with-lock";
    let body = LongBody::default();
    let (task, held_rx) = body.spawn(rt.lock(key).lease(LOSS_LEASE));
    held_rx.await.expect("the body runs");
    fixture.delete_lock(key).await;
    let deleted = Instant::now();
    let out = tokio::time::timeout(LOSS_SEEN_WITHIN, task)
        .await
        .unwrap_or_else(|_| {
            panic!("{engine:?}: with_lock must return within {LOSS_SEEN_WITHIN:?} of the delete")
        })
        .expect("task");
    println!(
        "{engine:?}: with_lock returned {:?} after the delete",
        deleted.elapsed()
    );
    body.assert_cancelled_with_lost(&format!("{engine:?}"), key, out);
}
