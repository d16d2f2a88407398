//! `rediss://` end to end against a TLS-only `redis-server` ([`RedisServer::start_tls`], a
//! certificate signed by a test CA that the client trusts through `?ca=`): acquisition and
//! exclusion between two runtimes, a release waking a waiter through pub/sub over TLS, the
//! watchdog renewing a short lease, and the failures: a plaintext `redis://` URL to the TLS port
//! (a message that hints at TLS) and a `rediss://` URL that does not trust the test CA both end
//! in `LockError::Backend`, promptly; `#insecure` (verification off) is `InvalidConfig` without
//! the crate's `tls-insecure-skip-verify` feature. Mutual TLS ([`RedisServer::start_mutual_tls`],
//! `tls-auth-clients yes`): a client certificate named by `cert=` and `key=` is accepted; none,
//! or one of another CA, is a prompt `Backend` error.

use std::time::{Duration, Instant};

use dlock_tests::{
    AcquireExt, BuildExt, HoldExt, RedisServer, Runtime, assert_between, assert_watchdog_renews_on,
    lock_key, release_wakes_the_waiter,
};

/// Long enough that a TTL-bounded retry cannot explain a prompt wake-up.
const LEASE: Duration = Duration::from_secs(30);

/// Builds a runtime on `url` with a 2 s engine timeout; panics if building hangs for 20 s.
async fn build_within_20_s(url: &str) -> Result<Runtime, dlock_tests::LockError> {
    let builder = Runtime::builder()
        .redis(url)
        .timeout(Duration::from_secs(2));
    let what = format!("a runtime on {url}");
    builder.build_within(Duration::from_secs(20), &what).await
}

/// A connection to `url` must fail (`why`: how it is made): building a runtime on it, or else
/// its first acquire of `key` (one attempt), is `LockError::Backend`, within 10 s with a 2 s
/// timeout; neither may hang for 20 s.
async fn assert_refused_promptly(url: &str, key: &str, why: &str) {
    let start = Instant::now();
    let err = match build_within_20_s(url).await {
        Ok(rt) => tokio::time::timeout(
            Duration::from_secs(20),
            rt.lock(key).wait(Duration::ZERO).acquire(),
        )
        .await
        .unwrap_or_else(|_| panic!("an acquire {why} hung for 20 s"))
        .map(|_guard| ())
        .expect_err(&format!("an acquire {why} must fail")),
        Err(err) => err,
    };
    println!("{url} failed after {:?}: {err}", start.elapsed());
    assert!(err.is_backend(), "expected LockError::Backend, got {err:?}");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "failing took {:?} with a 2 s timeout",
        start.elapsed()
    );
}

/// Two runtimes on a TLS server: two owners, as two processes would be.
async fn tls_runtimes(server: &RedisServer) -> [Runtime; 2] {
    [tls_runtime(server).await, tls_runtime(server).await]
}

