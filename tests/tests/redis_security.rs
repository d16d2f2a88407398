//! Security on the Redis engines, against real servers: passwords (in the URL's userinfo or
//! the `pass` option) authenticate on one server, on every seed of a password-protected Redis
//! Cluster configured by URL alone, and on every Redlock node; and they never appear in an
//! error's message, `Debug` or `source()` chain, in `Debug` of a builder or runtime, or in the
//! logs. A least-privilege ACL user (the commands and key/channel patterns the README lists)
//! can lock, renew, release and wait; a user missing one permission gets a `Backend` error
//! naming it. The database a URL names (with or without a password) holds the locks.

use std::error::Error as _;
use std::time::Duration;

use dlock_runtime::LockError;
use dlock_tests::cluster::RedisCluster;
use dlock_tests::{
    AcquireExt, BuildExt, RedisServer, Runtime, captured_logs, eventually, hand_off, lock_key,
    redlock_hosts, stays_held, waiter_got_it, while_held,
};

/// The password of the test servers; must never be printed.
const PASSWORD: &str = "s3cret-pw-0451";
/// A wrong password a test tries; must never be printed either.
const WRONG: &str = "wr0ng-pw-7731";

/// Asserts neither secret appears in `err`: its message, its `Debug`, or any error of its
/// `source()` chain (message and `Debug`).
#[track_caller]
fn assert_no_secret_in_error(err: &LockError, what: &str) {
    let mut shown = vec![err.to_string(), format!("{err:?}")];
    let mut source = err.source();
    while let Some(s) = source {
        shown.push(s.to_string());
        shown.push(format!("{s:?}"));
        source = s.source();
    }
    for text in shown {
        assert_no_secret(&text, what);
    }
}

#[track_caller]
fn assert_no_secret(text: &str, what: &str) {
    for secret in [PASSWORD, WRONG] {
        assert!(
            !text.contains(secret),
            "{what}: a password is shown in {text:?}"
        );
    }
}

/// Builds a runtime on `url` with a 2 s timeout and returns the error it must fail with.
async fn build_error(url: &str, what: &str) -> LockError {
    let builder = Runtime::builder()
        .redis(url)
        .timeout(Duration::from_secs(2));
    let built = builder.build_within(Duration::from_secs(20), what).await;
    let err = built.map(|_| ()).expect_err(what);
    assert_no_secret_in_error(&err, what);
    err
}

/// The database a `redis://` URL names holds the runtime's keys, with and without a password
/// (the connection's handshake then authenticates and selects): a held lock's key is in that
/// database and not in database 0, and the release frees it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_a_url_names_holds_the_locks() {
    let plain = RedisServer::start();
    let protected = RedisServer::start_with_password(PASSWORD);
    for (server, url) in [
        (&plain, format!("redis://127.0.0.1:{}/3", plain.port())),
        (
            &protected,
            format!("redis://:{PASSWORD}@127.0.0.1:{}/3", protected.port()),
        ),
    ] {
        let rt = Runtime::from_url(&url)
            .await
            .expect("a runtime on database 3");
        let key = "select:held";
        let guard = rt.lock(key).held("acquire on database 3").await;
        let conn = server.conn().await;
        let in_db = |db: i64| {
            let mut conn = conn.clone();
            async move {
                let (_, exists): ((), bool) = redis::pipe()
                    .cmd("SELECT")
                    .arg(db)
                    .cmd("EXISTS")
                    .arg(lock_key(key))
                    .query_async(&mut conn)
                    .await
                    .expect("EXISTS");
                exists
            }
        };
        assert!(in_db(3).await, "the held lock's key is in database 3");
        assert!(!in_db(0).await, "and not in database 0");
        guard.release().await.expect("release");
        assert!(!in_db(3).await, "the release freed it in database 3");
    }
}

