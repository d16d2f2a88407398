//! Reentrancy within a call chain (the dynamic extent of `with_lock`): any acquisition of a key
//! the chain holds re-enters with the outer fence and never deadlocks, and the inner exit keeps
//! the outer hold. Where it stops: a task spawned inside the chain, and plain `acquire()`s
//! outside any chain, are other owners.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dlock_runtime::{LockError, current_fence, distributed_lock, with_lock};

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
    let [rt, other] = fixture.each_runtime().await;

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

/// Counts bodies inside at once; `max` is the most seen.
#[derive(Default)]
struct Inside {
    now: AtomicUsize,
    max: AtomicUsize,
}

impl Inside {
    /// Enters, yields long enough for a concurrent branch to run, leaves.
    async fn visit(&self) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(30)).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The body of an annotated call on `conformance:reentrancy:branch:{id}`.
#[distributed_lock(
    key = "conformance:reentrancy:branch:{id}",
    lease = "30s",
    wait = "30s"
)]
async fn branch(id: u32, inside: &Inside) -> Result<Option<u64>, LockError> {
    inside.visit().await;
    Ok(current_fence())
}

/// Inside one call chain, concurrent branches (`join!`, `join_all`) calling an annotated
/// function or `with_lock` on one key are different owners: their bodies never overlap. Where
/// the chain does not hold the key, each branch acquires it in the engine (its own fence);
/// where the caller holds it, the branches re-enter in turn (the caller's fence). Calls nested
/// inside a branch still re-enter at once.
pub(crate) async fn concurrent_branches_of_a_chain_are_different_owners(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let fences = fixture.params().fences;
    let rt = fixture.runtime().await;
    let other = fixture.runtime().await;
    let key = "conformance:reentrancy:branch:7";

    let chain = async {
        // The chain holds another key: the branches acquire key 7 from the engine.
        let inside = Inside::default();
        let (a, b) = with_lock(rt.lock("conformance:reentrancy:caller"), async {
            tokio::join!(branch(7, &inside), branch(7, &inside))
        })
        .await
        .expect("caller");
        let (a, b) = (a.expect("first branch"), b.expect("second branch"));
        assert_eq!(
            inside.max.load(Ordering::SeqCst),
            1,
            "{engine:?}: two branches ran their bodies on one key at once"
        );
        if fences {
            assert_ne!(a, b, "{engine:?}: each branch is its own holder");
        }

        let inside = Inside::default();
        let bodies = (0..4).map(|_| {
            with_lock(rt.lock(key).lease(LONG_LEASE).wait(NO_DEADLOCK), async {
                inside.visit().await;
                // Nested in this branch: re-enters at once.
                with_lock(rt.lock(key).wait(Duration::ZERO), async {})
                    .await
                    .expect("a call nested in a branch re-enters");
            })
        });
        with_lock(rt.lock("conformance:reentrancy:caller"), async {
            for out in futures_util::future::join_all(bodies).await {
                out.expect("branch");
            }
        })
        .await
        .expect("caller");
        assert_eq!(
            inside.max.load(Ordering::SeqCst),
            1,
            "{engine:?}: join_all branches ran their bodies on one key at once"
        );

        // The caller holds key 7: the branches re-enter its hold, one after the other.
        let inside = Inside::default();
        with_lock(rt.lock(key).lease(LONG_LEASE), async {
            let outer = current_fence();
            let (a, b) = tokio::join!(branch(7, &inside), branch(7, &inside));
            assert_eq!(
                (a.expect("first branch"), b.expect("second branch")),
                (outer, outer),
                "{engine:?}: re-entries keep the caller's fence"
            );
            assert_busy(&other, key, "after the branches").await;
        })
        .await
        .expect("caller");
        assert_eq!(
            inside.max.load(Ordering::SeqCst),
            1,
            "{engine:?}: branches re-entering the caller's hold ran at once"
        );
        assert_free(&other, key, "after the caller").await;
    };
    tokio::time::timeout(Duration::from_secs(60), rt.scope(chain))
        .await
        .unwrap_or_else(|_| panic!("{engine:?}: concurrent branches deadlocked"));
}

/// A reentrant guard never outlives the hold it re-entered: one returned out of its call chain
/// does not keep the key locked once the chain's own hold ends; it reports the lock lost
/// (`is_lost`, `lost()`, and `release` returns `Lost`), and another owner gets the key at once.
pub(crate) async fn reentrant_guard_kept_past_its_chain_is_lost(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let [rt, other] = fixture.each_runtime().await;
    let key = "conformance:reentrancy:escaped";

    let escaped = with_lock(rt.lock(key).lease(LONG_LEASE), async {
        let inner = rt.lock(key).held("re-enters").await;
        assert!(
            !inner.is_lost(),
            "{engine:?}: lost while the chain holds it"
        );
        inner
    })
    .await
    .expect("with_lock");
    assert_free(&other, key, "after the chain returned its reentrant guard").await;
    assert!(
        escaped.is_lost(),
        "{engine:?}: an orphaned guard must say it is lost"
    );
    tokio::time::timeout(Duration::from_secs(1), escaped.lost())
        .await
        .unwrap_or_else(|_| panic!("{engine:?}: lost() of an orphaned guard never resolved"));
    let err = escaped
        .release()
        .await
        .expect_err("an orphaned guard's release");
    assert!(err.is_lost(), "{engine:?}: expected Lost, got {err:?}");
    let guard = other.lock(key).held("after everything").await;
    guard.release().await.expect("release");
}
