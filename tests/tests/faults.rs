//! Real faults and bad input: SCRIPT FLUSH, restart, kill -9 and SIGSTOP of the server give
//! working locks again or a bounded `Backend` error (never a hang, never the body unlocked);
//! bad configuration gives `InvalidConfig`. On one Redis, a Redis Cluster and Redlock, which
//! keep no data across a restart: an engine restarted empty under a live holder while tasks
//! wait lets them acquire afterwards, and the holder learns its lock is gone; a full Redis
//! (`maxmemory`, `noeviction`) gives `Backend`, never an unlocked body. (An engine killed while
//! a lock is held, on every engine: conformance
//! `engine_down_while_held_is_lost_and_waiters_acquire_after_restart`.)

use std::error::Error as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dlock_runtime::LockError;
use dlock_tests::cluster::RedisCluster;
use dlock_tests::{
    AcquireExt, BuildExt, HoldExt, RedisServer, Runtime, assert_between, finish_within, lock_key,
    redis_with_runtime, redis_with_timeout, redlock_hosts,
};

const LEASE: Duration = Duration::from_secs(30);
/// Runtime timeout in the fault tests, and the bound they allow for a `Backend` error.
const TIMEOUT: Duration = Duration::from_secs(1);
const BACKEND_ERROR_WITHIN: Duration = Duration::from_secs(10);

/// A fresh redis-server and a runtime on it with [`TIMEOUT`] that has just taken and released
/// `key` (everything works before the fault).
async fn working_before_the_fault(key: &str) -> (RedisServer, Runtime) {
    let (server, rt) = redis_with_timeout(TIMEOUT).await;
    rt.lock(key).cycled("before the fault").await;
    (server, rt)
}

/// `Backend` errors keep the engine error as `source()`.
#[track_caller]
fn assert_has_source(err: &LockError) {
    assert!(
        err.source().is_some(),
        "Backend error without source(): {err:?}"
    );
}

