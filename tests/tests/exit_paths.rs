//! Release on every exit path: return, `Err`, panic, cancellation while holding, cancellation
//! while acquiring, explicit release, guard drop.
//!
//! Leases are 30 s throughout, so a key that becomes free within the bounds below was released,
//! not expired.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use dlock_runtime::with_lock;
use dlock_tests::{Backend, Rng, on_both_backends};

const LEASE: Duration = Duration::from_secs(30);
/// Bound for a release scheduled from `Drop` (panic, cancellation): generous for a noisy box,
/// and far below the lease.
const ASYNC_RELEASE_WITHIN: Duration = Duration::from_secs(2);

on_both_backends!(
    release_on_return,
    release_on_err,
    release_on_panic,
    release_on_cancellation_while_holding_abort,
    release_on_cancellation_while_holding_dropped_future,
    no_leak_on_cancellation_while_acquiring,
    no_leak_on_cancellation_while_waiting_during_handoff,
    no_leak_on_cancellation_while_releasing,
    explicit_release_frees_key,
    guard_drop_frees_key,
);

/// Asserts nobody holds `key` right now and that a fresh owner gets it in one attempt.
async fn assert_free_now(b: &Backend, key: &str) {
    assert!(!b.is_held(key).await, "{:?}: {key} is still held", b.engine);
    let guard =
        b.rt.lock(key)
            .lease(LEASE)
            .wait(Duration::ZERO)
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("{:?}: {key} should be free: {e}", b.engine));
    guard.release().await.expect("release");
}

/// Polls one-attempt acquisitions until one succeeds; panics after `within`.
async fn acquire_soon(b: &Backend, key: &str, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        match b
            .rt
            .lock(key)
            .lease(LEASE)
            .wait(Duration::ZERO)
            .acquire()
            .await
        {
            Ok(guard) => {
                let took = start.elapsed();
                guard.release().await.expect("release");
                return took;
            }
            Err(e) if e.is_timeout() => {
                assert!(
                    start.elapsed() < within,
                    "{:?}: {key} still locked {within:?} later",
                    b.engine
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!("{:?}: acquire {key}: {e}", b.engine),
        }
    }
}

async fn release_on_return(b: Backend) {
    let key = "exit:return";
    let out = with_lock(b.rt.lock(key).lease(LEASE), async {
        assert!(b.is_held(key).await, "held inside the body");
        7
    })
    .await
    .expect("with_lock");
    assert_eq!(out, 7);
    assert_free_now(&b, key).await;
}

async fn release_on_err(b: Backend) {
    let key = "exit:err";
    let out: Result<(), &str> = with_lock(b.rt.lock(key).lease(LEASE), async {
        assert!(b.is_held(key).await, "held inside the body");
        Err("business error")
    })
    .await
    .expect("with_lock itself succeeds");
    assert_eq!(out, Err("business error"));
    assert_free_now(&b, key).await;
}

async fn release_on_panic(b: Backend) {
    let key = "exit:panic";
    let rt = b.rt.clone();
    let task = tokio::spawn(async move {
        with_lock(rt.lock(key).lease(LEASE), async {
            panic!("deliberate panic inside with_lock");
        })
        .await
    });
    let err = task.await.expect_err("the task panics");
    assert!(err.is_panic(), "expected a panic, got {err}");
    let took = b.wait_until_free(key, ASYNC_RELEASE_WITHIN).await;
    println!("{:?}: free {took:?} after the panic", b.engine);
    assert_free_now(&b, key).await;
}

async fn release_on_cancellation_while_holding_abort(b: Backend) {
    let key = "exit:abort";
    let rt = b.rt.clone();
    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        with_lock(rt.lock(key).lease(LEASE), async move {
            let _ = held_tx.send(());
            std::future::pending::<()>().await;
        })
        .await
    });
    tokio::time::timeout(Duration::from_secs(10), held_rx)
        .await
        .expect("body starts")
        .expect("body signals");
    assert!(b.is_held(key).await);
    task.abort();
    let err = task.await.expect_err("aborted");
    assert!(err.is_cancelled());
    let took = acquire_soon(&b, key, ASYNC_RELEASE_WITHIN).await;
    println!("{:?}: acquired {took:?} after abort", b.engine);
}

