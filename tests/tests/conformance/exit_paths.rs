//! Release on every exit path: return, `Err` through `?`, explicit release, guard drop, panic,
//! cancellation while holding, and cancellation while acquiring or waiting (a cancelled
//! contender leaves nothing behind: the next one gets the key).
//!
//! Leases are 30 s, so a key another owner gets within the bounds here was released, not
//! expired.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use dlock_runtime::{LockError, with_lock};
use dlock_tests::{AcquireExt, HoldExt, Rng, Runtime, hand_off, held_long};
use tokio::task::JoinHandle;

use crate::fixture::{Engine, Fixture};
use crate::support::{
    LONG_LEASE, RELEASE_WITHIN, SetOnDrop, acquire_within, assert_busy, assert_free,
    assert_nothing_left,
};

/// A business error, to leave a critical section with `?`.
#[derive(Debug)]
enum ShopError {
    OutOfStock,
    Lock(LockError),
}

impl From<LockError> for ShopError {
    fn from(e: LockError) -> Self {
        ShopError::Lock(e)
    }
}

fn take_stock(stock: u32) -> Result<u32, ShopError> {
    stock.checked_sub(1).ok_or(ShopError::OutOfStock)
}

/// What the attribute expands to: the body leaves through `?` on a business error.
async fn buy(rt: &Runtime, other: &Runtime, key: &str, stock: u32) -> Result<u32, ShopError> {
    with_lock(rt.lock(key).lease(LONG_LEASE), async {
        assert_busy(other, key, "inside the body").await;
        let left = take_stock(stock)?;
        Ok(left)
    })
    .await?
}

/// Return, `Err` through `?` and explicit release free the key before the call returns;
/// dropping a guard frees it within [`RELEASE_WITHIN`]; the engine keeps no record of any of
/// them afterwards.
pub(crate) async fn release_on_return_err_and_explicit_release(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let [rt, other] = fixture.each_runtime().await;

    let key = "conformance:exit:return";
    let out = with_lock(rt.lock(key).lease(LONG_LEASE), async {
        assert_busy(&other, key, "inside the body").await;
        7
    })
    .await
    .unwrap_or_else(|e| panic!("{engine:?}: with_lock: {e:?}"));
    assert_eq!(out, 7);
    assert_free(&other, key, "right after the body returned").await;

    let key = "conformance:exit:ok";
    match buy(&rt, &other, key, 5).await {
        Ok(left) => assert_eq!(left, 4),
        Err(ShopError::Lock(e)) => panic!("{engine:?}: with_lock: {e:?}"),
        Err(e) => panic!("{engine:?}: {e:?}"),
    }
    assert_free(&other, key, "right after Ok").await;

    let key = "conformance:exit:question-mark";
    let out = buy(&rt, &other, key, 0).await;
    assert!(
        matches!(out, Err(ShopError::OutOfStock)),
        "{engine:?}: expected the business error, got {out:?}"
    );
    assert_free(&other, key, "right after `?` returned Err").await;

    let key = "conformance:exit:explicit";
    let guard = rt.lock(key).lease(LONG_LEASE).held("acquire").await;
    assert_busy(&other, key, "while the guard lives").await;
    guard.release().await.expect("release");
    assert_free(&other, key, "right after release()").await;

    let key = "conformance:exit:drop";
    let guard = rt.lock(key).lease(LONG_LEASE).held("acquire").await;
    assert_busy(&other, key, "while the guard lives").await;
    drop(guard);
    let took = acquire_within(&other, key, RELEASE_WITHIN, "after the guard dropped").await;
    println!("{engine:?}: another owner got the key {took:?} after the guard dropped");
    for key in ["return", "ok", "question-mark", "explicit", "drop"] {
        let key = format!("conformance:exit:{key}");
        assert_nothing_left(&other, &key, "after every exit").await;
    }
}

/// Spawns `with_lock` on `key` (30 s lease) whose body, once it runs, goes on with `then`;
/// returns the task when the body runs and `other` finds the key busy.
async fn spawn_holding<F>(
    rt: &Runtime,
    other: &Runtime,
    key: &'static str,
    then: F,
) -> JoinHandle<Result<(), LockError>>
where
    F: Future<Output = ()> + Send + 'static,
{
    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(with_lock(rt.lock(key).lease(LONG_LEASE), async move {
        held_tx.send(()).expect("the test waits");
        then.await;
    }));
    held_rx.await.expect("the body runs");
    assert_busy(other, key, "inside the body").await;
    task
}

