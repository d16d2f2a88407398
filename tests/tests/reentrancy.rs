//! Reentrancy within a call chain (the dynamic extent of `with_lock`), and where it stops:
//! spawned tasks and plain `acquire()` outside any chain are other owners.

use std::time::Duration;

use dlock_runtime::{current_fence, with_lock};
use dlock_tests::{Backend, on_both_backends};

const LEASE: Duration = Duration::from_secs(30);
/// A deadlock in reentrancy shows up as a hang; this bounds it.
const NO_DEADLOCK: Duration = Duration::from_secs(10);

on_both_backends!(
    nested_with_lock_same_key_reenters,
    inner_exit_keeps_outer_hold,
    acquire_inside_with_lock_same_key_reenters,
    free_lock_fn_inside_with_lock_reenters,
    task_spawned_inside_chain_is_another_owner,
    plain_acquires_outside_any_chain_are_distinct_owners,
    reentrant_fence_equals_outer_fence,
    current_fence_inside_with_lock_is_the_holds_fence_and_none_outside,
    current_fence_is_the_innermost_lock,
);

/// Asserts a fresh owner (another task, one attempt) cannot take `key`.
async fn assert_other_owner_blocked(b: &Backend, key: &'static str) {
    let rt = b.rt.clone();
    let attempt = tokio::spawn(async move {
        rt.lock(key)
            .lease(LEASE)
            .wait(Duration::ZERO)
            .acquire()
            .await
            .map(|_guard| ())
    })
    .await
    .expect("task");
    let err = attempt.expect_err("another owner must not get a held key");
    assert!(err.is_timeout(), "expected Timeout, got {err:?}");
}

async fn nested_with_lock_same_key_reenters(b: Backend) {
    let key = "reentrant:nested";
    let out = tokio::time::timeout(
        NO_DEADLOCK,
        with_lock(b.rt.lock(key).lease(LEASE), async {
            with_lock(b.rt.lock(key).lease(LEASE), async {
                with_lock(b.rt.lock(key).lease(LEASE), async { 3 }).await
            })
            .await
        }),
    )
    .await
    .expect("nested with_lock on the same key deadlocked");
    assert_eq!(out.expect("outer").expect("middle").expect("inner"), 3);
    assert!(!b.is_held(key).await, "the outermost exit releases");
}

async fn inner_exit_keeps_outer_hold(b: Backend) {
    let key = "reentrant:inner-exit";
    tokio::time::timeout(
        NO_DEADLOCK,
        with_lock(b.rt.lock(key).lease(LEASE), async {
            with_lock(b.rt.lock(key).lease(LEASE), async {})
                .await
                .expect("inner re-enters");
            assert!(b.is_held(key).await, "inner exit released the outer hold");
            assert_other_owner_blocked(&b, key).await;
        }),
    )
    .await
    .expect("deadlock")
    .expect("outer");
    assert!(!b.is_held(key).await);
}

async fn acquire_inside_with_lock_same_key_reenters(b: Backend) {
    let key = "reentrant:acquire";
    tokio::time::timeout(
        NO_DEADLOCK,
        with_lock(b.rt.lock(key).lease(LEASE), async {
            let inner =
                b.rt.lock(key)
                    .lease(LEASE)
                    .wait(Duration::ZERO)
                    .acquire()
                    .await
                    .expect("acquire() inside the chain re-enters");
            inner.release().await.expect("inner release");
            assert!(b.is_held(key).await, "inner release dropped the outer hold");
            assert_other_owner_blocked(&b, key).await;
            let dropped =
                b.rt.lock(key)
                    .wait(Duration::ZERO)
                    .acquire()
                    .await
                    .expect("re-enters again");
            drop(dropped);
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(b.is_held(key).await, "inner drop dropped the outer hold");
            assert_other_owner_blocked(&b, key).await;
        }),
    )
    .await
    .expect("deadlock")
    .expect("outer");
    assert!(!b.is_held(key).await);
}

async fn free_lock_fn_inside_with_lock_reenters(b: Backend) {
    let key = "reentrant:free-fn";
    b.rt.scope(async {
        tokio::time::timeout(
            NO_DEADLOCK,
            with_lock(dlock_runtime::lock(key).lease(LEASE), async {
                let inner = dlock_runtime::lock(key)
                    .wait(Duration::ZERO)
                    .acquire()
                    .await
                    .expect("dlock_runtime::lock(..).acquire() inside the chain re-enters");
                assert_eq!(inner.fence(), current_fence());
                inner.release().await.expect("inner release");
                assert_other_owner_blocked(&b, key).await;
            }),
        )
        .await
        .expect("deadlock")
        .expect("outer");
    })
    .await;
    assert!(!b.is_held(key).await);
}

