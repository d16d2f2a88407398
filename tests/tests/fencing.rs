//! Fencing tokens: strictly increasing per key across holders, kept by reentrant acquisitions,
//! and never going backwards when Redis restarts empty (the counter is floored at server TIME).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock_runtime::{current_fence, with_lock};
use dlock_tests::{Backend, RedisServer, Runtime, fence_key, on_both_backends};

const LEASE: Duration = Duration::from_secs(30);

on_both_backends!(
    fences_strictly_increase_across_20_successive_holders,
    fences_strictly_increase_across_concurrent_holders,
    fence_survives_reentrancy,
);

#[track_caller]
fn assert_strictly_increasing(fences: &[u64]) {
    for pair in fences.windows(2) {
        assert!(
            pair[0] < pair[1],
            "fences not strictly increasing: {fences:?}"
        );
    }
}

async fn fences_strictly_increase_across_20_successive_holders(b: Backend) {
    let key = "fencing:successive";
    let other = b.other_runtime().await;
    let mut fences = Vec::new();
    for i in 0..20 {
        let rt = if i % 2 == 0 { &b.rt } else { &other };
        let guard = rt.lock(key).lease(LEASE).acquire().await.expect("acquire");
        fences.push(guard.fence().expect("a fence on this engine"));
        guard.release().await.expect("release");
    }
    assert_strictly_increasing(&fences);
}

async fn fences_strictly_increase_across_concurrent_holders(b: Backend) {
    let key = "fencing:concurrent";
    let seen = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let (rt, seen) = (b.rt.clone(), seen.clone());
            tokio::spawn(async move {
                for _ in 0..5 {
                    let guard = rt
                        .lock(key)
                        .lease(LEASE)
                        .wait(Duration::from_secs(60))
                        .acquire()
                        .await
                        .expect("acquire");
                    // Recorded in critical-section order.
                    seen.lock()
                        .expect("not poisoned")
                        .push(guard.fence().expect("fence"));
                    tokio::task::yield_now().await;
                    guard.release().await.expect("release");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    let fences = seen.lock().expect("not poisoned").clone();
    assert_eq!(fences.len(), 50);
    assert_strictly_increasing(&fences);
}

async fn fence_survives_reentrancy(b: Backend) {
    let key = "fencing:reentrant";
    let first = b.rt.lock(key).lease(LEASE).acquire().await.expect("first");
    let f1 = first.fence().expect("fence");
    first.release().await.expect("release");
    let f2 = with_lock(b.rt.lock(key).lease(LEASE), async {
        let outer = current_fence().expect("fence inside with_lock");
        let inner = b.rt.lock(key).acquire().await.expect("re-enters");
        assert_eq!(
            inner.fence(),
            Some(outer),
            "a reentrant hold keeps the outer fence"
        );
        let nested = with_lock(b.rt.lock(key), async { current_fence() })
            .await
            .expect("nested");
        assert_eq!(nested, Some(outer));
        outer
    })
    .await
    .expect("with_lock");
    assert!(f2 > f1);
    let third = b.rt.lock(key).lease(LEASE).acquire().await.expect("third");
    let f3 = third.fence().expect("fence");
    assert!(
        f3 > f2,
        "the next fresh holder ({f3}) must exceed the reentrant one ({f2})"
    );
}

/// Acquires `key`, retrying errors for up to 10 s (the runtime may need to reconnect).
async fn acquire_fence_eventually(rt: &Runtime, key: &str) -> u64 {
    let start = Instant::now();
    loop {
        match rt.lock(key).lease(LEASE).acquire().await {
            Ok(guard) => {
                let fence = guard.fence().expect("fence");
                guard.release().await.expect("release");
                return fence;
            }
            Err(e) if start.elapsed() < Duration::from_secs(10) => {
                println!("acquire after restart: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("acquire still failing 10 s after the restart: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_after_empty_server_restart_exceeds_all_earlier() {
    let mut server = RedisServer::start();
    let rt = Runtime::from_url(&server.url()).await.expect("runtime");
    let key = "fencing:restart";
    let mut earlier = Vec::new();
    for _ in 0..5 {
        earlier.push(acquire_fence_eventually(&rt, key).await);
    }
    assert!(
        server.exists(&fence_key(key)).await,
        "the fence counter lives at {}",
        fence_key(key)
    );
    server.restart();
    assert!(
        !server.exists(&fence_key(key)).await,
        "the restarted server is empty"
    );
    let next = acquire_fence_eventually(&rt, key).await;
    let max = earlier.iter().copied().max().expect("five fences");
    assert!(
        next > max,
        "fence {next} after restart must exceed every earlier one (max {max})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_after_counter_key_loss_exceeds_all_earlier() {
    let server = RedisServer::start();
    let rt = Runtime::from_url(&server.url()).await.expect("runtime");
    let key = "fencing:counter-lost";
    let mut earlier = Vec::new();
    for _ in 0..5 {
        earlier.push(acquire_fence_eventually(&rt, key).await);
    }
    assert!(
        server.del(&fence_key(key)).await,
        "the fence counter exists"
    );
    let next = acquire_fence_eventually(&rt, key).await;
    let max = earlier.iter().copied().max().expect("five fences");
    assert!(
        next > max,
        "fence {next} after losing the counter must exceed {max}"
    );
}
