//! `dlock_runtime::fenced::FencedRedis` against a real redis-server: which fences a write and a
//! claim accept, what a read returns, the claim-read-write pattern against a stale holder, bad
//! URLs and a store that is down.

use std::time::{Duration, Instant};

use dlock_runtime::fenced::{FencedRedis, FencedValue};
use dlock_tests::{AcquireExt, BuildExt, HoldExt, RedisServer, Runtime};

/// A fresh redis-server and a store on it.
async fn store() -> (RedisServer, FencedRedis) {
    let server = RedisServer::start();
    let store = FencedRedis::connect(&server.url())
        .await
        .unwrap_or_else(|e| panic!("connect to the store: {e}"));
    (server, store)
}

async fn value_of(store: &FencedRedis, resource: &str) -> Option<(String, u64)> {
    store
        .read(resource)
        .await
        .expect("read")
        .map(|FencedValue { value, fence, .. }| (value, fence))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_fence_is_rejected_an_equal_or_higher_one_accepted() {
    let (_server, store) = store().await;
    assert!(store.write("doc", "v20", 20).await.expect("write"));
    assert!(
        !store.write("doc", "v19", 19).await.expect("write"),
        "a lower fence is rejected"
    );
    assert_eq!(value_of(&store, "doc").await, Some(("v20".into(), 20)));
    assert!(
        store.write("doc", "v20 again", 20).await.expect("write"),
        "an equal fence is accepted: one holder writes many times"
    );
    assert!(
        store.write("doc", "v21", 21).await.expect("write"),
        "a higher fence is accepted"
    );
    assert!(
        !store.write("doc", "v20 late", 20).await.expect("write"),
        "the fence it was accepted with is now too low"
    );
    assert_eq!(value_of(&store, "doc").await, Some(("v21".into(), 21)));
    assert!(
        store.write("other", "v1", 1).await.expect("write"),
        "fences are per resource"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_returns_the_value_and_its_fence_and_none_before_any_write() {
    let (server, store) = store().await;
    assert_eq!(store.read("doc").await.expect("read"), None);
    assert!(store.claim("doc", 5).await.expect("claim"));
    assert_eq!(
        store.read("doc").await.expect("read"),
        None,
        "a claim stores no value"
    );
    assert!(store.write("doc", "hello", 7).await.expect("write"));
    let read = store.read("doc").await.expect("read").expect("a value");
    assert_eq!((read.value.as_str(), read.fence), ("hello", 7));
    let fields: Vec<String> = server.query(redis::cmd("HGETALL").arg("fenced:doc")).await;
    assert_eq!(
        fields,
        ["seen", "7", "value", "hello", "fence", "7"],
        "one hash per resource under the default prefix"
    );
}

/// The lost update the claim prevents: stale holder A and new holder B interleave as A reads,
/// B reads, A writes, B writes. Every write alone would pass the fence check (A writes before
/// B's higher fence was seen); B's claim before its read shuts A out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_before_the_read_blocks_the_stale_holders_write() {
    let (_server, store) = store().await;
    let (a, b) = (10, 11);
    assert!(store.write("counter", "5", a).await.expect("write"));
    assert!(store.claim("counter", a).await.expect("A claims"));
    let read_by_a = value_of(&store, "counter").await.expect("a value").0;
    assert!(store.claim("counter", b).await.expect("B claims"));
    let read_by_b = value_of(&store, "counter").await.expect("a value").0;
    assert_eq!((read_by_a.as_str(), read_by_b.as_str()), ("5", "5"));
    assert!(
        !store.write("counter", "6", a).await.expect("A writes"),
        "A's write after B's claim must be rejected"
    );
    assert!(store.write("counter", "6", b).await.expect("B writes"));
    assert!(
        !store.claim("counter", a).await.expect("A claims again"),
        "a claim with a lower fence is rejected"
    );
    assert!(store.claim("counter", b).await.expect("B claims again"));
    assert_eq!(value_of(&store, "counter").await, Some(("6".into(), b)));
}

/// Lua numbers are doubles: 2^53 and 2^53 + 1 compare equal as numbers. The scripts compare
/// fences exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_above_2_pow_53_and_up_to_u64_max_compare_exactly() {
    let (_server, store) = store().await;
    let big = 1u64 << 53;
    assert!(store.write("doc", "big+1", big + 1).await.expect("write"));
    assert!(!store.write("doc", "big", big).await.expect("write"));
    assert!(!store.claim("doc", big).await.expect("claim"));
    assert!(!store.write("doc", "small", 99).await.expect("write"));
    assert!(store.write("doc", "max", u64::MAX).await.expect("write"));
    assert!(
        !store
            .write("doc", "max-1", u64::MAX - 1)
            .await
            .expect("write")
    );
    assert_eq!(
        value_of(&store, "doc").await,
        Some(("max".into(), u64::MAX))
    );
}

/// The whole pattern with a real lock: holder A's lease runs out (no watchdog) while it is
/// "paused"; B takes the lock with a higher fence and claims it; A's late write is rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_lease_ran_out_cannot_write_after_the_next_holder_claimed() {
    let lock_server = RedisServer::start();
    let (_store_server, store) = store().await;
    let rt = Runtime::builder().redis(lock_server.url()).built().await;
    let lease = Duration::from_millis(300);
    let a = rt.hold_capped("stock", lease).await;
    let fence_a = a.fence().expect("redis gives fences");
    assert!(store.claim("stock", fence_a).await.expect("A claims"));
    let b = rt
        .lock("stock")
        .lease(Duration::from_secs(30))
        .wait(Duration::from_secs(5))
        .held("holder B after A's lease ran out")
        .await;
    let fence_b = b.fence().expect("redis gives fences");
    assert!(fence_b > fence_a, "{fence_b} > {fence_a}");
    assert!(store.claim("stock", fence_b).await.expect("B claims"));
    assert!(
        !store
            .write("stock", "from A", fence_a)
            .await
            .expect("A writes"),
        "the stale holder's write is rejected"
    );
    assert!(
        store
            .write("stock", "from B", fence_b)
            .await
            .expect("B writes")
    );
    assert_eq!(
        value_of(&store, "stock").await,
        Some(("from B".into(), fence_b))
    );
    b.release().await.expect("release B");
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prefix_option_places_the_keys() {
    let server = RedisServer::start();
    let store = FencedRedis::connect(&format!("{}/0?prefix=shop:&timeout=2s", server.url()))
        .await
        .expect("connect");
    assert_eq!(store.prefix(), "shop:");
    assert!(store.write("doc", "v", 1).await.expect("write"));
    assert!(server.exists("shop:doc").await);
    assert!(!server.exists("fenced:doc").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_url_is_invalid_config_without_the_password() {
    for url in [
        "redis://:s3cret@127.0.0.1:1?lease=1s",
        "redis://:s3cret@127.0.0.1:1?timeout=never",
        "redis+cluster://:s3cret@127.0.0.1:1,127.0.0.1:2",
        "memory://",
        "127.0.0.1:1",
    ] {
        let err = FencedRedis::connect(url).await.expect_err(url);
        assert!(err.is_invalid_config(), "{url}: {err:?}");
        let text = format!("{err} {err:?}");
        assert!(!text.contains("s3cret"), "{url}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_is_down_is_backend_within_the_timeout() {
    let mut server = RedisServer::start();
    let port = server.port();
    server.kill9();
    let url = format!("redis://:s3cret@127.0.0.1:{port}?timeout=500ms");
    let start = Instant::now();
    let err = FencedRedis::connect(&url)
        .await
        .expect_err("nothing listens");
    let took = start.elapsed();
    assert!(err.is_backend(), "{err:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let text = format!("{err} {err:?}");
    assert!(!text.contains("s3cret"), "{text}");
    assert!(text.contains(":***@"), "names the store, redacted: {text}");

    // Connected, then the server goes away: each call is Backend naming the resource.
    let (mut server, store) = store().await;
    assert!(!format!("{store:?}").contains("s3cret"));
    server.pause();
    let start = Instant::now();
    let err = store
        .write("doc", "v", 1)
        .await
        .expect_err("a frozen server does not answer");
    assert!(err.is_backend(), "{err:?}");
    assert_eq!(err.key(), Some("doc"));
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    server.resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_appear_neither_in_auth_errors_nor_in_debug() {
    let server = RedisServer::start();
    let url = format!("redis://:s3cret@127.0.0.1:{}", server.port());
    let () = server
        .query(
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("requirepass")
                .arg("s3cret"),
        )
        .await;
    // A wrong password: AUTH fails, as Backend, without echoing the password.
    let wrong = format!("redis://:wr0ng-s3cret@127.0.0.1:{}", server.port());
    let err = FencedRedis::connect(&wrong)
        .await
        .expect_err("AUTH fails with a wrong password");
    assert!(err.is_backend(), "{err:?}");
    let text = format!("{err} {err:?}");
    assert!(!text.contains("wr0ng-s3cret"), "{text}");

    let store = FencedRedis::connect(&url).await.expect("connect with AUTH");
    assert!(store.write("doc", "v", 1).await.expect("write"));
    let debug = format!("{store:?}");
    assert!(!debug.contains("s3cret"), "{debug}");
    assert!(debug.contains(":***@"), "{debug}");
    assert!(debug.contains("fenced:"), "{debug}");
}