/// A panic in the body, an aborted task and a dropped `with_lock` future all free the key
/// within [`RELEASE_WITHIN`] (released from `Drop`).
pub(crate) async fn release_on_panic_and_cancellation_while_holding(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let [rt, other] = fixture.each_runtime().await;

    let key = "conformance:exit:panic";
    let task = spawn_holding(&rt, &other, key, async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        panic!("deliberate panic inside with_lock");
    })
    .await;
    let err = task.await.expect_err("the task panics");
    assert!(err.is_panic(), "{engine:?}: expected a panic, got {err}");
    let took = acquire_within(&other, key, RELEASE_WITHIN, "after the panic").await;
    println!("{engine:?}: another owner got the key {took:?} after the panic");

    let key = "conformance:exit:abort";
    let task = spawn_holding(&rt, &other, key, std::future::pending()).await;
    task.abort();
    assert!(task.await.expect_err("aborted").is_cancelled());
    let took = acquire_within(&other, key, RELEASE_WITHIN, "after the abort").await;
    println!("{engine:?}: another owner got the key {took:?} after the abort");

    let key = "conformance:exit:dropped-future";
    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let body_dropped = Arc::new(AtomicBool::new(false));
    let flag = SetOnDrop(body_dropped.clone());
    let critical = with_lock(rt.lock(key).lease(LONG_LEASE), async move {
        let _flag = flag;
        held_tx.send(()).expect("the test waits");
        tokio::time::sleep(Duration::from_secs(3600)).await;
    });
    tokio::select! {
        out = critical => panic!("{engine:?}: the body cannot finish: {out:?}"),
        held = held_rx => held.expect("the body runs"),
    }
    assert!(
        body_dropped.load(Ordering::SeqCst),
        "the body future was dropped"
    );
    let took = acquire_within(&other, key, RELEASE_WITHIN, "after the future dropped").await;
    println!("{engine:?}: another owner got the key {took:?} after the future dropped");
    for key in ["panic", "abort", "dropped-future"] {
        let key = format!("conformance:exit:{key}");
        assert_nothing_left(&other, &key, "after every exit").await;
    }
}