async fn release_on_cancellation_while_holding_dropped_future(b: Backend) {
    let key = "exit:dropped";
    let started = Instant::now();
    let body_ran = std::sync::atomic::AtomicBool::new(false);
    let cut = tokio::time::timeout(
        Duration::from_millis(300),
        with_lock(b.rt.lock(key).lease(LEASE), async {
            body_ran.store(true, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }),
    )
    .await;
    assert!(cut.is_err(), "the timeout drops the future");
    assert!(body_ran.load(std::sync::atomic::Ordering::SeqCst));
    let took = acquire_soon(&b, key, ASYNC_RELEASE_WITHIN).await;
    println!(
        "{:?}: acquired {took:?} after the drop ({:?} since start)",
        b.engine,
        started.elapsed()
    );
}

/// Polls `fut` (yielding in between) until it completes or `after` has passed, then drops it.
/// Finer than tokio's millisecond timers: the cut can land inside one Redis round trip.
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

async fn no_leak_on_cancellation_while_acquiring(b: Backend) {
    let key = "exit:cancel-acquire";
    let mut rng = Rng::from_clock();
    let (mut acquired, mut cut) = (0u32, 0u32);
    for i in 0..450 {
        let acquire =
            b.rt.lock(key)
                .lease(LEASE)
                .wait(Duration::from_secs(5))
                .acquire();
        // Three ways to cut the future mid-flight: after a random number of polls, after a
        // random 0..400 us (about one round trip, so requests sent but not yet answered get
        // cut), and by a tokio timer of 0..3 ms.
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
            Some(Err(e)) => panic!("{:?}: acquire: {e}", b.engine),
            None => cut += 1,
        }
    }
    println!(
        "{:?}: {acquired} acquired then dropped, {cut} cut mid-acquire",
        b.engine
    );
    assert!(
        cut > 0,
        "no acquisition was cut mid-flight; the test proves nothing"
    );
    b.wait_until_free(key, ASYNC_RELEASE_WITHIN).await;
    // A late compensation must not have been overtaken by its own acquisition.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_free_now(&b, key).await;
}

async fn no_leak_on_cancellation_while_waiting_during_handoff(b: Backend) {
    let key = "exit:cancel-wait";
    let mut rng = Rng::from_clock();
    for _round in 0..30 {
        let holder =
            b.rt.lock(key)
                .lease(LEASE)
                .wait(Duration::from_secs(10))
                .acquire()
                .await
                .expect("holder acquires");
        let waiters: Vec<_> = (0..5)
            .map(|_| {
                let rt = b.rt.clone();
                tokio::spawn(async move {
                    let guard = rt
                        .lock(key)
                        .lease(LEASE)
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
        // Cut the waiters while the hand-off is in flight.
        tokio::time::sleep(Duration::from_micros(rng.below(2000))).await;
        for waiter in &waiters {
            waiter.abort();
        }
        for waiter in waiters {
            let _ = waiter.await;
        }
    }
    b.wait_until_free(key, ASYNC_RELEASE_WITHIN).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_free_now(&b, key).await;
}

async fn no_leak_on_cancellation_while_releasing(b: Backend) {
    let key = "exit:cancel-release";
    let mut rng = Rng::from_clock();
    // An explicit release() dropped after a few polls.
    for polls in 1..=6 {
        let guard =
            b.rt.lock(key)
                .lease(LEASE)
                .wait(Duration::from_secs(5))
                .acquire()
                .await
                .expect("acquire");
        let _ = poll_then_drop(guard.release(), polls).await;
        println!("release() dropped after at most {polls} polls");
        b.wait_until_free(key, ASYNC_RELEASE_WITHIN).await;
    }
    // with_lock dropped at a random point: while acquiring, in the body, or while releasing.
    for _ in 0..40 {
        let lock = b.rt.lock(key).lease(LEASE).wait(Duration::from_secs(5));
        let polls = 1 + rng.below(30);
        let finished = poll_then_drop(with_lock(lock, async {}), polls).await;
        println!(
            "with_lock {} after at most {polls} polls",
            if finished.is_some() {
                "finished"
            } else {
                "dropped"
            }
        );
        b.wait_until_free(key, ASYNC_RELEASE_WITHIN).await;
    }
    assert_free_now(&b, key).await;
}

async fn explicit_release_frees_key(b: Backend) {
    let key = "exit:explicit";
    let guard =
        b.rt.lock(key)
            .lease(LEASE)
            .acquire()
            .await
            .expect("acquire");
    assert!(b.is_held(key).await);
    guard.release().await.expect("release");
    assert_free_now(&b, key).await;
}

async fn guard_drop_frees_key(b: Backend) {
    let key = "exit:drop";
    let guard =
        b.rt.lock(key)
            .lease(LEASE)
            .acquire()
            .await
            .expect("acquire");
    assert!(b.is_held(key).await);
    drop(guard);
    let took = b.wait_until_free(key, ASYNC_RELEASE_WITHIN).await;
    println!("{:?}: free {took:?} after drop", b.engine);
    assert_free_now(&b, key).await;
}