async fn tls_runtime(server: &RedisServer) -> Runtime {
    assert!(server.url().starts_with("rediss://"), "{}", server.url());
    Runtime::builder()
        .redis(server.url())
        .build()
        .await
        .unwrap_or_else(|e| panic!("a runtime on {}: {e}", server.url()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_acquire_excludes_a_second_runtime_until_release() {
    let server = RedisServer::start_tls();
    let [a, b] = tls_runtimes(&server).await;
    let key = "tls:exclusion";

    let guard = a.lock(key).lease(LEASE).held("acquire").await;
    assert!(guard.fence().is_some(), "a Redis lock has a fence");
    // The raw client goes over TLS too: the lock is really there, and its fence counter.
    assert!(server.exists(&lock_key(key)).await, "lock missing");
    assert_eq!(
        server.latest_acquired_fence(&lock_key(key)).await,
        guard.fence()
    );

    let start = Instant::now();
    let err = b
        .lock(key)
        .lease(LEASE)
        .wait(Duration::from_millis(300))
        .times_out("a second runtime must not get a held key")
        .await;
    assert_eq!(err.key(), Some(key));
    assert_between(
        "busy acquire over TLS, wait 300 ms",
        start.elapsed(),
        Duration::from_millis(250),
        Duration::from_secs(5),
    );

    let first_fence = guard.fence();
    guard.release().await.expect("release");
    // Gone, or reserved for a moment for the runtimes other than `a` (`b` flagged it while it
    // waited): either way `b` takes it at once.
    assert!(
        server.lock_is_free(&lock_key(key)).await,
        "released key still held"
    );
    let second = b.hold_within(key, LEASE, Duration::ZERO).await;
    assert!(second.fence() > first_fence, "fences increase over TLS too");
    second.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_release_wakes_waiter_in_other_runtime_within_500_ms() {
    let server = RedisServer::start_tls();
    let [holder_rt, waiter_rt] = tls_runtimes(&server).await;
    let key = "tls:notify";
    let bound = Duration::from_millis(500);
    release_wakes_the_waiter(&holder_rt, &waiter_rt, key, (3, bound), "TLS").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_watchdog_keeps_one_second_lease_for_three_seconds() {
    let server = RedisServer::start_tls();
    let [rt, other] = tls_runtimes(&server).await;
    let period = Duration::from_secs(3);
    assert_watchdog_renews_on(&server, (&rt, Some(&other)), "tls:watchdog", period).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_plaintext_url_to_tls_port_fails_with_backend_error_promptly() {
    let server = RedisServer::start_tls();
    let plain = format!("redis://127.0.0.1:{}", server.port());
    let start = Instant::now();
    let out = build_within_20_s(&plain).await;
    let elapsed = start.elapsed();
    let err = match out {
        Ok(rt) => {
            // If the connection is made lazily, the first operation must fail instead.
            let out = tokio::time::timeout(
                Duration::from_secs(20),
                rt.lock("tls:plain").wait(Duration::ZERO).acquire(),
            )
            .await
            .expect("an acquire on a plaintext connection to a TLS port hung for 20 s");
            out.map(|_guard| ())
                .expect_err("plaintext RESP to a TLS port must not take a lock")
        }
        Err(err) => err,
    };
    println!("{plain} failed after {elapsed:?}: {err}");
    assert!(err.is_backend(), "expected LockError::Backend, got {err:?}");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "failing took {:?} with a 2 s timeout",
        start.elapsed()
    );
    assert!(
        err.to_string().contains("rediss://"),
        "the message hints at TLS: {err}"
    );
    // The same through a cluster URL.
    let cluster = format!("redis+cluster://127.0.0.1:{}?timeout=2s", server.port());
    let start = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(20), Runtime::from_url(&cluster))
        .await
        .expect("a plaintext cluster connection to a TLS port hung for 20 s")
        .map(|_| ())
        .expect_err("plaintext RESP to a TLS port");
    println!("{cluster} failed after {:?}: {err}", start.elapsed());
    assert!(err.is_backend(), "expected LockError::Backend, got {err:?}");
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(
        err.to_string().contains("rediss://"),
        "the message hints at TLS: {err}"
    );
    // The server is unharmed and still serves TLS clients.
    let rt = tls_runtime(&server).await;
    rt.lock("tls:plain")
        .cycled("a TLS client after the plaintext one")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_certificate_of_an_untrusted_ca_is_rejected() {
    let server = RedisServer::start_tls();
    let why = "verifying an untrusted self-signed certificate";
    assert_refused_promptly(&server.tls_url_verified(), "tls:verified", why).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_insecure_fragment_is_refused_without_its_feature() {
    let server = RedisServer::start_tls();
    let insecure = server.insecure_url();
    let err = Runtime::from_url(&insecure)
        .await
        .expect_err("#insecure turns verification off: refused unless the feature is on");
    assert!(err.is_invalid_config(), "{insecure}: {err:?}");
    assert!(
        err.to_string().contains("tls-insecure-skip-verify"),
        "the message names the feature: {err}"
    );
    let err = Runtime::builder()
        .redis(insecure.clone())
        .build()
        .await
        .expect_err("the builder refuses it too");
    assert!(err.is_invalid_config(), "{insecure}: {err:?}");
}

/// Regression (issue "reliability", TLS): client certificates could not be configured. With
/// `cert=` and `key=` a runtime passes a server that requires a client certificate: it locks,
/// excludes a second runtime, is woken by a release, and renews a short lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_client_certificate_from_the_url_locks_waits_and_renews() {
    let server = RedisServer::start_mutual_tls();
    let url = server.url();
    assert!(url.contains("cert=") && url.contains("key="), "{url}");
    let [a, b] = tls_runtimes(&server).await;
    let guard = a.lock("mtls:exclusion").lease(LEASE).held("acquire").await;
    b.lock("mtls:exclusion")
        .times_out("a second runtime must not get a held key")
        .await;
    guard.release().await.expect("release");
    let bound = Duration::from_millis(500);
    release_wakes_the_waiter(&a, &b, "mtls:notify", (2, bound), "mutual TLS").await;
    let period = Duration::from_secs(3);
    assert_watchdog_renews_on(&server, (&a, Some(&b)), "mtls:watchdog", period).await;
}

/// A server that requires a client certificate refuses a client without one, and one whose
/// certificate another CA signed: `Backend`, promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_without_a_trusted_client_certificate_is_a_backend_error() {
    let server = RedisServer::start_mutual_tls();
    for url in [
        server.url_without_client_cert(),
        server.url_with_foreign_client_cert(),
    ] {
        let why = "without a trusted client certificate";
        assert_refused_promptly(&url, "mtls:refused", why).await;
    }
}