/// Regression (issue "reliability", secrets): the password of a `redis://` URL, in the
/// userinfo or as `?pass=`, authenticates; a wrong one is a `Backend` error; and neither shows
/// in errors (`InvalidConfig` built from the URL, `Backend` and its sources), in `Debug`, or in
/// the logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_in_a_url_authenticates_and_is_never_shown() {
    let logs = captured_logs();
    let server = RedisServer::start_with_password(PASSWORD);
    let port = server.port();
    let userinfo_url = server.url();
    assert!(userinfo_url.contains(PASSWORD), "{userinfo_url}");
    let query_url = format!("redis://127.0.0.1:{port}?pass={PASSWORD}");
    for url in [&userinfo_url, &query_url] {
        let rt = Runtime::from_url(url)
            .await
            .unwrap_or_else(|e| panic!("a runtime on the password-protected server: {e}"));
        let guard = rt
            .lock("secret:cycle")
            .lease(Duration::from_secs(1))
            .held("acquire with the password")
            .await;
        // A few renewals go out with the same connection.
        stays_held(&guard, Duration::from_millis(1500)).await;
        guard.release().await.expect("release");
        assert_no_secret(&format!("{rt:?}"), "Debug of a runtime");
        let builder = Runtime::builder().redis(url.as_str());
        assert_no_secret(&format!("{builder:?}"), "Debug of a builder");
        let builder = Runtime::builder().redis_cluster([url.as_str()]);
        assert_no_secret(&format!("{builder:?}"), "Debug of a cluster builder");
        let builder = Runtime::builder().redlock([url.as_str(), url.as_str(), url.as_str()]);
        assert_no_secret(&format!("{builder:?}"), "Debug of a redlock builder");
    }

    // Wrong passwords, and a server that is not there: Backend, nothing shown.
    for url in [
        format!("redis://:{WRONG}@127.0.0.1:{port}"),
        format!("redis://127.0.0.1:{port}?pass={WRONG}"),
        format!("redis://app:{PASSWORD}@127.0.0.1:1"),
    ] {
        let err = build_error(&url, "a wrong password or no server").await;
        assert!(err.is_backend(), "{err:?}");
    }

    // Configuration errors about a URL that carries a password: InvalidConfig, nothing shown.
    for url in [
        format!("{userinfo_url}?dbb=1"),
        format!("{userinfo_url}?lease=forever"),
        format!("{query_url}&dbb=1"),
        format!("{query_url}&db=first"),
        format!("{userinfo_url}?ca=/nonexistent/ca.pem"),
        format!("rediss://:{PASSWORD}@127.0.0.1:{port}/#insecure"),
        format!("redis+cluster://:{PASSWORD}@127.0.0.1:{port},?x=1"),
        format!("redlock://:{PASSWORD}@127.0.0.1:{port}?node_timeout=never"),
        format!("zk://u:{PASSWORD}@127.0.0.1:{port}?pass={PASSWORD}"),
        format!(":{PASSWORD}@127.0.0.1:{port}"),
        format!("redis://:{PASSWORD}@127.0.0.1:notaport"),
        format!("redis://:{PASSWORD}@[::1"),
    ] {
        let err = Runtime::from_url(&url)
            .await
            .map(|_| ())
            .expect_err("a bad URL");
        assert!(err.is_invalid_config(), "{url}: {err:?}");
        assert_no_secret_in_error(&err, &format!("from_url of a bad URL ({err})"));
    }
    let err = build_error(&format!("{userinfo_url}?dbb=1"), "builder with a typo").await;
    assert!(err.is_invalid_config(), "{err:?}");

    let logged = logs.text();
    assert!(!logged.is_empty(), "nothing was captured");
    assert_no_secret(&logged, "the logs");
}

/// Regression (issue "reliability", secrets): `redis+cluster://:<pw>@h1,h2,...` gave the
/// password to the first host only, and the cluster client refused the seeds ("Cannot use
/// different password among initial nodes"). Now a password-protected cluster (`requirepass`,
/// `masterauth`) is configured by its URL alone, and so by seeds of which only one carries it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_protected_cluster_is_configured_by_url_alone() {
    let cluster = RedisCluster::start_with_password(PASSWORD);
    let url = cluster.url();
    assert!(
        url.starts_with(&format!("redis+cluster://:{PASSWORD}@")),
        "{url}"
    );
    let rt = Runtime::from_url(&url)
        .await
        .unwrap_or_else(|e| panic!("a runtime on the cluster URL: {e}"));
    let mut seeds = cluster.seeds();
    for seed in seeds.iter_mut().skip(1) {
        *seed = seed.replace(&format!(":{PASSWORD}@"), "");
    }
    let other = Runtime::builder()
        .redis_cluster(seeds)
        .build()
        .await
        .unwrap_or_else(|e| panic!("a runtime on seeds of which the first has the password: {e}"));
    let lease = Duration::from_secs(1);
    for (key, master) in cluster.one_key_per_master("secure").await {
        let guard = rt.lock(key.as_str()).lease(lease).held("acquire").await;
        while_held(
            &guard,
            Duration::from_millis(1500),
            Duration::from_millis(250),
            |at| {
                let (other, key) = (&other, key.clone());
                async move {
                    other
                        .lock(key.as_str())
                        .times_out(&format!("held on node {master}, {at:?} in"))
                        .await;
                }
            },
        )
        .await;
        guard.release().await.expect("release");
        other
            .lock(key.as_str())
            .cycled("free after the release")
            .await;
    }
    let wrong = cluster.seeds()[0].replace(PASSWORD, WRONG);
    let what = "a cluster with a wrong password";
    let builder = Runtime::builder()
        .redis_cluster([wrong])
        .timeout(Duration::from_secs(2));
    let built = builder.build_within(Duration::from_secs(20), what).await;
    let err = built.map(|_| ()).expect_err(what);
    assert!(err.is_backend(), "{err:?}");
    assert_no_secret_in_error(&err, what);
}

