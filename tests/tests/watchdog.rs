//! Lease renewal and loss on one Redis, under real faults and the Redis layout: the renewed lock
//! hash's TTL is the lease, a dead or frozen holder process frees the key after about one lease,
//! an overwritten owner is a loss that the old holder's release leaves alone, and an unreachable
//! server is a loss only once the lease has run out.
//!
//! The behaviours every engine shares (renewal keeping a short lease, the `watchdog(false)` hard
//! cap, loss of a deleted key) are in the conformance suite (`tests/conformance/lease.rs`).

use std::time::{Duration, Instant};

use dlock_tests::{
    AcquireExt, BuildExt, HoldExt, RedisServer, Runtime, assert_between, assert_watchdog_renews_on,
    hold_fenced_in_process, lock_key, redis_with_runtime, redis_with_timeout,
};

/// The lock hash's TTL is the lease: renewed every third of a 1 s lease for five seconds, it
/// never has more than 1 s left and never runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_lock_hash_ttl_stays_within_the_lease() {
    let (server, rt) = redis_with_runtime().await;
    let period = Duration::from_secs(5);
    assert_watchdog_renews_on(&server, (&rt, None), "watchdog:renewed", period).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_process_frees_key_after_about_one_lease() {
    let server = RedisServer::start();
    let key = "watchdog:killed-holder";
    let (mut holder, holder_fence) = hold_fenced_in_process(&server.url(), key, 1000).await;
    // Past the 1 s lease: the holder's watchdog keeps it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        server.exists(&lock_key(key)).await,
        "the holder's watchdog did not renew"
    );
    let rt = Runtime::from_url(&server.url()).await.expect("runtime");
    holder.kill9().await;
    let bounds = Duration::from_millis(500)..=Duration::from_millis(3000);
    let what = "acquire after kill -9 of a holder (lease 1 s)";
    let guard = rt.lock(key).held_between(bounds, what).await;
    let fence = guard.fence().expect("fence");
    assert!(
        fence > holder_fence,
        "{fence} must exceed the dead holder's {holder_fence}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_overwritten_is_lost_and_the_new_owner_survives_release() {
    let (server, rt) = redis_with_runtime().await;
    let key = "watchdog:overwritten";
    let hash = lock_key(key);
    let guard = rt.hold(key, Duration::from_secs(6)).await;
    // Someone else now owns the key: the lock (see backend/redis/lua/acquire.lua) holds
    // another token, with a long TTL of its own.
    let () = server
        .query(
            redis::cmd("SET")
                .arg(&hash)
                .arg("intruder-owner-token")
                .arg("PX")
                .arg(60_000),
        )
        .await;
    let overwritten = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("lost() must resolve when the owner is replaced");
    assert_between(
        "lost() after owner overwrite, lease 6 s",
        overwritten.elapsed(),
        Duration::ZERO,
        Duration::from_millis(3500),
    );
    let _ = guard.release().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let owner = server.lock_owner(&hash).await;
    assert_eq!(
        owner.as_deref(),
        Some("intruder-owner-token"),
        "release by the old holder must not touch the new owner's lock"
    );
    assert!(
        server.pttl(&hash).await > 30_000,
        "the new owner's TTL was changed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_paused_past_lease_is_lost_within_lease_plus_timeout() {
    let mut server = RedisServer::start();
    let timeout = Duration::from_millis(500);
    let lease = Duration::from_secs(2);
    let rt = Runtime::builder()
        .redis(server.url())
        .timeout(timeout)
        .built()
        .await;
    let key = "watchdog:paused";
    let guard = rt.lock(key).lease(lease).held("acquire").await;
    server.pause();
    let paused = Instant::now();
    let lost = tokio::time::timeout(Duration::from_secs(15), guard.lost()).await;
    let took = paused.elapsed();
    server.resume();
    lost.expect("lost() must resolve while the server is unreachable past the lease");
    // Not before the confirmed expiry (about one lease after acquiring): one failed renewal
    // alone is not a loss. Not much after lease + timeout either.
    assert_between(
        "lost() with the server paused, lease 2 s, timeout 500 ms",
        took,
        Duration::from_millis(1500),
        lease + timeout + Duration::from_millis(1500),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_outage_shorter_than_lease_is_not_a_loss() {
    let (mut server, rt) = redis_with_timeout(Duration::from_millis(300)).await;
    let key = "watchdog:transient";
    let guard = rt.hold(key, Duration::from_secs(3)).await;
    let acquired = Instant::now();
    // The renewal due at ~1 s runs into the pause and times out.
    server.pause();
    tokio::time::sleep(Duration::from_millis(1400)).await;
    server.resume();
    let other = Runtime::from_url(&server.url()).await.expect("runtime");
    while acquired.elapsed() < Duration::from_secs(7) {
        assert!(!guard.is_lost(), "lost after {:?}", acquired.elapsed());
        assert!(
            server.pttl(&lock_key(key)).await > 0,
            "key expired after {:?}",
            acquired.elapsed()
        );
        other
            .lock(key)
            .wait(Duration::ZERO)
            .times_out("still held")
            .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_process_loses_the_lock_and_learns_it_on_resume() {
    let server = RedisServer::start();
    let key = "watchdog:paused-holder";
    let (mut holder, holder_fence) = hold_fenced_in_process(&server.url(), key, 1000).await;
    let rt = Runtime::from_url(&server.url()).await.expect("runtime");
    holder.pause();
    let bounds = Duration::from_millis(500)..=Duration::from_millis(3000);
    let what = "acquire after SIGSTOP of a holder (lease 1 s)";
    let guard = rt.lock(key).held_between(bounds, what).await;
    assert!(guard.fence().expect("fence") > holder_fence);
    // Thawed, the old holder must find out it lost the lock, not carry on as the owner.
    holder.resume();
    let resumed = Instant::now();
    assert_eq!(holder.next_line(Duration::from_secs(5)).await, "lost");
    println!(
        "the resumed holder reported the loss after {:?}",
        resumed.elapsed()
    );
    let status = holder.wait(Duration::from_secs(5)).await;
    assert_eq!(
        status.code(),
        Some(3),
        "dlock-holder exits 3 on a lost lease"
    );
    assert!(!guard.is_lost(), "the new holder keeps its lock");
    guard.release().await.expect("release");
}

/// Regression (issue "reliability", renewal verdicts): another application overwrites one held
/// lock with a value of another type (a hash). Renewing that key raises WRONGTYPE inside the
/// batch script; the other locks renewed in the same call must keep their leases (one verdict
/// per key), and only the overwritten one is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_value_at_one_key_loses_only_that_lock_of_the_renewal_batch() {
    let (server, rt) = redis_with_runtime().await;
    let lease = Duration::from_secs(1);
    // Taken back to back with one lease: due in the same coalescing window, renewed in one call.
    let keys = ["watchdog:batch-a", "watchdog:batch-b", "watchdog:batch-c"];
    let mut guards = Vec::new();
    for key in keys {
        guards.push(rt.lock(key).lease(lease).held("acquire").await);
    }
    let mut conn = server.conn().await;
    let () = redis::pipe()
        .atomic()
        .cmd("DEL")
        .arg(lock_key(keys[0]))
        .ignore()
        .cmd("HSET")
        .arg(lock_key(keys[0]))
        .arg("app")
        .arg("another app's value")
        .ignore()
        .query_async(&mut conn)
        .await
        .expect("overwrite with a hash");
    tokio::time::timeout(Duration::from_secs(5), guards[0].lost())
        .await
        .expect("the overwritten lock is reported lost");
    // Three more leases: the other two must have been renewed all along.
    tokio::time::sleep(lease * 3).await;
    for (key, guard) in keys.iter().zip(&guards).skip(1) {
        assert!(
            !guard.is_lost(),
            "{key} was lost with the overwritten key's batch"
        );
        assert!(server.exists(&lock_key(key)).await, "{key} expired");
    }
    let mut guards = guards.into_iter();
    let overwritten = guards.next().expect("three guards");
    assert!(
        overwritten.release().await.is_err(),
        "the overwritten lock is not ours"
    );
    for guard in guards {
        guard.release().await.expect("release");
    }
}

/// Two bodies block their threads in their first step (a synchronous call before any await):
/// one with a 30 s lease (renewal interval 10 s), then, once the watchdog has seen it, one with
/// a 1 s lease. The second is renewed all the same: the watchdog, which looked at the first
/// one's hold only every 10 s, is asked to look every third of a second. Another runtime finds
/// its key busy throughout, and both calls return their output.
///
/// The second body is started, and the key checked, from a thread and tokio runtime of their
/// own: a blocked worker may be the one that was serving the test runtime's timers and sockets
/// (tokio leaves them to the worker that parked last), which then wait until another worker
/// parks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_short_lease_blocking_its_first_step_after_a_long_one_is_renewed() {
    let (server, rt) = redis_with_runtime().await;
    let url = server.url();
    let blocking = move |key: &'static str, lease: Duration, block: Duration| {
        dlock_runtime::with_lock(rt.lock(key).lease(lease), async move {
            // No await until it returns.
            std::thread::sleep(block);
            key
        })
    };
    let long = tokio::spawn(blocking(
        "watchdog:first-step-long",
        Duration::from_secs(30),
        Duration::from_secs(7),
    ));
    let key = "watchdog:first-step-short";
    let handle = tokio::runtime::Handle::current();
    let start_short = blocking.clone();
    let check = move || {
        let checker = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the checker's runtime");
        checker.block_on(async {
            let other = Runtime::from_url(&url).await.expect("runtime");
            // The watchdog looks at the first body meanwhile (it asked to as it was published).
            tokio::time::sleep(Duration::from_secs(1)).await;
            let short = handle.spawn(start_short(
                key,
                Duration::from_secs(1),
                Duration::from_secs(5),
            ));
            let started = Instant::now();
            let mut checks = 0;
            // Until about 3 s, well before the body ends (5 s).
            while started.elapsed() < Duration::from_millis(2750) {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let at = started.elapsed();
                let taken = other.lock(key).wait(Duration::ZERO).acquire().await;
                assert!(
                    taken.as_ref().is_err_and(|e| e.is_timeout()),
                    "{at:?} into the 1 s lease's blocking body, another runtime got: {taken:?}"
                );
                checks += 1;
            }
            (short, checks)
        })
    };
    // Blocks this thread (the test's main thread, not a worker) until the checks are done.
    let (short, checks) = std::thread::spawn(check)
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    assert!(checks >= 9, "only {checks} checks");
    assert_eq!(short.await.expect("task").expect("short lease"), key);
    assert_eq!(
        long.await.expect("task").expect("long lease"),
        "watchdog:first-step-long"
    );
}
