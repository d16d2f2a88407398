//! Mutual exclusion on Redis: non-atomic increments of a counter kept in Redis end exact (tasks
//! and OS processes), and `wait` zero is one attempt (one script).
//!
//! Exclusion among many contenders on several runtimes, and bounded waits, on every engine, are
//! in the conformance suite (`tests/conformance/exclusion.rs`, `waiting.rs`).

use std::time::{Duration, Instant};

use dlock_tests::{
    AcquireExt, Backend, Counting, HoldExt, RedisServer, count_in_processes, finish_within,
    on_both_backends, redis_with_runtime,
};

const LEASE: Duration = Duration::from_secs(30);
const TASKS: u64 = 50;
const INCREMENTS: u64 = 10;

on_both_backends!(wait_zero_is_one_attempt);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_increment_counter_in_redis_exactly() {
    let (server, rt) = redis_with_runtime().await;
    let key = "exclusion:redis-counter";
    let counter_key = "counter:redis-counter";
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let rt = rt.clone();
            let client = server.client();
            tokio::spawn(async move {
                let mut conn = client
                    .get_multiplexed_async_connection()
                    .await
                    .expect("connect");
                for _ in 0..INCREMENTS {
                    let guard = rt.hold_within(key, LEASE, Duration::from_secs(60)).await;
                    let value: Option<u64> = redis::cmd("GET")
                        .arg(counter_key)
                        .query_async(&mut conn)
                        .await
                        .expect("GET");
                    tokio::task::yield_now().await;
                    let () = redis::cmd("SET")
                        .arg(counter_key)
                        .arg(value.unwrap_or(0) + 1)
                        .query_async(&mut conn)
                        .await
                        .expect("SET");
                    guard.release().await.expect("release");
                }
            })
        })
        .collect();
    finish_within(tasks, Duration::from_secs(120)).await;
    let total: u64 = server.query(redis::cmd("GET").arg(counter_key)).await;
    assert_eq!(total, TASKS * INCREMENTS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_increment_counter_in_redis_exactly() {
    const RUNS: (u64, u64) = (4, 50);
    let server = RedisServer::start();
    let (url, key) = (server.url(), "exclusion:processes");
    let total = count_in_processes(Counting::Guard, &url, &server, key, RUNS).await;
    assert_eq!(total, RUNS.0 * RUNS.1);
}

async fn wait_zero_is_one_attempt(b: Backend) {
    let key = "exclusion:wait-zero";
    let _holder = b.rt.lock(key).lease(LEASE).held("holder").await;
    let attempts_before = match &b.server {
        Some(server) => server.set_calls().await,
        None => 0,
    };
    let start = Instant::now();
    let err =
        b.rt.lock(key)
            .lease(LEASE)
            .wait(Duration::ZERO)
            .acquire()
            .await
            .expect_err("the key is held");
    let took = start.elapsed();
    assert!(err.is_timeout(), "expected Timeout, got {err:?}");
    assert!(
        took < Duration::from_millis(250),
        "wait = 0 took {took:?}: one attempt should return at once"
    );
    if let Some(server) = &b.server {
        let attempts = server.set_calls().await - attempts_before;
        assert_eq!(
            attempts, 1,
            "wait = 0 made {attempts} attempts, expected one"
        );
    }
}
