//! The Lua scripts themselves, run against a real redis-server: the lock hash (acquire is
//! idempotent per owner: the runtime re-enters within a call chain locally), owner checks, the
//! busy answer, the fence floor, and the release notification.

use dlock_tests::{RedisServer, fence_key, lock_key, released_channel};
use redis::Script;

use dlock_runtime::testing::scripts::{ACQUIRE, RELEASE, RENEW};

const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

async fn acquire(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    owner: &str,
    lease_ms: u64,
) -> i64 {
    Script::new(ACQUIRE)
        .key(lock_key(key))
        .key(fence_key(key))
        .arg(owner)
        .arg(lease_ms)
        .arg(600_000 + lease_ms)
        .invoke_async(conn)
        .await
        .unwrap()
}

async fn release(conn: &mut redis::aio::MultiplexedConnection, key: &str, owner: &str) -> i64 {
    Script::new(RELEASE)
        .key(lock_key(key))
        .arg(owner)
        .arg(released_channel(key))
        .arg("test")
        .arg("PUBLISH")
        .invoke_async(conn)
        .await
        .unwrap()
}

/// Regression (issue "reliability", idempotent acquire): the runtime re-enters within a call
/// chain locally, so a second acquire with the same owner token is a retry of the first (a
/// reconnect resending the script). It keeps the fence and the single hold: one release frees
/// the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_is_idempotent_per_owner_and_keeps_the_fence() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let fence = acquire(&mut conn, "re", A, 30_000).await;
    assert!(
        fence > 0,
        "fresh acquire returns a positive fence, got {fence}"
    );
    assert_eq!(
        acquire(&mut conn, "re", A, 30_000).await,
        fence,
        "a retried acquire keeps the fence"
    );
    let count: u64 = server
        .query(redis::cmd("HGET").arg(lock_key("re")).arg("count"))
        .await;
    assert_eq!(count, 1, "a retried acquire adds no hold");
    assert_eq!(release(&mut conn, "re", A).await, 1, "one release frees");
    assert!(!server.exists(&lock_key("re")).await);
    let next = acquire(&mut conn, "re", B, 30_000).await;
    assert!(
        next > fence,
        "next holder's fence {next} must exceed {fence}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_owner_is_busy_with_remaining_ttl_and_cannot_release_or_renew() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    assert!(acquire(&mut conn, "busy", A, 30_000).await > 0);
    let busy = acquire(&mut conn, "busy", B, 30_000).await;
    let ttl_ms = -2 - busy;
    assert!(
        (25_000..=30_000).contains(&ttl_ms),
        "busy answer encodes the holder's pttl, got {busy}"
    );
    assert_eq!(release(&mut conn, "busy", B).await, 0, "not the owner");
    let renewed: Vec<i64> = Script::new(RENEW)
        .key(lock_key("busy"))
        .key(fence_key("busy"))
        .key(lock_key("busy"))
        .key(fence_key("busy"))
        .arg(600_000)
        .arg(B)
        .arg(30_000)
        .arg(A)
        .arg(60_000)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(renewed, vec![0, 1], "renew is owner-checked per item");
    assert!(server.pttl(&lock_key("busy")).await > 30_000);
    // A key someone persisted: busy with no TTL.
    let _: () = server
        .query(redis::cmd("PERSIST").arg(lock_key("busy")))
        .await;
    assert_eq!(acquire(&mut conn, "busy", B, 30_000).await, -1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_counter_is_floored_at_server_time_when_missing() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let time: Vec<u64> = server.query(&redis::cmd("TIME")).await;
    let now_us = time[0] * 1_000_000 + time[1];
    let first = acquire(&mut conn, "floor", A, 30_000).await as u64;
    assert!(
        first >= now_us,
        "fence {first} floored at server time {now_us}"
    );
    assert_eq!(release(&mut conn, "floor", A).await, 1);
    let second = acquire(&mut conn, "floor", B, 30_000).await as u64;
    assert_eq!(second, first + 1, "an existing counter grows by one");
    assert_eq!(release(&mut conn, "floor", B).await, 1);
    // The counter key lost (expired, or a restart with no data): floored again, still above.
    assert!(server.del(&fence_key("floor")).await);
    let third = acquire(&mut conn, "floor", A, 30_000).await as u64;
    assert!(
        third > second,
        "{third} must exceed {second} after the counter was lost"
    );
    let ttl = server.pttl(&fence_key("floor")).await;
    assert!(ttl > 600_000, "the counter carries a TTL ({ttl} ms)");
}

/// The counter only grows while it exists, whatever the clock says: one above the server clock
/// (tokens handed out before the clock was stepped back) is bumped, not lowered; and each
/// acquisition and renewal pushes its expiry beyond the lock's (lease plus the margin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_counter_above_the_clock_is_never_lowered_and_outlives_the_lock() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let time: Vec<u64> = server.query(&redis::cmd("TIME")).await;
    let ahead = time[0] * 1_000_000 + time[1] + 86_400_000_000;
    let () = server
        .query(
            redis::cmd("SET")
                .arg(fence_key("up"))
                .arg(ahead)
                .arg("PX")
                .arg(50),
        )
        .await;
    let fence = acquire(&mut conn, "up", A, 30_000).await as u64;
    assert_eq!(fence, ahead + 1, "bumped, not floored at the clock");
    assert!(server.pttl(&fence_key("up")).await > 600_000);
    let () = server
        .query(redis::cmd("PEXPIRE").arg(fence_key("up")).arg(50))
        .await;
    let renewed: Vec<i64> = Script::new(RENEW)
        .key(lock_key("up"))
        .key(fence_key("up"))
        .arg(600_000)
        .arg(A)
        .arg(30_000)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(renewed, vec![1]);
    let ttl = server.pttl(&fence_key("up")).await;
    assert!(
        ttl > 600_000,
        "the renewal pushed the counter's expiry: {ttl} ms"
    );
    assert_eq!(release(&mut conn, "up", A).await, 1);
    let next = acquire(&mut conn, "up", B, 30_000).await as u64;
    assert_eq!(next, ahead + 2, "still above the clock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_release_publishes_on_the_keys_channel() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let mut pubsub = server.client().get_async_pubsub().await.unwrap();
    pubsub.subscribe(released_channel("pub")).await.unwrap();
    assert!(acquire(&mut conn, "pub", A, 30_000).await > 0);
    assert_eq!(release(&mut conn, "pub", A).await, 1);
    assert_eq!(
        release(&mut conn, "pub", A).await,
        0,
        "a second release is not the owner's"
    );
    use futures_util::StreamExt;
    let mut messages = pubsub.on_message();
    let msg = tokio::time::timeout(std::time::Duration::from_secs(2), messages.next())
        .await
        .expect("a message within 2 s")
        .expect("stream open");
    assert_eq!(msg.get_channel_name(), released_channel("pub"));
    let payload: String = msg.get_payload().unwrap();
    assert_eq!(payload, "test");
    // Exactly one message: the release that found nothing of ours published nothing.
    let more = tokio::time::timeout(std::time::Duration::from_millis(200), messages.next()).await;
    assert!(more.is_err(), "only the freeing release publishes");
}