/// Two waiters queue behind a holder (another runtime each) and are cancelled while waiting,
/// one by `abort`, one by a timer dropping its future; a third waiter queued behind them gets
/// the key within the engine's notification bound of the release (not after the cancelled
/// ones' leases), and then the engine keeps no record of the key.
pub(crate) async fn cancelled_waiter_leaves_nothing_behind(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let bound = fixture.params().wake_within;
    let rts = fixture.runtimes(4).await;
    let key = "conformance:exit:cancelled-waiter";
    let holder = rts[0].lock(key).lease(LONG_LEASE).held("holder").await;
    let waiter = |rt: &Runtime| {
        rt.lock(key)
            .lease(LONG_LEASE)
            .wait(Duration::from_secs(60))
            .acquire()
    };
    let aborted = tokio::spawn(waiter(&rts[1]));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let dropped = tokio::spawn(tokio::time::timeout(
        Duration::from_millis(1000),
        waiter(&rts[2]),
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let next = rts[3]
        .lock(key)
        .lease(LONG_LEASE)
        .wait(Duration::from_secs(20))
        .spawn();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !aborted.is_finished(),
        "{engine:?}: a waiter got a held key"
    );
    assert!(!next.is_finished(), "{engine:?}: a waiter got a held key");
    aborted.abort();
    assert!(aborted.await.expect_err("aborted").is_cancelled());
    let out = dropped.await.expect("task");
    assert!(
        out.is_err(),
        "{engine:?}: the timer drops the waiter: {out:?}"
    );
    assert!(!next.is_finished(), "{engine:?}: a waiter got a held key");
    let what = format!("{engine:?}: the waiter behind two cancelled ones");
    let guard = hand_off(holder, next, bound, &what).await;
    guard.release().await.expect("release");
    assert_nothing_left(&rts[1], key, "after the hand-off").await;
    assert_free(&rts[1], key, "after the hand-off").await;
}

/// Polls `fut` (yielding in between) until it completes or `after` has passed, then drops it.
/// Finer than tokio's millisecond timers: the cut can land inside one round trip.
async fn drop_after<F: Future>(fut: F, after: Duration) -> Option<F::Output> {
    let deadline = Instant::now() + after;
    let mut fut = pin!(fut);
    loop {
        let step = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
        if let Poll::Ready(out) = step {
            return Some(out);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::task::yield_now().await;
    }
}

/// Polls `fut` at most `polls` times, yielding to the scheduler in between, then drops it.
async fn poll_then_drop<F: Future>(fut: F, polls: u64) -> Option<F::Output> {
    let mut fut = pin!(fut);
    for _ in 0..polls {
        let step = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
        if let Poll::Ready(out) = step {
            return Some(out);
        }
        tokio::task::yield_now().await;
    }
    None
}

/// Waits (by acquiring on another owner) until `key` is free, then checks no late
/// compensation or stray acquisition takes it afterwards.
async fn assert_left_free(other: &Runtime, key: &str, when: &str) {
    acquire_within(other, key, RELEASE_WITHIN, when).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_nothing_left(other, key, when).await;
    assert_free(other, key, when).await;
}

/// Acquisitions cut at random points (after some polls, after some microseconds, by a timer),
/// waiters cut while a hand-off is in flight, and `release()` and `with_lock` dropped
/// mid-flight: none leaves the key held.
pub(crate) async fn cancellation_mid_acquire_leaves_nothing_behind(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let [rt, other] = fixture.each_runtime().await;
    let mut rng = Rng::from_clock();

    let key = "conformance:exit:cut-acquire";
    let (mut acquired, mut cut) = (0u32, 0u32);
    for i in 0..450 {
        let acquire = rt
            .lock(key)
            .lease(LONG_LEASE)
            .wait(Duration::from_secs(5))
            .acquire();
        let outcome = match i % 3 {
            0 => poll_then_drop(acquire, 1 + rng.below(40)).await,
            1 => drop_after(acquire, Duration::from_micros(rng.below(400))).await,
            _ => tokio::time::timeout(Duration::from_micros(rng.below(3000)), acquire)
                .await
                .ok(),
        };
        match outcome {
            Some(Ok(guard)) => {
                acquired += 1;
                drop(guard);
            }
            Some(Err(e)) if e.is_timeout() => {}
            Some(Err(e)) => panic!("{engine:?}: acquire: {e:?}"),
            None => cut += 1,
        }
    }
    println!("{engine:?}: {acquired} acquired then dropped, {cut} cut mid-acquire");
    assert!(
        cut > 0,
        "{engine:?}: no acquisition was cut mid-flight; the test proves nothing"
    );
    assert_left_free(&other, key, "after acquisitions cut mid-flight").await;

    let key = "conformance:exit:cut-hand-off";
    for _round in 0..30 {
        let holder = rt
            .lock(key)
            .lease(LONG_LEASE)
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("{engine:?}: holder: {e:?}"));
        let waiters: Vec<_> = (0..5)
            .map(|i| {
                let rt = [&rt, &other][i % 2].clone();
                tokio::spawn(async move {
                    let guard = rt
                        .lock(key)
                        .lease(LONG_LEASE)
                        .wait(Duration::from_secs(10))
                        .acquire()
                        .await;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    drop(guard);
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_micros(rng.below(3000))).await;
        holder.release().await.expect("holder releases");
        tokio::time::sleep(Duration::from_micros(rng.below(2000))).await;
        for waiter in &waiters {
            waiter.abort();
        }
        for waiter in waiters {
            let _ = waiter.await;
        }
    }
    assert_left_free(&other, key, "after waiters cut during hand-offs").await;

    let key = "conformance:exit:cut-release";
    for polls in 1..=6 {
        let guard = rt
            .hold_within(key, LONG_LEASE, Duration::from_secs(5))
            .await;
        let _ = poll_then_drop(guard.release(), polls).await;
        acquire_within(&other, key, RELEASE_WITHIN, "after release() was dropped").await;
    }
    for _ in 0..40 {
        let lock = rt.lock(key).lease(LONG_LEASE).wait(Duration::from_secs(5));
        let _ = poll_then_drop(with_lock(lock, async {}), 1 + rng.below(30)).await;
        acquire_within(&other, key, RELEASE_WITHIN, "after with_lock was dropped").await;
    }
    assert_left_free(&other, key, "after releases cut mid-flight").await;
}

/// A process whose tokio runtime shuts down while tasks hold locks (`main` returns, the runtime
/// is dropped): the tasks are dropped with their guards, and their releases cannot run on that
/// runtime any more. The keys must still be freed at once, not after their 30 s lease: one
/// guard held by a task when the tokio runtime is dropped, one dropped after it is gone.
pub(crate) async fn guards_dropped_at_tokio_shutdown_are_released(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let url = fixture.url().unwrap_or_else(|| "memory://".to_owned());
    let keys = [
        "conformance:exit:shutdown:in-task",
        "conformance:exit:shutdown:after",
    ];
    // Another process, as far as the lock runtime can tell: its own tokio runtime on a thread.
    let process = std::thread::spawn(move || {
        let tokio_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let (rt, late) = tokio_rt.block_on(async {
            let rt = Runtime::from_url(&url).await.expect("runtime");
            let held = rt.lock(keys[0]).lease(LONG_LEASE).held("in a task").await;
            tokio::spawn(async move {
                let _held = held;
                std::future::pending::<()>().await
            });
            let late = rt.lock(keys[1]).lease(LONG_LEASE).held("kept").await;
            (rt, late)
        });
        drop(tokio_rt);
        drop(late);
        rt
    });
    let shut_down = tokio::task::spawn_blocking(move || process.join().expect("the process"))
        .await
        .expect("join");
    // On the memory engine the state lives in that runtime; elsewhere, ask the engine.
    let other = match engine {
        Engine::Memory => shut_down,
        _ => fixture.runtime().await,
    };
    for key in keys {
        let started = Instant::now();
        let what = format!("{engine:?}: {key} after the shutdown");
        let guard = held_long(other.lock(key), Duration::from_secs(10), &what).await;
        assert!(
            started.elapsed() < RELEASE_WITHIN,
            "{engine:?}: {key} was freed only after {:?}: its release was lost at shutdown",
            started.elapsed()
        );
        guard.release().await.expect("release");
    }
}