/// The userinfo before the first host of a `redlock://` URL authenticates on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_in_a_redlock_url_applies_to_every_node() {
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_with_password(PASSWORD))
        .collect();
    let hosts = redlock_hosts(&servers);
    let url = format!("redlock://:{PASSWORD}@{hosts}?node_timeout=500ms");
    let rt = Runtime::from_url(&url).await.expect("a redlock runtime");
    let guard = rt
        .lock("secure:redlock")
        .held("acquire on a majority")
        .await;
    for server in &servers {
        assert!(
            server
                .exists(&dlock_tests::lock_key("secure:redlock"))
                .await,
            "node {} did not grant the lock",
            server.port()
        );
    }
    guard.release().await.expect("release");
}

/// The ACL rule of the README's Security section, for user `name` with password `pw`.
fn documented_acl(name: &str, pw: &str) -> Vec<String> {
    let readme = include_str!("../../README.md");
    let rule = readme
        .lines()
        .find(|l| l.starts_with("ACL SETUSER dlock "))
        .expect("the README gives the ACL rule on one line starting `ACL SETUSER dlock `");
    rule.split_whitespace()
        .skip(2)
        .map(|word| match word {
            "dlock" => name.to_owned(),
            w if w.starts_with('>') => format!(">{pw}"),
            w => w.to_owned(),
        })
        .collect()
}

/// `ACL SETUSER` with `rule` (as the words after `ACL SETUSER`).
fn setuser(rule: &[String]) -> redis::Cmd {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER");
    for word in rule {
        cmd.arg(word);
    }
    cmd
}

/// The documented rule without the grants in `drop`.
fn without(rule: &[String], drop: &[&str]) -> Vec<String> {
    rule.iter()
        .filter(|w| !drop.contains(&w.as_str()))
        .cloned()
        .collect()
}

/// Lock, renew (a 1 s lease held for 2.5 s), wait (a waiter on another runtime woken by the
/// release notification, not by polling), `is_locked` and `force_unlock`, all as the runtimes'
/// user.
async fn lock_renew_release_and_wait(rt: &Runtime, other: &Runtime, key: &str) {
    let lease = Duration::from_secs(1);
    let guard = rt
        .lock(key)
        .lease(lease)
        .held("acquire as the ACL user")
        .await;
    assert!(
        other
            .is_locked(key)
            .await
            .expect("is_locked as the ACL user")
    );
    let shown = other.inspect(key).await.expect("inspect as the ACL user");
    assert_eq!(shown.map(|info| info.key).as_deref(), Some(key));
    let listed = other.list(key).await.expect("list (SCAN) as the ACL user");
    assert_eq!(listed.len(), 1, "{listed:?}");
    let waiter = other
        .lock(key)
        .lease(Duration::from_secs(30))
        .wait(Duration::from_secs(20))
        .spawn();
    stays_held(&guard, Duration::from_millis(2500)).await;
    assert!(!waiter.is_finished(), "the waiter got a held key");
    let next = hand_off(guard, waiter, Duration::from_millis(500), key).await;
    assert!(next.fence().is_some());
    drop(next);
    // Released from Drop; then the operator's tool.
    let relocked = rt
        .lock(key)
        .wait(Duration::from_secs(5))
        .held("again")
        .await;
    assert!(
        rt.force_unlock(key)
            .await
            .expect("force_unlock as the ACL user")
    );
    let _ = relocked.release().await;
    // The other primitives: readers, a semaphore, a fair lock's line, several keys.
    let readers = [
        rt.lock(format!("{key}:rw")).read().held("a reader").await,
        other
            .lock(format!("{key}:rw"))
            .read()
            .held("a reader")
            .await,
    ];
    let shown = other
        .inspect(&format!("{key}:rw"))
        .await
        .expect("inspect readers");
    assert_eq!(shown.map(|info| info.holds), Some(2));
    for reader in readers {
        reader.release().await.expect("release a reader");
    }
    let permit = rt.semaphore(format!("{key}:sem"), 2).held("a permit").await;
    permit.release().await.expect("release a permit");
    let fair = rt
        .lock(format!("{key}:fair"))
        .fair(true)
        .held("a fair lock")
        .await;
    let fair_waiter = other
        .lock(format!("{key}:fair"))
        .fair(true)
        .wait(Duration::from_secs(10))
        .spawn();
    tokio::time::sleep(Duration::from_millis(300)).await;
    fair.release().await.expect("release the fair lock");
    let (next, _) = waiter_got_it(fair_waiter, Duration::from_secs(10), "the fair waiter").await;
    next.release().await.expect("release");
    rt.lock_all([format!("{key}:a"), format!("{key}:b")])
        .cycled("several keys")
        .await;
}

