//! Bad configuration is `LockError::InvalidConfig`, at once and without touching the network:
//! each engine's malformed URLs, unknown or invalid options, and bad builder settings.
//!
//! Hosts are on port 1 or 2, where nothing listens: an option that were silently ignored would
//! end in a `Backend` error instead, and fail the test.

use std::time::{Duration, Instant};

use dlock_runtime::{LockError, MAX_KEY_LEN, Runtime, RuntimeBuilder, with_lock};
use dlock_tests::AcquireExt;

use crate::fixture::{Engine, Fixture};
use crate::support::{LONG_LEASE, assert_busy, assert_free};

/// URLs of `engine` that must be refused, each with what the message must mention ("" for
/// nothing in particular).
fn bad_urls(engine: Engine) -> &'static [(&'static str, &'static str)] {
    match engine {
        Engine::Memory => &[
            ("memory://localhost", ""),
            ("memory://?no_such_option=1", "no_such_option"),
            ("memory://?lease=soon", "soon"),
            ("memory://?lease=0s", ""),
            ("memory://?timeout=0s", ""),
        ],
        Engine::Redis => &[
            ("redis://127.0.0.1:notaport", ""),
            ("redis://127.0.0.1:99999", ""),
            ("redis://127.0.0.1:1/?no_such_option=1", "no_such_option"),
            ("redis://127.0.0.1:1?wait=soon", "soon"),
        ],
        Engine::Cluster => &[
            ("redis+cluster://", ""),
            ("redis+cluster://127.0.0.1:1,,127.0.0.1:2", ""),
            (
                "redis+cluster://127.0.0.1:1?no_such_option=1",
                "no_such_option",
            ),
            ("redis+cluster://127.0.0.1:1?timeout=soon", "soon"),
        ],
        Engine::Redlock => &[
            ("redlock://127.0.0.1:1", "at least 3"),
            ("redlock://127.0.0.1:1,127.0.0.1:2", "at least 3"),
            (
                "redlock://127.0.0.1:1,127.0.0.1:2?node_timeout=50ms",
                "at least 3",
            ),
            ("redlock://127.0.0.1:1,,127.0.0.1:3", ""),
            (
                "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?no_such_option=1",
                "no_such_option",
            ),
            (
                "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?node_timeout=0s",
                "",
            ),
            (
                "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?node_timeout=soon",
                "soon",
            ),
        ],
        Engine::Etcd => &[
            ("etcd://", ""),
            ("etcd://127.0.0.1:1,,127.0.0.1:2", ""),
            ("etcd://127.0.0.1:1?no_such_option=1", "no_such_option"),
            ("etcd://127.0.0.1:1?timeout=soon", "soon"),
            ("etcd://127.0.0.1:1?lease=0s", ""),
        ],
        Engine::ZooKeeper => &[
            ("zk://", ""),
            ("zk://,", ""),
            ("zk://127.0.0.1:2?no_such_option=1", "no_such_option"),
            ("zk://127.0.0.1:2?session_timeout=0s", ""),
            ("zk://127.0.0.1:2?session_timeout=soon", "soon"),
        ],
    }
}

/// Builders of `engine` that must be refused: what is wrong, the builder, and what the message
/// must mention ("" for nothing in particular).
fn bad_builders(engine: Engine) -> Vec<(&'static str, RuntimeBuilder, &'static str)> {
    let b = Runtime::builder;
    match engine {
        Engine::Memory => vec![
            (
                "a zero default lease",
                b().memory().default_lease(Duration::ZERO),
                "",
            ),
            ("a zero timeout", b().memory().timeout(Duration::ZERO), ""),
        ],
        Engine::Redis => vec![
            ("a URL that is not one", b().redis("not a url"), ""),
            (
                "a zero timeout",
                b().redis("redis://127.0.0.1:1").timeout(Duration::ZERO),
                "",
            ),
        ],
        Engine::Cluster => vec![
            ("no seeds", b().redis_cluster(Vec::<String>::new()), ""),
            (
                "a seed that is not a redis URL",
                b().redis_cluster(["http://127.0.0.1:1"]),
                "",
            ),
            (
                "a seed that is not a URL",
                b().redis_cluster(["not a url"]),
                "",
            ),
        ],
        Engine::Redlock => vec![
            ("no nodes", b().redlock(Vec::<String>::new()), ""),
            ("one node", b().redlock(["redis://127.0.0.1:1"]), ""),
            (
                "two nodes",
                b().redlock(["redis://127.0.0.1:1", "redis://127.0.0.1:2"]),
                "",
            ),
        ],
        Engine::Etcd => vec![
            ("no endpoints", b().etcd(Vec::<String>::new()), ""),
            (
                "a zero default lease",
                b().etcd(["http://127.0.0.1:1"])
                    .default_lease(Duration::ZERO),
                "",
            ),
        ],
        Engine::ZooKeeper => vec![
            ("an empty connect string", b().zookeeper(""), ""),
            (
                "a zero session timeout",
                b().zookeeper("127.0.0.1:2").session_timeout(Duration::ZERO),
                "",
            ),
        ],
    }
}

