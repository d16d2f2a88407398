//! Awkward keys (spaces, unicode, braces, 1 KiB) lock, exclude and release like any other, under
//! the documented Redis layout `dlock:{<key>}`; a custom prefix replaces `dlock:`.

use std::time::Duration;

use dlock_tests::{AcquireExt, Backend, BuildExt, RedisServer, Runtime, on_both_backends};

const LEASE: Duration = Duration::from_secs(30);

on_both_backends!(
    key_with_spaces_works,
    unicode_key_works,
    key_with_braces_works,
    one_kib_key_works,
);

/// Acquire, check the hold (raw hash on Redis), exclusion against a second acquirer, release.
async fn check_key(b: &Backend, key: &str) {
    let other = b.other_runtime().await;
    let guard = b.rt.lock(key).lease(LEASE).held("acquire").await;
    assert_eq!(guard.key(), key);
    assert!(
        b.is_held(key).await,
        "held: {:?} (dlock:{{<key>}} on Redis)",
        key
    );
    let err = other
        .lock(key)
        .wait(Duration::ZERO)
        .times_out("a second acquirer must be excluded")
        .await;
    assert_eq!(err.key(), Some(key));
    guard.release().await.expect("release");
    assert!(!b.is_held(key).await, "released: {key:?}");
    other
        .lock(key)
        .wait(Duration::ZERO)
        .cycled("free after release")
        .await;
}

async fn key_with_spaces_works(b: Backend) {
    check_key(&b, "order 42 for  two").await;
}

async fn unicode_key_works(b: Backend) {
    check_key(&b, "склад:🔒:ü:東京").await;
}

async fn key_with_braces_works(b: Backend) {
    check_key(&b, "{a}b}").await;
    check_key(&b, "}{").await;
}

async fn one_kib_key_works(b: Backend) {
    let key = "k".repeat(1024);
    check_key(&b, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_key_prefix_is_used_and_separates_namespaces() {
    let server = RedisServer::start();
    let app1 = Runtime::builder()
        .redis(server.url())
        .key_prefix("app1:")
        .built()
        .await;
    assert_eq!(app1.key_prefix(), "app1:");
    let default = Runtime::from_url(&server.url()).await.expect("runtime");
    assert_eq!(default.key_prefix(), "dlock:");

    let guard = app1.lock("shared").lease(LEASE).held("acquire").await;
    assert!(
        server.exists("app1:{shared}").await,
        "lock hash at <prefix>{{<key>}}"
    );
    assert!(!server.exists("dlock:{shared}").await);
    let other = default
        .lock("shared")
        .wait(Duration::ZERO)
        .held("another prefix is another namespace")
        .await;
    assert!(server.exists("dlock:{shared}").await);
    guard.release().await.expect("release");
    other.release().await.expect("release");
    assert!(!server.exists("app1:{shared}").await);
    assert!(!server.exists("dlock:{shared}").await);
}
