//! Fencing tokens: every fresh holder of a key gets a token greater than all earlier ones, across
//! runtimes, successive or contending, and a reentrant hold keeps the outer token. Redlock
//! cannot give that guarantee and says so in types: its `fence()` is always `None`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_runtime::{current_fence, with_lock};

use crate::fixture::{Engine, Fixture};
use crate::support::LONG_LEASE;
use dlock_tests::{AcquireExt, LONG_WAIT, finish_within, held_long};

/// Checks one holder's token: `Some` where the engine gives fences, `None` on Redlock.
#[track_caller]
fn token(engine: Engine, fences: bool, fence: Option<u64>) -> Option<u64> {
    if fences {
        assert!(
            fence.is_some(),
            "{engine:?}: a fresh holder must get a fence"
        );
    } else {
        assert_eq!(fence, None, "{engine:?}: no fence on this engine");
    }
    fence
}

#[track_caller]
fn assert_strictly_increasing(engine: Engine, fences: &[Option<u64>]) {
    for pair in fences.windows(2) {
        assert!(
            pair[0] < pair[1],
            "{engine:?}: fences not strictly increasing: {fences:?}"
        );
    }
}

/// Twenty successive holders alternating between two runtimes (another key taken and released
/// while each holds), then fifty holders from ten
/// tasks on two runtimes contending (tokens recorded in critical-section order), then a
/// reentrant hold and the next fresh one: strictly increasing tokens; the reentrant
/// acquisitions (`acquire()` and a nested `with_lock`) keep the outer token.
pub(crate) async fn fences_strictly_increase_across_holders(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let fences = fixture.params().fences;
    let rts = fixture.runtimes(2).await;

    let key = "conformance:fencing:successive";
    let mut seen = Vec::new();
    for i in 0..20 {
        let guard = rts[i % 2].lock(key).lease(LONG_LEASE).held("acquire").await;
        seen.push(token(engine, fences, guard.fence()));
        // Another key's holders in between (a store-wide revision or zxid moves too).
        rts[(i + 1) % 2]
            .lock(format!("conformance:fencing:unrelated:{i}"))
            .cycled("another key")
            .await;
        guard.release().await.expect("release");
    }
    if fences {
        assert_strictly_increasing(engine, &seen);
    }

    let key = "conformance:fencing:contending";
    let seen = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let (rt, seen) = (rts[i % 2].clone(), seen.clone());
            tokio::spawn(async move {
                let what = format!("{engine:?}: acquire");
                for _ in 0..5 {
                    let guard = held_long(rt.lock(key), LONG_WAIT, &what).await;
                    seen.lock().expect("not poisoned").push(guard.fence());
                    tokio::task::yield_now().await;
                    guard.release().await.expect("release");
                }
            })
        })
        .collect();
    finish_within(tasks, Duration::from_secs(120)).await;
    let seen = seen.lock().expect("not poisoned").clone();
    assert_eq!(seen.len(), 50);
    for fence in &seen {
        token(engine, fences, *fence);
    }
    if fences {
        assert_strictly_increasing(engine, &seen);
    }

    let key = "conformance:fencing:reentrant";
    let rt = &rts[0];
    let first = rt.lock(key).lease(LONG_LEASE).held("first").await;
    let f1 = token(engine, fences, first.fence());
    first.release().await.expect("release");
    let f2 = with_lock(rt.lock(key).lease(LONG_LEASE), async {
        let outer = token(engine, fences, current_fence());
        let inner = rt.lock(key).held("re-enters").await;
        assert_eq!(
            inner.fence(),
            outer,
            "{engine:?}: a reentrant hold keeps the outer fence"
        );
        let nested = with_lock(rt.lock(key), async { current_fence() })
            .await
            .expect("nested");
        assert_eq!(
            nested, outer,
            "{engine:?}: a nested with_lock keeps the outer fence"
        );
        drop(inner);
        assert_eq!(
            current_fence(),
            outer,
            "{engine:?}: the chain's fence after an inner drop"
        );
        outer
    })
    .await
    .expect("with_lock");
    let third = rts[1].lock(key).lease(LONG_LEASE).held("third").await;
    let f3 = token(engine, fences, third.fence());
    if fences {
        assert_strictly_increasing(engine, &[f1, f2, f3]);
    }
}
