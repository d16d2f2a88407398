//! Reentrancy within a call chain (the dynamic extent of `with_lock`): any acquisition of a key
//! the chain holds re-enters with the outer fence and never deadlocks, and the inner exit keeps
//! the outer hold. Where it stops: a task spawned inside the chain, and plain `acquire()`s
//! outside any chain, are other owners.

use std::time::Duration;

use dlock_runtime::{current_fence, with_lock};

use crate::fixture::{Engine, Fixture};
use crate::support::{LONG_LEASE, assert_busy, assert_free};
use dlock_tests::{AcquireExt, HoldExt};

/// A deadlock in reentrancy shows up as a hang; this bounds it.
const NO_DEADLOCK: Duration = Duration::from_secs(10);

/// Three nested `with_lock`s on one key; then, inside one chain, a nested `with_lock`, an
/// `acquire()` released explicitly, one dropped, and `dlock_runtime::lock(..)` on the scoped
/// runtime: each re-enters at once with the outer fence, and after each inner exit another
/// runtime still finds the key busy. The outermost exit frees it.
pub(crate) async fn nested_acquisition_reenters_and_inner_exit_keeps_the_hold(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let (rt, other) = (fixture.runtime().await, fixture.runtime().await);

    let key = "conformance:reentrancy:nested";
    let out = tokio::time::timeout(
        NO_DEADLOCK,
        with_lock(rt.lock(key).lease(LONG_LEASE), async {
            with_lock(rt.lock(key).lease(LONG_LEASE), async {
                with_lock(rt.lock(key).lease(LONG_LEASE), async { 3 }).await
            })
            .await
        }),
    )
    .await
    .unwrap_or_else(|_| panic!("{engine:?}: nested with_lock on one key deadlocked"));
    assert_eq!(out.expect("outer").expect("middle").expect("inner"), 3);
    assert_free(&other, key, "after the outermost exit").await;

    let key = "conformance:reentrancy:inner-exits";
    let chain = with_lock(dlock_runtime::lock(key).lease(LONG_LEASE), async {
        let outer = current_fence();
        let nested = with_lock(rt.lock(key).lease(LONG_LEASE).wait(Duration::ZERO), async {
            current_fence()
        })
        .await
        .expect("a nested with_lock re-enters");
        assert_eq!(
            nested, outer,
            "{engine:?}: nested with_lock keeps the outer fence"
        );
        assert_busy(&other, key, "after a nested with_lock exited").await;

        let inner = rt.hold_within(key, LONG_LEASE, Duration::ZERO).await;
        assert_eq!(
            inner.fence(),
            outer,
            "{engine:?}: acquire() keeps the outer fence"
        );
        inner.release().await.expect("inner release");
        assert_busy(&other, key, "after an inner release()").await;

        let dropped = rt
            .lock(key)
            .wait(Duration::ZERO)
            .held("re-enters again")
            .await;
        drop(dropped);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_busy(&other, key, "after an inner guard dropped").await;

        let free_fn = dlock_runtime::lock(key)
            .wait(Duration::ZERO)
            .held("dlock_runtime::lock(..).acquire() inside the chain re-enters")
            .await;
        assert_eq!(free_fn.fence(), outer);
        free_fn.release().await.expect("inner release");
        assert_busy(&other, key, "after the free function's release").await;
    });
    tokio::time::timeout(NO_DEADLOCK, rt.scope(chain))
        .await
        .unwrap_or_else(|_| panic!("{engine:?}: reentrant acquisition deadlocked"))
        .expect("outer");
    assert_free(&other, key, "after the outermost exit").await;
}

