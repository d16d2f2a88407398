//! Fencing tokens on Redis that never go backwards, even when Redis restarts empty or the counter
//! key is lost (the counter is floored at server TIME).
//!
//! Tokens strictly increasing across holders and kept by reentrant acquisitions, on every engine,
//! are in the conformance suite (`tests/conformance/fencing.rs`).

use std::time::{Duration, Instant};

use dlock_tests::{Runtime, fence_key, redis_with_runtime};

const LEASE: Duration = Duration::from_secs(30);

/// Acquires `key`, retrying errors for up to 10 s (the runtime may need to reconnect).
/// The next holder's fence exceeds every one in `earlier` (what happened in between: `after`).
async fn assert_next_fence_exceeds(rt: &Runtime, key: &str, earlier: &[u64], after: &str) {
    let next = acquire_fence_eventually(rt, key).await;
    let max = earlier.iter().copied().max().expect("earlier fences");
    assert!(
        next > max,
        "fence {next} after {after} must exceed every earlier one (max {max})"
    );
}

/// The fences of `n` successive holders of `key` (each acquired, then released).
async fn fences_of_successive_holders(rt: &Runtime, key: &str, n: usize) -> Vec<u64> {
    let mut fences = Vec::with_capacity(n);
    for _ in 0..n {
        fences.push(acquire_fence_eventually(rt, key).await);
    }
    fences
}

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
    let (mut server, rt) = redis_with_runtime().await;
    let key = "fencing:restart";
    let earlier = fences_of_successive_holders(&rt, key, 5).await;
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
    assert_next_fence_exceeds(&rt, key, &earlier, "restart").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_after_counter_key_loss_exceeds_all_earlier() {
    let (server, rt) = redis_with_runtime().await;
    let key = "fencing:counter-lost";
    let earlier = fences_of_successive_holders(&rt, key, 5).await;
    assert!(
        server.del(&fence_key(key)).await,
        "the fence counter exists"
    );
    assert_next_fence_exceeds(&rt, key, &earlier, "losing the counter").await;
}
