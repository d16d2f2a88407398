//! Fair locks (`fair(true)`): waiters from several processes acquire in the order they started
//! waiting, hand-off within a process included; a waiter that died, or gave up, does not block
//! the line. Memory, etcd and ZooKeeper are FIFO by themselves, Redis and Redis Cluster keep a
//! line of waiters for fair locks, and Redlock refuses them with `InvalidConfig`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock_runtime::testing::redis_fair_names;
use dlock_runtime::{DEFAULT_PREFIX, FAIR_PLACE, LockBuilder};
use dlock_tests::{AcquireExt, LockError, LockGuard, Runtime, eventually, finish_within};
use tokio::task::JoinHandle;

use crate::fixture::{Engine, Fixture};
use crate::support::LONG_LEASE;

/// Bound on waiters taking their place in line.
const QUEUED_WITHIN: Duration = Duration::from_secs(10);

/// How long every waiter below may wait, unless it is meant to give up.
const WAIT: Duration = Duration::from_secs(60);

/// Starts the engine's servers for a test of fair locks on `key`. On Redlock, which refuses
/// fair locks, checks instead that a fair lock is refused at acquire time, naming the reason,
/// and returns `None`.
async fn start_unless_redlock(engine: Engine, key: &str) -> Option<Fixture> {
    let fixture = Fixture::start(engine).await;
    if engine != Engine::Redlock {
        return Some(fixture);
    }
    let err = fixture
        .runtime()
        .await
        .lock(key)
        .fair(true)
        .refused("Redlock: a fair lock")
        .await;
    assert!(err.is_invalid_config(), "Redlock: {err:?}");
    assert!(
        err.to_string().contains("fair locks are not available"),
        "Redlock: {err}"
    );
    None
}

/// A fair lock of `key` on `rt` with `lease`.
fn fair_lock(rt: &Runtime, key: &str, lease: Duration) -> LockBuilder {
    rt.lock(key).fair(true).lease(lease)
}

/// `rt` holds `key` as a fair lock with [`LONG_LEASE`].
async fn fair_holder(rt: &Runtime, key: &str) -> LockGuard {
    fair_lock(rt, key, LONG_LEASE).held("the holder").await
}

/// A fair waiter of `key` on `rt` in a task of its own (wait [`WAIT`]): once it holds the key
/// it releases it and returns when it acquired; the task panics naming `who` if it does not
/// get the key.
fn timed_waiter(
    rt: Runtime,
    key: &'static str,
    lease: Duration,
    who: String,
) -> JoinHandle<Instant> {
    tokio::spawn(async move {
        let guard = fair_lock(&rt, key, lease).wait(WAIT).held(&who).await;
        let at = Instant::now();
        guard.release().await.expect("release");
        at
    })
}

/// Releases `holder`, then returns how long after the release `waiter` (from
/// [`timed_waiter`]) acquired; panics naming `who` unless it did within 30 s.
async fn acquired_after_release(
    holder: LockGuard,
    waiter: JoinHandle<Instant>,
    who: &str,
) -> Duration {
    let released = Instant::now();
    holder.release().await.expect("release");
    let acquired = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .unwrap_or_else(|_| panic!("{who} is blocked"))
        .unwrap_or_else(|e| panic!("{who}: {e}"));
    acquired.saturating_duration_since(released)
}

/// Waits until `n` waiters of `key` have taken their place in line: the length of the line in
/// Redis, the contenders queued in etcd and ZooKeeper; on memory (one runtime, its FIFO queue)
/// a moment for the waiter task to reach the queue.
async fn queued(fixture: &Fixture, key: &str, n: usize) {
    match fixture.engine {
        Engine::Memory => tokio::time::sleep(Duration::from_millis(100)).await,
        Engine::Redis | Engine::Cluster => {
            let [line, _] = redis_fair_names(DEFAULT_PREFIX, key);
            let node = fixture.redis_nodes()[0];
            let what = format!("{:?}: {n} waiters in the line of {key:?}", fixture.engine);
            eventually(QUEUED_WITHIN, &what, || async {
                let len: usize = node.query(redis::cmd("LLEN").arg(&line)).await;
                len >= n
            })
            .await;
        }
        Engine::Etcd | Engine::ZooKeeper => fixture.wait_for_waiters(key, n, QUEUED_WITHIN).await,
        Engine::Redlock => unreachable!("no line on Redlock"),
    }
}

