//! Several keys at once (`lock_all`, the attribute's `keys = [..]`): deadlock-free whatever the
//! order the keys are named in, all or nothing, one guard over every key (release, loss,
//! fences), and re-entry of the keys a call chain already holds.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlock_runtime::{LockError, distributed_lock, with_lock};
use dlock_tests::{AcquireExt, HoldExt, LONG_WAIT, LongBody, finish_within, held_long};

use crate::fixture::{Engine, Fixture};
use crate::support::{LONG_LEASE, RELEASE_WITHIN, SetOnDrop, assert_busy, assert_free};

/// Rounds of the deadlock test, per contender.
const ROUNDS: u64 = 1000;

/// Bound on the whole deadlock test: two contenders, [`ROUNDS`] rounds each, two keys a round.
const ROUNDS_WITHIN: Duration = Duration::from_secs(240);

/// The attribute's form: both accounts, named in the order of the call.
#[distributed_lock(keys = ["conformance:multi:acct:{from}", "conformance:multi:acct:{to}"], lease = "30s", wait = "60s")]
async fn transfer(from: &str, to: &str, inside: Arc<AtomicU64>) -> Result<(), LockError> {
    let others = inside.fetch_add(1, Ordering::SeqCst);
    assert_eq!(others, 0, "two transfers inside at once");
    tokio::task::yield_now().await;
    inside.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

/// Two contenders (runtimes; on memory, tasks of its one runtime) take the same two keys
/// [`ROUNDS`] times each, one naming them `[a, b]`, the other `[b, a]`; half the rounds through
/// `lock_all(..).acquire()`, half through the attribute. Every round completes (a deadlock
/// would stall both for their 60 s wait), both never hold at once, and the whole run ends
/// within [`ROUNDS_WITHIN`].
pub(crate) async fn opposite_orders_never_deadlock(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let (a, b) = ("conformance:multi:acct:a", "conformance:multi:acct:b");
    let inside = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, rt) in fixture.runtimes(2).await.into_iter().enumerate() {
        let (order, inside) = (if i == 0 { [a, b] } else { [b, a] }, inside.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                if round % 2 == 0 {
                    let what = format!("{engine:?}: round {round} of {order:?}");
                    let guard = held_long(rt.lock_all(order), LONG_WAIT, &what).await;
                    assert_eq!(guard.keys(), [a, b], "{engine:?}: canonical order");
                    let others = inside.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(others, 0, "{engine:?}: two holders of {order:?} at once");
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("release");
                } else {
                    let (from, to) = (&order[0][23..], &order[1][23..]);
                    rt.scope(transfer(from, to, inside.clone()))
                        .await
                        .unwrap_or_else(|e| panic!("{engine:?}: round {round}: {e:?}"));
                }
            }
        }));
    }
    finish_within(tasks, ROUNDS_WITHIN).await;
    println!(
        "{engine:?}: {} multi-key rounds in {:?}",
        2 * ROUNDS,
        started.elapsed()
    );
    let rt = fixture.runtime().await;
    assert_free(&rt, a, "after the last round").await;
    assert_free(&rt, b, "after the last round").await;
}

/// Another runtime holds `b`. `lock_all([c, b, a])` with a 300 ms wait times out naming `b`
/// after about 300 ms and takes nothing: `a` and `c` are free right after it returns, `b` is
/// still the other's. Same with no wait (one attempt). Once `b` is released, the set is taken
/// whole.
pub(crate) async fn a_set_with_one_busy_key_takes_none_of_them(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let [rt, other, third] = fixture.each_runtime().await;
    let (a, b, c) = (
        "conformance:multi:none:a",
        "conformance:multi:none:b",
        "conformance:multi:none:c",
    );
    let held = other.hold(b, LONG_LEASE).await;
    for wait in [Duration::from_millis(300), Duration::ZERO] {
        let started = Instant::now();
        let err = rt
            .lock_all([c, b, a])
            .lease(LONG_LEASE)
            .wait(wait)
            .refused(&format!("{engine:?}: a set with a busy key, wait {wait:?}"))
            .await;
        let took = started.elapsed();
        match &err {
            LockError::Timeout { key, waited, .. } => {
                assert_eq!(key, b, "{engine:?}: the timeout names the busy key");
                assert!(*waited >= wait, "{engine:?}: waited {waited:?} < {wait:?}");
            }
            other => panic!("{engine:?}: expected Timeout, got {other:?}"),
        }
        assert!(
            took >= wait && took < wait + Duration::from_secs(3),
            "{engine:?}: returned after {took:?} with a wait of {wait:?}"
        );
        // Right away, not after a background release: the keys taken were given back before
        // the call returned (or never taken).
        for key in [a, c] {
            let guard = third
                .lock(key)
                .lease(LONG_LEASE)
                .held(&format!("{engine:?}: {key:?} free after the failed set"))
                .await;
            guard.release().await.expect("release");
        }
        assert_busy(&third, b, "still the other runtime's").await;
    }
    held.release().await.expect("release");
    let all = held_long(
        rt.lock_all([c, b, a]),
        Duration::from_secs(5),
        &format!("{engine:?}: the whole set once b is free"),
    )
    .await;
    assert_eq!(all.keys(), [a, b, c]);
    for key in [a, b, c] {
        assert_busy(&third, key, "held by the set").await;
    }
    all.release().await.expect("release");
}

