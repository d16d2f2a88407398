//! End-to-end test helpers for dlock.
//!
//! The servers a test starts (`redis-server` plain or TLS, a Redis Cluster, etcd, ZooKeeper, and
//! the `dlock-holder` process) come from the `dlock-testkit` crate and are re-exported here:
//! [`RedisServer`], [`cluster`], [`etcd`], [`zookeeper`], [`HolderProcess`]. Each runs on free
//! loopback ports in a fresh temp dir, is killed by PID when its handle drops, and prints its
//! log if the test is failing then.
//!
//! [`Backend`] pairs a [`Runtime`] with the server it talks to (none for `memory://`), and
//! [`on_both_backends!`] turns one `async fn test(b: Backend)` into two tests,
//! `on_memory::test` and `on_redis::test`, so the behavioural suite runs on both engines.
//!
//! [`HolderProcess`] drives the `dlock-holder` binary of this package: a separate OS process
//! that takes locks, for exclusion across processes and for kill -9 of a holder.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod acquire;
pub mod handover;
mod logs;
mod processes;
pub mod turns;

pub use acquire::{
    AcquireExt, BuildExt, HoldExt, LONG_LEASE, LONG_WAIT, acquire_within, assert_busy, assert_free,
    assert_ttl_within_lease, finish_within, hand_off, held_long, release_wakes_the_waiter,
    stays_held, waiter_got_it, while_held,
};
pub use logs::{Logs, captured_logs};
pub use processes::{
    Counting, count_in_processes, hold_fenced_in_process, hold_in_process, holder_bin,
    spawn_hold_process,
};

pub use dlock_runtime::{LockError, LockGuard, Runtime};
pub use dlock_testkit::redis::{
    REDIS_SERVER_ENV, fence_key, lock_key, redlock_hosts, released_channel, script_calls_in,
    turns_key,
};
pub use dlock_testkit::{HolderProcess, RedisKeys, RedisServer, cluster, etcd, limits, zookeeper};

/// Which engine a [`Backend`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// `memory://`: in-process.
    Memory,
    /// `redis://`: a `redis-server` started for the test.
    Redis,
}

/// A runtime and the server behind it, for tests that run on every engine.
pub struct Backend {
    /// The engine.
    pub engine: Engine,
    /// A runtime on the engine, with default options.
    pub rt: Runtime,
    /// The server (Redis only).
    pub server: Option<RedisServer>,
}

impl Backend {
    /// An in-process `memory://` runtime.
    pub async fn memory() -> Backend {
        let rt = Runtime::builder().memory().built().await;
        Backend {
            engine: Engine::Memory,
            rt,
            server: None,
        }
    }

    /// A fresh `redis-server` and a runtime connected to it.
    pub async fn redis() -> Backend {
        let (server, rt) = redis_with_runtime().await;
        Backend {
            engine: Engine::Redis,
            rt,
            server: Some(server),
        }
    }

    /// Another runtime on the same engine and state: a second connection to the same server on
    /// Redis; the same runtime on memory (whose state lives in the runtime).
    pub async fn other_runtime(&self) -> Runtime {
        match &self.server {
            Some(server) => Runtime::builder().redis(server.url()).built().await,
            None => self.rt.clone(),
        }
    }

    /// The Redis server (panics on the memory engine).
    pub fn redis_server(&self) -> &RedisServer {
        self.server
            .as_ref()
            .expect("this test needs the redis engine")
    }

    /// Whether anyone holds `key`: a raw `EXISTS dlock:{key}` on Redis (not trusting the
    /// runtime), `Runtime::is_locked` on memory.
    pub async fn is_held(&self, key: &str) -> bool {
        match &self.server {
            Some(server) => server.exists(&lock_key(key)).await,
            None => self
                .rt
                .is_locked(key)
                .await
                .expect("is_locked on the memory runtime"),
        }
    }

