//! `#[distributed_lock]` end to end: the formatted key is held while the body runs and released
//! on every exit path the body can take (`Ok`, `?`, early `return`, panic); a busy lock returns
//! the converted `LockError` without running the body; nested annotated calls re-enter; a lost
//! lease cancels the body.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dlock_runtime::{LockError, distributed_lock};
use dlock_tests::{AcquireExt, Backend, on_both_backends};

#[derive(Debug)]
enum AppError {
    Business(&'static str),
    Lock(LockError),
}

impl From<LockError> for AppError {
    fn from(err: LockError) -> Self {
        AppError::Lock(err)
    }
}

const ASYNC_RELEASE_WITHIN: Duration = Duration::from_secs(2);

on_both_backends!(
    attribute_holds_formatted_key_while_body_runs,
    attribute_releases_on_ok_err_question_mark_and_return,
    attribute_releases_on_panic,
    attribute_busy_lock_returns_timeout_without_running_body,
    attribute_nested_calls_on_same_key_reenter,
    attribute_method_key_uses_self_field,
    attribute_lost_lease_cancels_body,
    attribute_future_is_send_and_spawnable,
);

#[distributed_lock(key = "order:{id}", lease = "30s")]
async fn held_inside(id: u64, b: &Backend) -> Result<bool, AppError> {
    Ok(b.is_held(&format!("order:{id}")).await)
}

#[distributed_lock(key = "order:<id>:<line>", lease = "30s")]
async fn held_inside_angle(id: u64, line: &str, b: &Backend) -> Result<bool, AppError> {
    Ok(b.is_held(&format!("order:{id}:{line}")).await)
}

async fn attribute_holds_formatted_key_while_body_runs(b: Backend) {
    b.rt.scope(async {
        assert!(
            held_inside(7, &b).await.expect("runs"),
            "order:7 held inside"
        );
        assert!(!b.is_held("order:7").await, "released after");
        assert!(held_inside_angle(7, "a", &b).await.expect("runs"));
        assert!(!b.is_held("order:7:a").await);
    })
    .await;
}

/// Exits by `Ok`, by `?` on an `Err`, by an early `return`, or by returning `Err`.
#[distributed_lock(key = "exit:{how}", lease = "30s")]
async fn exit_by(how: &str) -> Result<u32, AppError> {
    if how == "return" {
        return Ok(1);
    }
    if how == "question" {
        Err(AppError::Business("via ?"))?;
    }
    if how == "err" {
        return Err(AppError::Business("returned"));
    }
    Ok(2)
}

async fn attribute_releases_on_ok_err_question_mark_and_return(b: Backend) {
    b.rt.scope(async {
        assert_eq!(exit_by("ok").await.expect("ok"), 2);
        assert_eq!(exit_by("return").await.expect("return"), 1);
        assert!(matches!(
            exit_by("question").await,
            Err(AppError::Business("via ?"))
        ));
        assert!(matches!(
            exit_by("err").await,
            Err(AppError::Business("returned"))
        ));
        for how in ["ok", "return", "question", "err"] {
            // Awaited release: free right away.
            assert!(!b.is_held(&format!("exit:{how}")).await, "exit:{how} held");
        }
    })
    .await;
}

#[distributed_lock(key = "panics", lease = "30s")]
async fn panics() -> Result<(), AppError> {
    panic!("deliberate panic in an annotated fn");
}

async fn attribute_releases_on_panic(b: Backend) {
    let rt = b.rt.clone();
    let err = tokio::spawn(async move { rt.scope(panics()).await })
        .await
        .expect_err("panics");
    assert!(err.is_panic());
    b.wait_until_free("panics", ASYNC_RELEASE_WITHIN).await;
}

#[distributed_lock(key = "busy:{id}", lease = "30s", wait = "200ms")]
async fn busy(id: u64, ran: &AtomicBool) -> Result<(), AppError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

async fn attribute_busy_lock_returns_timeout_without_running_body(b: Backend) {
    let _holder = b.rt.lock("busy:3").held("holder").await;
    let ran = AtomicBool::new(false);
    let out = b.rt.scope(busy(3, &ran)).await;
    match out {
        Err(AppError::Lock(err)) => {
            assert!(err.is_timeout(), "expected Timeout, got {err:?}");
            assert_eq!(err.key(), Some("busy:3"));
        }
        other => panic!("expected Err(Lock(Timeout)), got {other:?}"),
    }
    assert!(!ran.load(Ordering::SeqCst), "the body ran without the lock");
}

#[distributed_lock(key = "nested:{id}", lease = "30s")]
async fn outer(id: u64, b: &Backend) -> Result<u64, AppError> {
    let fence = dlock_runtime::current_fence();
    let inner = inner(id, fence).await?;
    // The inner exit kept the hold.
    assert!(b.is_held(&format!("nested:{id}")).await);
    Ok(inner)
}

#[distributed_lock(key = "nested:{id}", lease = "30s", wait = "0s")]
async fn inner(id: u64, outer_fence: Option<u64>) -> Result<u64, AppError> {
    assert_eq!(
        dlock_runtime::current_fence(),
        outer_fence,
        "reentrant fence"
    );
    Ok(id * 2)
}

async fn attribute_nested_calls_on_same_key_reenter(b: Backend) {
    let out = tokio::time::timeout(Duration::from_secs(10), b.rt.scope(outer(21, &b)))
        .await
        .expect("nested annotated calls deadlocked");
    assert_eq!(out.expect("re-enters"), 42);
    assert!(!b.is_held("nested:21").await);
}

struct Shop {
    tenant: String,
}

impl Shop {
    #[distributed_lock(key = "shop:{self.tenant}:{item}", lease = "30s")]
    async fn buy(&self, item: u32, b: &Backend) -> Result<bool, AppError> {
        Ok(b.is_held(&format!("shop:{}:{item}", self.tenant)).await)
    }
}

async fn attribute_method_key_uses_self_field(b: Backend) {
    let shop = Shop {
        tenant: "acme".to_string(),
    };
    let held = b.rt.scope(shop.buy(5, &b)).await.expect("runs");
    assert!(held, "shop:acme:5 held inside the method");
    assert!(!b.is_held("shop:acme:5").await);
}

#[distributed_lock(key = "lost", lease = "1s", watchdog = false)]
async fn outlives_lease(completed: &AtomicBool) -> Result<(), AppError> {
    tokio::time::sleep(Duration::from_secs(60)).await;
    completed.store(true, Ordering::SeqCst);
    Ok(())
}

async fn attribute_lost_lease_cancels_body(b: Backend) {
    let completed = AtomicBool::new(false);
    let start = std::time::Instant::now();
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        b.rt.scope(outlives_lease(&completed)),
    )
    .await
    .expect("a lost lease must end the call");
    match out {
        Err(AppError::Lock(LockError::Lost { key, .. })) => assert_eq!(key, "lost"),
        other => panic!("expected Err(Lock(Lost)), got {other:?}"),
    }
    assert!(!completed.load(Ordering::SeqCst));
    dlock_tests::assert_between(
        "attribute Err(Lost), lease 1 s, no watchdog",
        start.elapsed(),
        Duration::from_millis(500),
        Duration::from_secs(3),
    );
}

#[distributed_lock(key = "spawned:{id}", lease = "30s", wait = "10s")]
async fn spawnable(id: u64) -> Result<u64, AppError> {
    tokio::time::sleep(Duration::from_millis(5)).await;
    Ok(id)
}

async fn attribute_future_is_send_and_spawnable(b: Backend) {
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let rt = b.rt.clone();
            tokio::spawn(async move { rt.scope(spawnable(9)).await })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.expect("task").expect("acquired"), 9);
    }
    assert!(!b.is_held("spawned:9").await);
}