/// One guard over every key: `list` and `inspect` show every key held; `fences()` has one
/// token per key in canonical order (each above the previous holder's of that key, where the
/// engine gives tokens) and `fence()` is the first; `release()` frees every key; `drop` frees every key; a panic and a cancellation of a
/// `with_lock` body free every key.
pub(crate) async fn one_guard_covers_every_key(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let [rt, other] = fixture.each_runtime().await;
    let fences = fixture.params().fences;
    let keys = ["conformance:multi:guard:y", "conformance:multi:guard:x"];
    let [y, x] = keys;

    let first = rt.lock_all(keys).lease(LONG_LEASE).held("first").await;
    assert_eq!(first.keys(), [x, y]);
    assert_eq!(first.key(), x);
    let before = first.fences();
    assert_eq!(before.len(), 2);
    assert_eq!(before[0], first.fence());
    assert_eq!(
        before.iter().all(Option::is_some),
        fences,
        "{engine:?}: {before:?}"
    );
    assert_busy(&other, x, "held by the set").await;
    assert_busy(&other, y, "held by the set").await;
    let listed = other.list("conformance:multi:guard:").await.expect("list");
    let listed: Vec<&str> = listed.iter().map(|info| info.key.as_str()).collect();
    assert_eq!(listed, [x, y], "{engine:?}: every key of the set is listed");
    let shown = other.inspect(y).await.expect("inspect");
    assert!(
        shown.is_some(),
        "{engine:?}: inspect shows the set's second key"
    );
    first.release().await.expect("release");
    assert_free(&other, x, "after release()").await;
    assert_free(&other, y, "after release()").await;

    let second = rt.lock_all(keys).lease(LONG_LEASE).held("second").await;
    if fences {
        for (i, (old, new)) in before.iter().zip(second.fences()).enumerate() {
            assert!(
                new > *old,
                "{engine:?}: key {i}: fence {new:?} after {old:?}"
            );
        }
    }
    drop(second);
    within_release(&other, keys, "after drop").await;

    let panicked = tokio::spawn(with_lock(rt.lock_all(keys).lease(LONG_LEASE), async {
        panic!("the body panics");
    }))
    .await;
    assert!(
        panicked.is_err(),
        "{engine:?}: the body's panic reaches the task"
    );
    within_release(&other, keys, "after a panic").await;

    let dropped = Arc::new(AtomicBool::new(false));
    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let flag = SetOnDrop(dropped.clone());
    let task = tokio::spawn(with_lock(rt.lock_all(keys).lease(LONG_LEASE), async move {
        let _flag = flag;
        held_tx.send(()).expect("the test waits");
        tokio::time::sleep(Duration::from_secs(60)).await;
    }));
    held_rx.await.expect("the body runs");
    assert_busy(&other, y, "while the body runs").await;
    task.abort();
    let _ = task.await;
    assert!(dropped.load(Ordering::SeqCst));
    within_release(&other, keys, "after a cancellation").await;
}

/// Every key of `keys` can be taken by `rt` within [`RELEASE_WITHIN`] (a release scheduled
/// from `Drop` has landed).
async fn within_release(rt: &dlock_tests::Runtime, keys: [&str; 2], when: &str) {
    for key in keys {
        dlock_tests::acquire_within(rt, key, RELEASE_WITHIN, when).await;
    }
}