/// A holder, then five waiters started one after the other, each once the previous one is in
/// line: on runtimes 1, 0 (the holder's), 2, 0 and 3 (on memory, all on its one runtime). Each
/// holds for 20 ms. They acquire in exactly the order they queued, the holder's own runtime
/// not jumping the line (no hand-off out of turn).
pub(crate) async fn fair_waiters_acquire_in_the_order_they_queued(engine: Engine) {
    let key = "conformance:fair:order";
    let Some(fixture) = start_unless_redlock(engine, key).await else {
        return;
    };
    let runtimes = fixture.runtimes(4).await;
    let holder = fair_holder(&runtimes[0], key).await;
    let plan = [1, 0, 2, 0, 3];
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for (place, &rt) in plan.iter().enumerate() {
        let (rt, order): (Runtime, _) = (runtimes[rt].clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let guard = fair_lock(&rt, key, LONG_LEASE)
                .wait(WAIT)
                .held(&format!("{engine:?}: waiter {place}"))
                .await;
            order.lock().expect("order").push(place);
            tokio::time::sleep(Duration::from_millis(20)).await;
            guard.release().await.expect("release");
        }));
        queued(&fixture, key, place + 1).await;
    }
    holder.release().await.expect("release");
    finish_within(waiters, Duration::from_secs(60)).await;
    let order = order.lock().expect("order").clone();
    assert_eq!(
        order,
        (0..plan.len()).collect::<Vec<_>>(),
        "{engine:?}: acquired in another order than queued"
    );
}

/// A holder; a waiter (lease 1 s, so its place lasts 1 s past its last heartbeat; 2 s on etcd
/// and ZooKeeper) that dies in line (its task aborted and its runtime dropped; a process killed
/// in line is in `tests/fair.rs`); a second waiter behind it. When the holder releases, the second waiter
/// acquires within the dead one's place plus a margin, not after its own wait of 60 s.
pub(crate) async fn a_dead_waiter_does_not_block_the_line(engine: Engine) {
    let key = "conformance:fair:dead";
    let Some(fixture) = start_unless_redlock(engine, key).await else {
        return;
    };
    let lease = fixture.params().short_lease;
    let place = lease.clamp(Duration::from_millis(500), FAIR_PLACE);
    let [holder_rt, live_rt, dead_rt] = fixture.each_runtime().await;
    let holder = fair_holder(&holder_rt, key).await;
    let dead = tokio::spawn(async move {
        let got = fair_lock(&dead_rt, key, lease).wait(WAIT).acquire().await;
        panic!("the dead waiter got {got:?}");
    });
    queued(&fixture, key, 1).await;
    let live = timed_waiter(live_rt, key, lease, format!("{engine:?}: the live waiter"));
    queued(&fixture, key, 2).await;
    dead.abort();
    assert!(dead.await.is_err_and(|e| e.is_cancelled()));
    let who = format!("{engine:?}: the live waiter (behind the dead one)");
    let took = acquired_after_release(holder, live, &who).await;
    println!("{engine:?}: the live waiter acquired {took:?} after the release (place {place:?})");
    assert!(
        took <= place + Duration::from_millis(1500),
        "{engine:?}: the live waiter acquired {took:?} after the release; the dead waiter's \
         place lasts {place:?}"
    );
}

/// A holder; a waiter with a 500 ms wait, then one with a 60 s wait behind it. The first gives
/// up (`Timeout`) and leaves the line: when the holder releases right after, the second gets
/// the lock at once (within the engine's wake-up bound), not when the first one's place would
/// have run out.
pub(crate) async fn a_waiter_that_gives_up_leaves_the_line(engine: Engine) {
    let key = "conformance:fair:gives-up";
    let Some(fixture) = start_unless_redlock(engine, key).await else {
        return;
    };
    let [holder_rt, impatient_rt, patient_rt] = fixture.each_runtime().await;
    let holder = fair_holder(&holder_rt, key).await;
    let impatient = fair_lock(&impatient_rt, key, LONG_LEASE)
        .wait(Duration::from_millis(500))
        .spawn();
    queued(&fixture, key, 1).await;
    let who = format!("{engine:?}: the patient waiter");
    let patient = timed_waiter(patient_rt, key, LONG_LEASE, who.clone());
    queued(&fixture, key, 2).await;
    let (gave_up, _) = impatient.await.expect("impatient waiter");
    assert!(
        matches!(gave_up, Err(LockError::Timeout { .. })),
        "{engine:?}: {gave_up:?}"
    );
    let took = acquired_after_release(holder, patient, &who).await;
    let bound = fixture.params().wake_within + Duration::from_millis(300);
    assert!(
        took <= bound,
        "{engine:?}: the patient waiter acquired {took:?} after the release (bound {bound:?})"
    );
}