/// Checks an error is `Backend` and names the key.
#[track_caller]
fn assert_backend_error(err: &LockError, key: &str) {
    assert!(err.is_backend(), "expected Backend, got {err:?}");
    assert!(matches!(err, LockError::Backend(..)));
    let message = err.to_string();
    assert!(
        message.contains(key),
        "message should name the key {key:?}: {message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_while_running_keeps_locks_working() {
    let (server, rt) = redis_with_runtime().await;
    let key = "faults:flush";
    // A hold that spans the flush: its renewals and its release need the scripts again.
    let held = rt.hold(key, Duration::from_secs(1)).await;
    let () = server.query(redis::cmd("SCRIPT").arg("FLUSH")).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!held.is_lost(), "renewal after SCRIPT FLUSH failed");
    assert!(
        server.exists(&lock_key(key)).await,
        "the 1 s lease was not renewed"
    );
    held.release().await.expect("release after SCRIPT FLUSH");
    assert!(
        !server.exists(&lock_key(key)).await,
        "release after SCRIPT FLUSH left the key"
    );

    let () = server.query(redis::cmd("SCRIPT").arg("FLUSH")).await;
    let guard = rt
        .lock(key)
        .wait(Duration::ZERO)
        .held("acquire after SCRIPT FLUSH")
        .await;
    assert!(server.exists(&lock_key(key)).await);
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_while_idle_next_acquire_works() {
    let key = "faults:restart";
    let (mut server, rt) = working_before_the_fault(key).await;
    server.restart();
    let restarted = Instant::now();
    loop {
        match rt.lock(key).lease(LEASE).acquire().await {
            Ok(guard) => {
                assert!(
                    server.exists(&lock_key(key)).await,
                    "held on the new server"
                );
                guard.release().await.expect("release");
                break;
            }
            Err(e) => {
                assert!(
                    restarted.elapsed() < Duration::from_secs(5),
                    "still failing 5 s after the restart: {e}"
                );
                println!("after restart: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    println!("working again {:?} after the restart", restarted.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_gives_backend_error_within_bounded_time() {
    let key = "faults:killed";
    let (mut server, rt) = working_before_the_fault(key).await;
    server.kill9();
    let start = Instant::now();
    let err = tokio::time::timeout(BACKEND_ERROR_WITHIN, rt.lock(key).acquire())
        .await
        .expect("acquire against a dead server must not hang")
        .map(|_guard| ())
        .expect_err("no server, no lock");
    println!("acquire failed after {:?}: {err}", start.elapsed());
    assert_backend_error(&err, key);
    assert_has_source(&err);

    let lock = rt.lock(key).wait(Duration::from_secs(2));
    let (err, _) = lock.body_refused(BACKEND_ERROR_WITHIN, "dead server").await;
    assert_backend_error(&err, key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_paused_gives_backend_error_within_bounded_time() {
    let key = "faults:paused";
    let (mut server, rt) = working_before_the_fault(key).await;
    server.pause();
    let lock = rt.lock(key);
    let (err, _) = lock
        .body_refused(BACKEND_ERROR_WITHIN, "frozen server")
        .await;
    server.resume();
    assert_backend_error(&err, key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_error_from_an_unanswered_request_keeps_a_source() {
    let (mut server, rt) = redis_with_timeout(Duration::from_millis(300)).await;
    let key = "faults:timeout-source";
    rt.lock(key).cycled("before").await;
    server.pause();
    let mut errors = Vec::new();
    for _ in 0..5 {
        let out = tokio::time::timeout(BACKEND_ERROR_WITHIN, rt.lock(key).acquire()).await;
        errors.push(
            out.expect("must not hang")
                .map(|_guard| ())
                .expect_err("no answer, no lock"),
        );
    }
    server.resume();
    for err in &errors {
        assert_backend_error(err, key);
        assert_has_source(err);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_listening_gives_backend_error_within_bounded_time() {
    // A port that was free a moment ago; nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let key = "faults:nobody";
    let start = Instant::now();
    let built = tokio::time::timeout(
        BACKEND_ERROR_WITHIN,
        Runtime::builder()
            .redis(format!("redis://127.0.0.1:{port}"))
            .timeout(TIMEOUT)
            .build(),
    )
    .await
    .expect("build must not hang");
    match built {
        // Connecting eagerly: the error is Backend.
        Err(err) => assert!(err.is_backend(), "expected Backend, got {err:?}"),
        // Connecting lazily: the first acquisition fails with Backend.
        Ok(rt) => {
            let err = tokio::time::timeout(BACKEND_ERROR_WITHIN, rt.lock(key).acquire())
                .await
                .expect("acquire must not hang")
                .map(|_guard| ())
                .expect_err("no server, no lock");
            assert_backend_error(&err, key);
        }
    }
    assert!(start.elapsed() < BACKEND_ERROR_WITHIN);
}

async fn from_url_error(url: &str) -> LockError {
    let start = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(5), Runtime::from_url(url))
        .await
        .unwrap_or_else(|_| panic!("from_url({url:?}) hangs"));
    assert_between(
        &format!("from_url({url:?})"),
        start.elapsed(),
        Duration::ZERO,
        Duration::from_secs(2),
    );
    match out {
        Ok(_) => panic!("from_url({url:?}) accepted a bad URL"),
        Err(err) => err,
    }
}

/// URLs of no engine, and a builder with no engine, are `InvalidConfig` with a lowercase
/// message, at once. (Each engine's bad URLs and builders: conformance
/// `bad_configuration_is_invalid_config`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_engine_is_invalid_config() {
    for url in ["http://x", "http://127.0.0.1:2379", "garbage", "", "://"] {
        let err = from_url_error(url).await;
        assert!(
            matches!(err, LockError::InvalidConfig(..)) && err.is_invalid_config(),
            "from_url({url:?}): expected InvalidConfig, got {err:?}"
        );
        let message = err.to_string();
        assert!(!message.is_empty());
        assert!(
            !message.starts_with(|c: char| c.is_uppercase()),
            "messages are lowercase: {message}"
        );
    }
    let err = tokio::time::timeout(Duration::from_secs(5), Runtime::builder().build())
        .await
        .expect("build must not hang")
        .map(|_rt| ())
        .expect_err("a builder with no engine configured must not build");
    assert!(
        err.is_invalid_config(),
        "expected InvalidConfig, got {err:?}"
    );
}

/// Holds `key` on `holder` (6 s lease) while `WAITERS` tasks of `waiters` wait for it (30 s),
/// restarts the engine with `restart` (empty, as without persistence), and asserts every
/// waiter then gets the key, one at a time, within 15 s; and the holder learns its lock is
/// gone (`lost()`) within a renewal interval plus slack.
async fn waiters_acquire_after_a_restart(
    holder: &Runtime,
    waiters: &Runtime,
    key: &str,
    restart: impl FnOnce(),
) {
    const WAITERS: usize = 3;
    let lease = Duration::from_secs(6);
    let held = holder.lock(key).lease(lease).held("the holder").await;
    let inside = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..WAITERS)
        .map(|i| {
            let (lock, inside) = (
                waiters.lock(key).lease(LEASE).wait(Duration::from_secs(30)),
                inside.clone(),
            );
            tokio::spawn(async move {
                let guard = lock
                    .acquire()
                    .await
                    .unwrap_or_else(|e| panic!("waiter {i}: {e}"));
                let came = Instant::now();
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two waiters inside"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard
                    .release()
                    .await
                    .unwrap_or_else(|e| panic!("waiter {i}: {e}"));
                came
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        tasks.iter().all(|t| !t.is_finished()),
        "a waiter got a held key"
    );
    restart();
    let restarted = Instant::now();
    let came = finish_within(tasks, Duration::from_secs(15)).await;
    let last = came
        .iter()
        .max()
        .expect("waiters")
        .duration_since(restarted);
    println!(
        "{key}: {WAITERS} waiters held the key one by one, the last {last:?} after the restart"
    );
    tokio::time::timeout(lease / 3 + Duration::from_secs(3), held.lost())
        .await
        .expect("the holder learns that the restart took its lock");
}

/// Waiters on a Redis restarted empty while they wait get the key afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_while_tasks_wait_lets_them_acquire_afterwards() {
    let (mut server, holder) = redis_with_timeout(TIMEOUT).await;
    let waiters = Runtime::builder()
        .redis(server.url())
        .timeout(TIMEOUT)
        .built()
        .await;
    waiters_acquire_after_a_restart(&holder, &waiters, "faults:restart-waiting", || {
        server.restart()
    })
    .await;
}

/// Waiters for a key whose Cluster master restarts (empty, before any failover) get the key
/// once the node has rejoined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_master_restarted_while_tasks_wait_lets_them_acquire_afterwards() {
    let mut cluster = RedisCluster::start();
    let master = cluster.master_for_slot(0).await;
    let key = cluster.key_on_master("faults:restart", master).await;
    let built = || {
        Runtime::builder()
            .redis_cluster(cluster.seeds())
            .timeout(TIMEOUT)
            .built()
    };
    let (holder, waiters) = (built().await, built().await);
    waiters_acquire_after_a_restart(&holder, &waiters, &key, || {
        cluster.kill9(master);
        cluster.restart(master);
    })
    .await;
}

/// Waiters on Redlock whose every node restarts empty while they wait get the key afterwards
/// (once the restart check lets the restarted nodes count again: `rejoin_after`, 2 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_restarted_while_tasks_wait_lets_them_acquire_afterwards() {
    let mut nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let url = format!(
        "redlock://{}?node_timeout=500ms&timeout=1s&rejoin_after=2s",
        redlock_hosts(&nodes)
    );
    let holder = Runtime::from_url(&url).await.expect("a redlock runtime");
    let waiters = Runtime::from_url(&url).await.expect("a redlock runtime");
    waiters_acquire_after_a_restart(&holder, &waiters, "faults:redlock-restart", || {
        for node in &mut nodes {
            node.restart();
        }
    })
    .await;
}

/// A Redis out of memory (`maxmemory` reached, `noeviction`): acquiring is `Backend` naming the
/// key, and `with_lock` never runs its body; a lock held before keeps being renewed and is
/// released; once memory is available again, locking works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_redis_gives_backend_and_never_runs_the_body() {
    let (server, rt) = redis_with_timeout(TIMEOUT).await;
    let (held_key, key) = ("faults:held-before-full", "faults:full");
    let held = rt.hold(held_key, Duration::from_secs(1)).await;
    let () = server
        .query(
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory-policy")
                .arg("noeviction"),
        )
        .await;
    let () = server
        .query(redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(1))
        .await;
    let err = rt
        .lock(key)
        .acquire()
        .await
        .map(drop)
        .expect_err("no memory, no lock");
    println!("acquire on a full redis: {err}");
    assert_backend_error(&err, key);
    assert_has_source(&err);
    let lock = rt.lock(key).wait(Duration::from_secs(1));
    let (err, _) = lock.body_refused(BACKEND_ERROR_WITHIN, "full redis").await;
    assert_backend_error(&err, key);
    assert!(!server.exists(&lock_key(key)).await, "no lock hash written");
    // Renewals write no new data: the lock held before stays held past its 1 s lease.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!held.is_lost(), "a held lock survives a full server");
    held.release().await.expect("release on a full server");
    assert!(!server.exists(&lock_key(held_key)).await);
    let () = server
        .query(redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(0))
        .await;
    rt.lock(key).cycled("memory available again").await;
}