/// Asserts `out` is `InvalidConfig` with a lowercase message mentioning `mention`, returned
/// within a second.
#[track_caller]
fn assert_invalid<T>(
    engine: Engine,
    what: &str,
    mention: &str,
    out: Result<T, LockError>,
    took: Duration,
) {
    let err = match out {
        Ok(_) => panic!("{engine:?}: {what} was accepted"),
        Err(err) => err,
    };
    assert!(
        matches!(err, LockError::InvalidConfig(..)) && err.is_invalid_config(),
        "{engine:?}: {what}: expected InvalidConfig, got {err:?}"
    );
    let message = err.to_string();
    assert!(
        !message.is_empty() && !message.starts_with(|c: char| c.is_uppercase()),
        "{engine:?}: {what}: messages are lowercase: {message:?}"
    );
    assert!(
        message.contains(mention),
        "{engine:?}: {what}: the message should mention {mention:?}: {message}"
    );
    assert!(
        took < Duration::from_secs(1),
        "{engine:?}: {what}: refused after {took:?}, not at once"
    );
}

/// Every bad URL and builder of the engine is `InvalidConfig`, within a second.
pub(crate) async fn bad_configuration_is_invalid_config(engine: Engine) {
    for (url, mention) in bad_urls(engine) {
        let start = Instant::now();
        let out = Runtime::from_url(url).await;
        assert_invalid(engine, url, mention, out, start.elapsed());
    }
    for (what, builder, mention) in bad_builders(engine) {
        let start = Instant::now();
        let out = builder.build().await;
        assert_invalid(engine, what, mention, out, start.elapsed());
    }
}

/// An empty key and one longer than [`MAX_KEY_LEN`] bytes are `InvalidConfig` at once, from
/// `acquire()` and from `with_lock` (whose body never runs); a key of exactly the limit, made
/// of the characters engines treat specially, is locked and released like any other.
pub(crate) async fn keys_over_the_limit_are_invalid_and_at_the_limit_work(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let rt = fixture.runtime().await;
    let too_long = "k".repeat(MAX_KEY_LEN + 1);
    for (what, key, mention) in [
        ("an empty key", "", "empty"),
        ("a key over the limit", too_long.as_str(), "maximum"),
    ] {
        let start = Instant::now();
        let out = rt.lock(key).acquire().await;
        assert_invalid(engine, what, mention, out, start.elapsed());
        let start = Instant::now();
        let out = with_lock(rt.lock(key), async {
            panic!("{engine:?}: {what}: the body ran")
        })
        .await;
        assert_invalid(engine, what, mention, out, start.elapsed());
    }

    // Multi-byte and special characters, cut to exactly the limit in bytes.
    let mut key = String::from("conformance:keys:{}/%:é:");
    while key.len() < MAX_KEY_LEN {
        key.push(if key.len() % 7 == 0 { '}' } else { 'x' });
    }
    assert_eq!(key.len(), MAX_KEY_LEN);
    let guard = rt
        .lock(key.as_str())
        .lease(LONG_LEASE)
        .held("a key at the limit")
        .await;
    let other = fixture.runtime().await;
    assert_busy(&other, &key, "while a key at the limit is held").await;
    guard.release().await.expect("release");
    assert_free(&other, &key, "after the release").await;
}
