use std::time::Duration;

use tokio::time::Instant;

use super::lock;
use crate::error::LockError;
use crate::protect::with_lock;
use crate::runtime::Runtime;

const SEC: Duration = Duration::from_secs(1);

async fn memory() -> Runtime {
    Runtime::from_url("memory://")
        .await
        .expect("memory runtime")
}

/// `job` taken on `rt` with `hold_at_least(hold)`.
async fn held_at_least(rt: &Runtime, hold: Duration) -> crate::guard::LockGuard {
    rt.lock("job")
        .hold_at_least(hold)
        .acquire()
        .await
        .expect("acquire")
}

/// Whether another owner gets `key` now (and lets it go again).
async fn free(rt: &Runtime, key: &str) -> bool {
    match rt.lock(key).acquire().await {
        Ok(guard) => {
            guard.release().await.expect("release");
            true
        }
        Err(err) => {
            assert!(err.is_timeout(), "{err}");
            false
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_short_hold_keeps_the_key_until_hold_at_least_after_acquisition() {
    let rt = memory().await;
    let guard = rt
        .lock("job")
        .lease(60 * SEC)
        .watchdog(false)
        .hold_at_least(10 * SEC)
        .acquire()
        .await
        .expect("acquire");
    tokio::time::advance(2 * SEC).await;
    guard.release().await.expect("release");
    assert!(!free(&rt, "job").await, "freed when the body ended");
    tokio::time::advance(7900 * Duration::from_millis(1)).await;
    assert!(!free(&rt, "job").await, "freed before the hold ended");
    tokio::time::advance(100 * Duration::from_millis(1)).await;
    assert!(free(&rt, "job").await, "still taken after the hold ended");
}

/// A protected body whose lease runs out unrenewed (no watchdog) takes no step after it,
/// and its call fails `Lost`.
#[tokio::test(start_paused = true)]
async fn a_protected_body_takes_no_step_after_its_validity_ran_out() {
    let rt = memory().await;
    let steps = std::sync::atomic::AtomicU32::new(0);
    let out = with_lock(rt.lock("job").lease(SEC).watchdog(false), async {
        for _ in 0..10 {
            steps.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
    })
    .await;
    assert!(
        matches!(out, Err(LockError::Lost { ref key }) if key == "job"),
        "{out:?}"
    );
    // Steps at 0, 400 and 800 ms; none at 1200 ms.
    assert_eq!(steps.load(std::sync::atomic::Ordering::SeqCst), 3);
}

/// A body cancelled mid-way is dropped inside its level of the call chain, as it ran:
/// what its destructors do still sees the body's hold.
#[tokio::test]
async fn a_cancelled_body_is_dropped_inside_its_level() {
    struct SeesFence(std::sync::Arc<std::sync::Mutex<Option<Option<u64>>>>);
    impl Drop for SeesFence {
        fn drop(&mut self) {
            *self.0.lock().expect("not poisoned") = Some(crate::chain::current_fence());
        }
    }
    let rt = memory().await;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
    let sees = SeesFence(seen.clone());
    let call = with_lock(rt.lock("job"), async move {
        let _sees = sees;
        std::future::pending::<()>().await;
    });
    let mut call = Box::pin(call);
    let polled = tokio::time::timeout(Duration::from_millis(20), call.as_mut()).await;
    assert!(polled.is_err(), "the body never ends");
    drop(call);
    let fence = seen.lock().expect("not poisoned").take();
    assert!(
        matches!(fence, Some(Some(_))),
        "dropped outside its level: {fence:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_dropped_guard_keeps_the_key_too() {
    let rt = memory().await;
    let guard = held_at_least(&rt, 5 * SEC).await;
    drop(guard);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!free(&rt, "job").await, "freed when the guard was dropped");
    tokio::time::sleep(5 * SEC).await;
    assert!(free(&rt, "job").await);
}

#[tokio::test(start_paused = true)]
async fn a_hold_longer_than_hold_at_least_releases_at_once() {
    let rt = memory().await;
    let guard = held_at_least(&rt, SEC).await;
    tokio::time::advance(2 * SEC).await;
    guard.release().await.expect("release");
    assert!(free(&rt, "job").await);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_gets_the_key_when_the_hold_ends_not_before() {
    let rt = memory().await;
    let guard = held_at_least(&rt, 3 * SEC).await;
    let waiter = {
        let rt = rt.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let guard = rt.lock("job").wait(60 * SEC).acquire().await;
            (started.elapsed(), guard.map(drop))
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    guard.release().await.expect("release");
    let (waited, got) = waiter.await.expect("waiter task");
    got.expect("the waiter gets the key");
    assert!(
        waited >= Duration::from_millis(2900) && waited < 4 * SEC,
        "waited {waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn reentrant_holds_do_not_matter_the_outermost_does() {
    let rt = memory().await;
    rt.scope(with_lock(lock("job").hold_at_least(5 * SEC), async {
        // Inner hold without a hold_at_least, ended at once: nothing is released.
        with_lock(lock("job"), async {}).await.expect("re-enter");
    }))
    .await
    .expect("outer");
    assert!(
        !free(&rt, "job").await,
        "the outer hold_at_least was ignored"
    );
    tokio::time::sleep(5 * SEC).await;
    assert!(free(&rt, "job").await);
}

#[tokio::test]
async fn hold_at_least_longer_than_the_lease_is_invalid_config() {
    let rt = memory().await;
    for watchdog in [false, true] {
        let err = rt
            .lock("job")
            .lease(10 * SEC)
            .watchdog(watchdog)
            .hold_at_least(11 * SEC)
            .acquire()
            .await
            .expect_err("hold_at_least > lease");
        assert!(err.is_invalid_config(), "{err}");
        assert!(err.to_string().contains("hold_at_least"), "{err}");
    }
    let equal = rt
        .lock("job")
        .lease(10 * SEC)
        .hold_at_least(10 * SEC)
        .acquire()
        .await
        .expect("hold_at_least == lease");
    drop(equal);
}