/// Inside a chain, a spawned task is another owner (`acquire()` and `with_lock` there time out);
/// outside any chain, two `acquire()`s of one key in one task are two owners.
pub(crate) async fn other_tasks_and_plain_acquires_are_other_owners(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let rt = fixture.runtime().await;

    let key = "conformance:reentrancy:spawned";
    with_lock(rt.lock(key).lease(LONG_LEASE), async {
        // The chain is looked up when a task acquires, not when its lock is built.
        let lock = || {
            rt.lock(key)
                .lease(LONG_LEASE)
                .wait(Duration::from_millis(300))
        };
        let (out, _) = lock().spawn().await.expect("task");
        let acquired = out.map(drop);
        let with_lock_in_task = tokio::spawn(with_lock(lock(), async {})).await;
        for out in [acquired, with_lock_in_task.expect("task")] {
            let err = out.expect_err("a spawned task is another owner");
            assert!(
                err.is_timeout(),
                "{engine:?}: expected Timeout, got {err:?}"
            );
        }
    })
    .await
    .expect("outer");

    let key = "conformance:reentrancy:outside";
    let first = rt.lock(key).lease(LONG_LEASE).held("first").await;
    rt.lock(key)
        .lease(LONG_LEASE)
        .wait(Duration::ZERO)
        .times_out("outside a chain each acquire() is its own owner")
        .await;
    first.release().await.expect("release");
}

/// `current_fence()` is `None` outside any chain (a plain guard is not a chain), the hold's
/// fence inside `with_lock`, the innermost lock's fence when two keys nest, and the outer one's
/// again once the inner exits. The chain's fence exceeds the holder's before it and is exceeded
/// by the next (`None` throughout on Redlock).
pub(crate) async fn current_fence_is_the_innermost_holds(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let fences = fixture.params().fences;
    let rt = fixture.runtime().await;

    let key = "conformance:reentrancy:current-fence";
    assert_eq!(current_fence(), None, "no chain, no fence");
    let before = rt.lock(key).lease(LONG_LEASE).held("before").await;
    let before_fence = before.fence();
    assert_eq!(current_fence(), None, "a plain guard is not a call chain");
    before.release().await.expect("release");
    let inside = with_lock(rt.lock(key).lease(LONG_LEASE), async {
        let fence = current_fence();
        let guard = rt.lock(key).held("re-enters").await;
        assert_eq!(guard.fence(), fence, "{engine:?}: the hold's fence");
        fence
    })
    .await
    .expect("with_lock");
    assert_eq!(current_fence(), None, "after the chain, no fence");
    let after = rt.lock(key).lease(LONG_LEASE).held("after").await;
    if fences {
        assert!(
            before_fence.is_some() && inside > before_fence,
            "{engine:?}: {inside:?} after {before_fence:?}"
        );
        assert!(
            after.fence() > inside,
            "{engine:?}: {:?} after {inside:?}",
            after.fence()
        );
    } else {
        assert_eq!(
            (before_fence, inside, after.fence()),
            (None, None, None),
            "{engine:?}: no fences"
        );
    }
    after.release().await.expect("release");

    let (outer_key, inner_key) = (
        "conformance:reentrancy:outer-key",
        "conformance:reentrancy:inner-key",
    );
    // Move the inner key's tokens ahead so that the two keys' fences differ on every engine.
    for _ in 0..3 {
        rt.lock(inner_key).cycled("bump").await;
    }
    with_lock(rt.lock(outer_key).lease(LONG_LEASE), async {
        let outer = current_fence();
        with_lock(rt.lock(inner_key).lease(LONG_LEASE), async {
            let inner = rt.lock(inner_key).held("re-enters the inner key").await;
            if fences {
                assert_ne!(
                    inner.fence(),
                    outer,
                    "{engine:?}: the two keys' fences must differ"
                );
            }
            assert_eq!(
                current_fence(),
                inner.fence(),
                "{engine:?}: the innermost lock's fence"
            );
        })
        .await
        .expect("inner");
        assert_eq!(
            current_fence(),
            outer,
            "{engine:?}: back to the outer lock's fence"
        );
    })
    .await
    .expect("outer");
}