/// The least-privilege ACL of the README (commands, `~dlock:*`, `&dlock:*`) is enough for
/// everything a lock does on one server: acquire, renew, release, wait by notification,
/// `is_locked`, `inspect`, `list`, `force_unlock`; and the server refused nothing meanwhile (`ACL LOG` empty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_acl_user_locks_renews_releases_and_waits() {
    let server = RedisServer::start();
    let () = server
        .query(&setuser(&documented_acl("locker", PASSWORD)))
        .await;
    let url = format!("redis://locker:{PASSWORD}@127.0.0.1:{}", server.port());
    let rt = Runtime::from_url(&url)
        .await
        .expect("a runtime as the ACL user");
    let other = Runtime::from_url(&url)
        .await
        .expect("a runtime as the ACL user");
    lock_renew_release_and_wait(&rt, &other, "acl:single").await;
    let log: Vec<redis::Value> = server.query(redis::cmd("ACL").arg("LOG")).await;
    assert!(log.is_empty(), "the server refused something: {log:?}");
}

/// The same ACL (set on every node: ACLs are per node) is enough on a Redis Cluster, sharded
/// subscriptions and topology discovery included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_acl_user_works_on_a_cluster() {
    let cluster = RedisCluster::start();
    let rule = setuser(&documented_acl("locker", PASSWORD));
    for i in 0..cluster.len() {
        let () = cluster.node_query(i, &rule).await.expect("ACL SETUSER");
    }
    let seeds: Vec<String> = (0..cluster.len())
        .map(|i| format!("redis://locker:{PASSWORD}@127.0.0.1:{}", cluster.port(i)))
        .collect();
    let rt = Runtime::builder()
        .redis_cluster(seeds.clone())
        .build()
        .await
        .expect("a cluster runtime as the ACL user");
    let other = Runtime::builder()
        .redis_cluster(seeds)
        .build()
        .await
        .expect("a cluster runtime as the ACL user");
    for (key, _) in cluster.one_key_per_master("acl").await {
        lock_renew_release_and_wait(&rt, &other, &key).await;
    }
    for i in 0..cluster.len() {
        let log: Vec<redis::Value> = cluster
            .node_query(i, redis::cmd("ACL").arg("LOG"))
            .await
            .expect("ACL LOG");
        assert!(log.is_empty(), "node {i} refused something: {log:?}");
    }
}

/// A user missing one permission of the documented ACL gets `LockError::Backend` whose message
/// names the grant it lacks: a command (`+evalsha`; `+eval`, which loads a script the server
/// does not have yet; `+incrby`, which the first attempt runs; `+subscribe`), the key pattern,
/// or the channel pattern. Subscribing is checked when the runtime connects, so waiters do not
/// silently fall back to polling. Whatever was refused, the key is free within its lease (a
/// first attempt refused after its `SET` landed is released by its compensation, or, for a
/// user who may run no script at all, expires).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_missing_a_permission_gets_a_backend_error_naming_it() {
    let server = RedisServer::start();
    let cases: [(&str, &[&str], &str); 6] = [
        ("no-scripts", &["+evalsha", "+eval"], "`+evalsha`"),
        ("no-eval", &["+eval"], "`+eval`"),
        ("no-incrby", &["+incrby"], "`+incrby`"),
        ("no-keys", &["~dlock:*"], "`~dlock:*`"),
        ("no-subscribe", &["+subscribe"], "`+subscribe`"),
        ("no-channels", &["&dlock:*"], "`&dlock:*`"),
    ];
    for (user, drop, named) in cases {
        let rule = without(&documented_acl(user, PASSWORD), drop);
        let () = server.query(&setuser(&rule)).await;
        let url = format!("redis://{user}:{PASSWORD}@127.0.0.1:{}", server.port());
        let outcome = async {
            let rt = Runtime::builder()
                .redis(url.as_str())
                .timeout(Duration::from_secs(2))
                .build()
                .await?;
            rt.lock(format!("acl:{user}"))
                .lease(Duration::from_secs(1))
                .acquire()
                .await?
                .release()
                .await
        }
        .await;
        let err = outcome.expect_err(user);
        assert!(err.is_backend(), "{user}: expected Backend, got {err:?}");
        let message = err.to_string();
        println!("{user}: {message}");
        assert!(
            message.contains("ACL") && message.contains(named),
            "{user}: the message must name {named}: {message}"
        );
        let lock = lock_key(&format!("acl:{user}"));
        eventually(Duration::from_secs(5), "the key is left free", || {
            let server = &server;
            let lock = &lock;
            async move { !server.exists(lock).await }
        })
        .await;
    }
}
