//! Read-write locks leave nothing behind: once every reader and writer has released, and
//! nobody waits, a reader that does not wait (`wait = 0`) gets the key at once, on every
//! engine. (Found by a check from outside: 8 readers, a writer waiting for them, a reader
//! refused during the write; after all had released, a `wait = 0` reader was still refused
//! on Redis: the writer's own wait had flagged the key, so its release reserved the key for
//! other runtimes' waiters that did not exist.)

use std::time::Duration;

use dlock_runtime::Runtime;
use dlock_tests::etcd::EtcdCluster;
use dlock_tests::zookeeper::ZooKeeperServer;
use dlock_tests::{AcquireExt, BuildExt, RedisServer};

const LEASE: Duration = Duration::from_secs(30);

/// 8 readers hold; a writer waits for them; a `wait = 0` reader is refused while the writer
/// holds; then everybody has released and a `wait = 0` reader, then a `wait = 0` writer, get
/// the key at once.
async fn nothing_outlives_the_holders_and_waiters(rt: &Runtime, engine: &str) {
    let key = "rw:leftover";
    let mut readers = Vec::new();
    for i in 0..8 {
        let what = format!("{engine}: reader {i}");
        readers.push(rt.lock(key).read().lease(LEASE).held(&what).await);
    }
    let writer = tokio::spawn({
        let rt = rt.clone();
        async move {
            rt.lock(key)
                .lease(LEASE)
                .wait(Duration::from_secs(20))
                .acquire()
                .await
        }
    });
    // The writer has tried and waits behind the readers.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !writer.is_finished(),
        "{engine}: the writer waits for the readers"
    );
    for reader in readers {
        reader.release().await.expect("release a reader");
    }
    let writer = writer
        .await
        .expect("the writer's task")
        .unwrap_or_else(|e| panic!("{engine}: the writer gets the key: {e}"));
    let refused = rt
        .lock(key)
        .read()
        .refused(&format!("{engine}: a reader during the write"))
        .await;
    assert!(refused.is_timeout(), "{engine}: {refused}");
    writer.release().await.expect("release the writer");
    let reader = rt
        .lock(key)
        .read()
        .lease(LEASE)
        .held(&format!(
            "{engine}: a wait-0 reader once every holder and waiter released"
        ))
        .await;
    reader.release().await.expect("release the last reader");
    let writer = rt
        .lock(key)
        .lease(LEASE)
        .held(&format!("{engine}: a wait-0 writer after it"))
        .await;
    writer.release().await.expect("release the last writer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_nothing_outlives_the_holders_and_waiters() {
    let rt = Runtime::builder().memory().built().await;
    nothing_outlives_the_holders_and_waiters(&rt, "memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_nothing_outlives_the_holders_and_waiters() {
    let server = RedisServer::start();
    let rt = Runtime::builder().redis(server.url()).built().await;
    nothing_outlives_the_holders_and_waiters(&rt, "redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_nothing_outlives_the_holders_and_waiters() {
    let cluster = EtcdCluster::start(1);
    let rt = Runtime::builder().etcd(cluster.endpoints()).built().await;
    nothing_outlives_the_holders_and_waiters(&rt, "etcd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_nothing_outlives_the_holders_and_waiters() {
    let server = ZooKeeperServer::start();
    let rt = Runtime::builder()
        .zookeeper(server.connect_string())
        .built()
        .await;
    nothing_outlives_the_holders_and_waiters(&rt, "zookeeper").await;
}