    /// Waits until nobody holds `key`; panics if it is still held after `within`. Returns how
    /// long it took.
    pub async fn wait_until_free(&self, key: &str, within: Duration) -> Duration {
        let start = Instant::now();
        loop {
            if !self.is_held(key).await {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < within,
                "{:?}: key {key:?} still held {within:?} later",
                self.engine
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A fresh `redis-server` and a runtime on it with default options.
pub async fn redis_with_runtime() -> (RedisServer, Runtime) {
    redis_with_timeout(dlock_runtime::DEFAULT_TIMEOUT).await
}

/// A fresh `redis-server` and a runtime on it whose requests time out after `timeout`.
pub async fn redis_with_timeout(timeout: Duration) -> (RedisServer, Runtime) {
    let server = RedisServer::start();
    let rt = runtime_with_timeout(&server, timeout).await;
    (server, rt)
}

/// A runtime on `server` whose requests time out after `timeout`.
pub async fn runtime_with_timeout(server: &RedisServer, timeout: Duration) -> Runtime {
    Runtime::builder()
        .redis(server.url())
        .timeout(timeout)
        .built()
        .await
}

/// Stops `server` (SIGSTOP) until `guard`, held on it, is lost; resumes it whatever happened.
/// Panics unless the loss is seen within `within`.
pub async fn lost_while_paused(server: &mut RedisServer, guard: &LockGuard, within: Duration) {
    server.pause();
    let lost = tokio::time::timeout(within, guard.lost()).await;
    server.resume();
    lost.unwrap_or_else(|_| {
        panic!("the lock was not lost within {within:?} of pausing the server")
    });
}

/// Takes `key` on `rt` with a 1 s lease and holds it for `period`: every 100 ms the lock hash on
/// `server` has `0 < PTTL <= 1 s` (the watchdog renews it, a third of the lease at a time), the
/// guard is not lost, and `other` (if any) is refused at once. Then releases it; the hash is
/// gone.
pub async fn assert_watchdog_renews_on(
    server: &RedisServer,
    (rt, other): (&Runtime, Option<&Runtime>),
    key: &str,
    period: Duration,
) {
    let lease = Duration::from_secs(1);
    let guard = rt.lock(key).lease(lease).held("acquire").await;
    let every = Duration::from_millis(100);
    while_held(&guard, period, every, |at| async move {
        assert_ttl_within_lease(server.pttl(&lock_key(key)).await, lease, at);
        if let Some(other) = other {
            let lock = other.lock(key).wait(Duration::ZERO);
            lock.times_out("another runtime while the watchdog renews")
                .await;
        }
    })
    .await;
    let what = format!("release after {period:?} on a {lease:?} lease");
    guard
        .release()
        .await
        .unwrap_or_else(|e| panic!("{what}: {e:?}"));
    assert!(
        !server.exists(&lock_key(key)).await,
        "{key:?} after the release"
    );
}

/// Generates `mod on_memory` and `mod on_redis`, each with one
/// `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]` per named
/// `async fn name(b: Backend)` of the calling file.
#[macro_export]
macro_rules! on_both_backends {
    ($($test:ident),+ $(,)?) => {
        mod on_memory {
            $(
                #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test($crate::Backend::memory().await).await;
                }
            )+
        }
        mod on_redis {
            $(
                #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test($crate::Backend::redis().await).await;
                }
            )+
        }
    };
}

/// Polls `check` every 5 ms until it returns true; panics naming `what` if that takes longer than
/// `within`. Returns how long it took.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "{what}: not true within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// GET `counter`, sleep 1 ms, SET it to the value + 1: loses updates unless the callers are
/// mutually excluded (the counters of the exclusion tests and of `dlock-holder`).
pub async fn racy_increment(
    counter: &str,
    conn: &mut redis::aio::MultiplexedConnection,
) -> redis::RedisResult<()> {
    let value: Option<u64> = redis::cmd("GET").arg(counter).query_async(conn).await?;
    tokio::time::sleep(Duration::from_millis(1)).await;
    redis::cmd("SET")
        .arg(counter)
        .arg(value.unwrap_or(0) + 1)
        .query_async(conn)
        .await
}

/// A small xorshift generator: reproducible from the seed it prints, no dependency.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded from the clock; the seed is printed so a failing run can be replayed.
    pub fn from_clock() -> Rng {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9e37_79b9_7f4a_7c15);
        Rng::seeded(nanos)
    }

    /// A fixed seed.
    pub fn seeded(seed: u64) -> Rng {
        println!("rng seed: {seed}");
        Rng(seed | 1)
    }

    /// The next value in `0..bound` (`bound > 0`).
    pub fn below(&mut self, bound: u64) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x % bound
    }
}

/// Asserts `elapsed` lies in `[min, max]`, naming `what`.
#[track_caller]
pub fn assert_between(what: &str, elapsed: Duration, min: Duration, max: Duration) {
    assert!(
        elapsed >= min && elapsed <= max,
        "{what}: took {elapsed:?}, expected between {min:?} and {max:?}"
    );
}

/// Sets a flag when dropped: tells whether a body future was dropped (cancelled).
pub struct SetOnDrop(pub Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A `with_lock` body that would run for a minute, recording whether it completed and whether
/// it was dropped.
#[derive(Default)]
pub struct LongBody {
    completed: Arc<AtomicBool>,
    dropped: Arc<AtomicBool>,
}

impl LongBody {
    /// The body: tells `held` it runs, then sleeps 60 s and marks itself completed.
    pub fn run(
        &self,
        held: Option<tokio::sync::oneshot::Sender<()>>,
    ) -> impl Future<Output = ()> + Send + use<> {
        let (completed, flag) = (self.completed.clone(), SetOnDrop(self.dropped.clone()));
        async move {
            let _flag = flag;
            if let Some(held) = held {
                held.send(()).expect("the test waits");
            }
            tokio::time::sleep(Duration::from_secs(60)).await;
            completed.store(true, Ordering::SeqCst);
        }
    }

    /// Runs the body under `lock` (`with_lock`) in a task of its own; returns the task and a
    /// receiver told once the body runs.
    pub fn spawn(
        &self,
        lock: dlock_runtime::LockBuilder,
    ) -> (
        tokio::task::JoinHandle<Result<(), LockError>>,
        tokio::sync::oneshot::Receiver<()>,
    ) {
        let (held_tx, held_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(dlock_runtime::with_lock(lock, self.run(Some(held_tx))));
        (task, held_rx)
    }

    /// Asserts `with_lock` returned `Err(Lost)` naming `key`, having dropped the body before
    /// its end; the failure names `what`.
    #[track_caller]
    pub fn assert_cancelled_with_lost(&self, what: &str, key: &str, out: Result<(), LockError>) {
        match out {
            Err(LockError::Lost { key: k, .. }) => assert_eq!(k, key, "{what}: the lost key"),
            other => panic!("{what}: expected Err(Lost), got {other:?}"),
        }
        assert!(
            self.dropped.load(Ordering::SeqCst),
            "{what}: the body must be dropped"
        );
        assert!(
            !self.completed.load(Ordering::SeqCst),
            "{what}: the body ran to its end"
        );
    }
}