/// The lock record of one key of a held set is deleted behind the holder's back (the
/// engine's own way): the guard's `lost()` resolves and `is_lost()` is true; a `with_lock`
/// body over the set is dropped and the call returns `Err(Lost)` naming that key; the other
/// key is freed with it.
pub(crate) async fn losing_one_key_loses_the_set(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let [rt, other] = fixture.each_runtime().await;
    let (lease, seen_within) = (Duration::from_secs(6), Duration::from_millis(3500));

    let keys = ["conformance:multi:lost:a", "conformance:multi:lost:b"];
    let guard = rt.lock_all(keys).lease(lease).held("acquire").await;
    fixture.delete_lock(keys[1]).await;
    tokio::time::timeout(seen_within, guard.lost())
        .await
        .unwrap_or_else(|_| panic!("{engine:?}: lost() within {seen_within:?} of the delete"));
    assert!(guard.is_lost());
    let late = guard.release().await;
    assert!(
        matches!(late, Err(ref e) if e.is_lost()),
        "{engine:?}: release of a set with a lost key must say so, got {late:?}"
    );
    assert_free(&other, keys[0], "the other key, after the release").await;

    let keys = [
        "conformance:multi:lost-body:a",
        "conformance:multi:lost-body:b",
    ];
    let body = LongBody::default();
    let (task, held_rx) = body.spawn(rt.lock_all(keys).lease(lease));
    held_rx.await.expect("the body runs");
    fixture.delete_lock(keys[1]).await;
    let out = tokio::time::timeout(seen_within, task)
        .await
        .unwrap_or_else(|_| panic!("{engine:?}: with_lock must end within {seen_within:?}"))
        .expect("task");
    body.assert_cancelled_with_lost(&format!("{engine:?}"), keys[1], out);
    dlock_tests::acquire_within(
        &other,
        keys[0],
        RELEASE_WITHIN,
        "the other key, after the loss",
    )
    .await;
}

/// Inside a chain that holds `b`, `lock_all([a, b])` re-enters `b` (same fence) and takes `a`
/// fresh; when the inner call ends, `a` is free again and `b` is still held by the outer call;
/// a nested call on `a` inside the set's body re-enters too. The outer exit frees `b`.
pub(crate) async fn a_set_reenters_the_keys_its_chain_holds(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let [rt, other] = fixture.each_runtime().await;
    let (a, b) = ("conformance:multi:reenter:a", "conformance:multi:reenter:b");
    // Bodies boxed: the nested futures of a debug build stay off the test thread's stack.
    let chain = with_lock(
        rt.lock(b).lease(LONG_LEASE),
        Box::pin(async {
            let outer = dlock_runtime::current_fence();
            let inner = bounded(
                engine,
                with_lock(
                    rt.lock_all([a, b]).lease(LONG_LEASE),
                    Box::pin(async {
                        let nested = bounded(
                            engine,
                            with_lock(rt.lock(a).lease(LONG_LEASE).wait(Duration::ZERO), async {}),
                        )
                        .await;
                        nested.expect("a nested call on a key of the set re-enters");
                        let guard = held_long(
                            rt.lock_all([b, a]),
                            Duration::ZERO,
                            "the same set, re-entered whole",
                        )
                        .await;
                        let fences = guard.fences();
                        guard.release().await.expect("release a re-entry");
                        fences
                    }),
                ),
            )
            .await
            .expect("lock_all inside a chain holding one of its keys");
            assert_eq!(
                inner[1], outer,
                "{engine:?}: b re-entered with the outer fence"
            );
            assert_free(&other, a, "after the inner set ended").await;
            assert_busy(&other, b, "still the outer call's").await;
        }),
    );
    chain.await.expect("outer");
    assert_free(&other, b, "after the outer exit").await;
}

/// A re-entry that deadlocks shows up as a hang; this bounds it.
async fn bounded<T>(engine: Engine, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .unwrap_or_else(|_| panic!("{engine:?}: a re-entry hung"))
}

/// A set held with the engine's short lease for several leases: the watchdog renews every key
/// (the guard is not lost, another runtime finds each key busy at the end), and the release
/// frees them all.
pub(crate) async fn the_watchdog_renews_every_key_of_a_set(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let [rt, other] = fixture.each_runtime().await;
    let params = fixture.params();
    let keys = ["conformance:multi:renew:a", "conformance:multi:renew:b"];
    let guard = rt
        .lock_all(keys)
        .lease(params.short_lease)
        .held("a set with a short lease")
        .await;
    tokio::time::sleep(params.hold_for).await;
    assert!(
        !guard.is_lost(),
        "{engine:?}: a key's lease ran out while held"
    );
    for key in keys {
        assert_busy(&other, key, "after several leases").await;
    }
    guard.release().await.expect("release");
    for key in keys {
        assert_free(&other, key, "after the release").await;
    }
}
