//! Fencing tokens on Redis that never go backwards, even when Redis restarts empty or the counter
//! key is lost (the counter is floored at server TIME).
//!
//! Tokens strictly increasing across holders and kept by reentrant acquisitions, on every engine,
//! are in the conformance suite (`tests/conformance/fencing.rs`).

use std::time::{Duration, Instant};

use dlock_tests::{AcquireExt, Runtime, fence_key, redis_with_runtime};

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

/// Regression (issue "reliability", fence counter TTL): the counter got its TTL once, when it
/// was created, and expired even while its key stayed busy; the next token was then floored at
/// the server clock, which is lower than earlier tokens once the clock has been stepped back.
/// Now every acquisition and renewal keeps the counter alive beyond the lock. Simulated here:
/// tokens handed out while the clock read a day ahead (the counter above the clock now), and a
/// counter whose TTL runs out while a holder renews.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_counter_outlives_a_busy_key_so_tokens_never_go_down() {
    let (server, rt) = redis_with_runtime().await;
    let key = "fencing:busy";
    let time: Vec<u64> = server.query(&redis::cmd("TIME")).await;
    let ahead = time[0] * 1_000_000 + time[1] + 86_400_000_000;
    let () = server
        .query(
            redis::cmd("SET")
                .arg(fence_key(key))
                .arg(ahead)
                .arg("PX")
                .arg(600_000),
        )
        .await;
    let lease = Duration::from_secs(1);
    let guard = rt.lock(key).lease(lease).held("acquire").await;
    let held = guard.fence().expect("fence");
    assert_eq!(
        held,
        ahead + 1,
        "a counter above the clock is never lowered"
    );
    // The counter's TTL runs out 0.5 s from now, while the key stays busy for 2.5 s.
    let set: i64 = server
        .query(redis::cmd("PEXPIRE").arg(fence_key(key)).arg(500))
        .await;
    assert_eq!(set, 1);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!guard.is_lost(), "renewed all along");
    let ttl = server.pttl(&fence_key(key)).await;
    assert!(
        u128::try_from(ttl).is_ok_and(|ms| ms > lease.as_millis()),
        "the renewals keep the counter alive beyond the lock: PTTL {ttl} ms"
    );
    guard.release().await.expect("release");
    assert_next_fence_exceeds(
        &rt,
        key,
        &[held],
        "a busy key whose counter was due to expire",
    )
    .await;
}