async fn task_spawned_inside_chain_is_another_owner(b: Backend) {
    let key = "reentrant:spawned";
    with_lock(b.rt.lock(key).lease(LEASE), async {
        let rt = b.rt.clone();
        let spawned = tokio::spawn(async move {
            rt.lock(key)
                .lease(LEASE)
                .wait(Duration::from_millis(300))
                .acquire()
                .await
                .map(|_guard| ())
        });
        let err = spawned
            .await
            .expect("task")
            .expect_err("a spawned task is another owner");
        assert!(err.is_timeout(), "expected Timeout, got {err:?}");
        // Same for with_lock in a spawned task.
        let rt = b.rt.clone();
        let spawned = tokio::spawn(async move {
            with_lock(
                rt.lock(key).lease(LEASE).wait(Duration::from_millis(300)),
                async {},
            )
            .await
        });
        let err = spawned
            .await
            .expect("task")
            .expect_err("a spawned task is another owner");
        assert!(err.is_timeout(), "expected Timeout, got {err:?}");
    })
    .await
    .expect("outer");
}

async fn plain_acquires_outside_any_chain_are_distinct_owners(b: Backend) {
    let key = "reentrant:outside";
    let first = b.rt.lock(key).lease(LEASE).acquire().await.expect("first");
    let err =
        b.rt.lock(key)
            .lease(LEASE)
            .wait(Duration::ZERO)
            .acquire()
            .await
            .map(|_guard| ())
            .expect_err("outside a chain each acquire() is its own owner");
    assert!(err.is_timeout(), "expected Timeout, got {err:?}");
    first.release().await.expect("release");
}

async fn reentrant_fence_equals_outer_fence(b: Backend) {
    let key = "reentrant:fence";
    with_lock(b.rt.lock(key).lease(LEASE), async {
        let outer = current_fence().expect("a fence inside with_lock");
        let inner =
            b.rt.lock(key)
                .wait(Duration::ZERO)
                .acquire()
                .await
                .expect("re-enters");
        assert_eq!(inner.fence(), Some(outer));
        with_lock(b.rt.lock(key), async {
            assert_eq!(current_fence(), Some(outer));
        })
        .await
        .expect("nested with_lock");
        drop(inner);
        assert_eq!(current_fence(), Some(outer));
    })
    .await
    .expect("outer");
}

async fn current_fence_inside_with_lock_is_the_holds_fence_and_none_outside(b: Backend) {
    let key = "reentrant:current-fence";
    assert_eq!(current_fence(), None, "no chain, no fence");
    let before = b.rt.lock(key).lease(LEASE).acquire().await.expect("before");
    let before_fence = before.fence().expect("fence");
    assert_eq!(current_fence(), None, "a plain guard is not a call chain");
    before.release().await.expect("release");

    let inside = with_lock(b.rt.lock(key).lease(LEASE), async {
        let fence = current_fence().expect("a fence inside with_lock");
        // The guard of the hold, seen through a reentrant acquisition.
        let guard = b.rt.lock(key).acquire().await.expect("re-enters");
        assert_eq!(guard.fence(), Some(fence));
        fence
    })
    .await
    .expect("with_lock");
    assert!(
        inside > before_fence,
        "{inside} must exceed the earlier {before_fence}"
    );
    assert_eq!(current_fence(), None, "after the chain, no fence");

    let after = b.rt.lock(key).lease(LEASE).acquire().await.expect("after");
    assert!(after.fence().expect("fence") > inside);
}

async fn current_fence_is_the_innermost_lock(b: Backend) {
    // Move the inner key's counter ahead so the two keys' fences differ.
    for _ in 0..3 {
        let g =
            b.rt.lock("reentrant:inner-key")
                .acquire()
                .await
                .expect("bump");
        g.release().await.expect("release");
    }
    with_lock(b.rt.lock("reentrant:outer-key").lease(LEASE), async {
        let outer = current_fence().expect("outer fence");
        with_lock(b.rt.lock("reentrant:inner-key").lease(LEASE), async {
            let inner =
                b.rt.lock("reentrant:inner-key")
                    .acquire()
                    .await
                    .expect("re-enters the inner key");
            assert_ne!(
                inner.fence(),
                Some(outer),
                "fences of the two keys must differ"
            );
            assert_eq!(current_fence(), inner.fence());
        })
        .await
        .expect("inner");
        assert_eq!(
            current_fence(),
            Some(outer),
            "back to the outer lock's fence"
        );
    })
    .await
    .expect("outer");
}
