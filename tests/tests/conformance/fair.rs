//! Fair locks (`fair(true)`): waiters from several processes acquire in the order they started
//! waiting, hand-off within a process included; a waiter that died, or gave up, does not block
//! the line. Memory, etcd and ZooKeeper are FIFO by themselves, Redis and Redis Cluster keep a
//! line of waiters for fair locks, and Redlock refuses them with `InvalidConfig`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock_runtime::testing::redis_fair_names;
use dlock_runtime::{DEFAULT_PREFIX, FAIR_PLACE};
use dlock_tests::{AcquireExt, LockError, Runtime, eventually, finish_within};

use crate::fixture::{Engine, Fixture};
use crate::support::LONG_LEASE;

/// Bound on waiters taking their place in line.
const QUEUED_WITHIN: Duration = Duration::from_secs(10);

/// A fair lock on Redlock is refused at acquire time, naming the reason.
async fn refused_on_redlock(fixture: &Fixture, key: &str) {
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
    let fixture = Fixture::start(engine).await;
    let key = "conformance:fair:order";
    if engine == Engine::Redlock {
        return refused_on_redlock(&fixture, key).await;
    }
    let runtimes = fixture.runtimes(4).await;
    let holder = runtimes[0]
        .lock(key)
        .fair(true)
        .lease(LONG_LEASE)
        .held("the holder")
        .await;
    let plan = [1, 0, 2, 0, 3];
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for (place, &rt) in plan.iter().enumerate() {
        let (rt, order): (Runtime, _) = (runtimes[rt].clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let guard = rt
                .lock(key)
                .fair(true)
                .lease(LONG_LEASE)
                .wait(Duration::from_secs(60))
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
    let fixture = Fixture::start(engine).await;
    let key = "conformance:fair:dead";
    if engine == Engine::Redlock {
        return refused_on_redlock(&fixture, key).await;
    }
    let lease = fixture.params().short_lease;
    let place = lease.clamp(Duration::from_millis(500), FAIR_PLACE);
    let (holder_rt, live_rt) = (fixture.runtime().await, fixture.runtime().await);
    let holder = holder_rt
        .lock(key)
        .fair(true)
        .lease(LONG_LEASE)
        .held("the holder")
        .await;
    let dead = {
        let rt = fixture.runtime().await;
        tokio::spawn(async move {
            let got = rt
                .lock(key)
                .fair(true)
                .lease(lease)
                .wait(Duration::from_secs(60))
                .acquire()
                .await;
            panic!("the dead waiter got {got:?}");
        })
    };
    queued(&fixture, key, 1).await;
    let live = tokio::spawn(async move {
        let guard = live_rt
            .lock(key)
            .fair(true)
            .lease(lease)
            .wait(Duration::from_secs(60))
            .held(&format!("{engine:?}: the live waiter"))
            .await;
        let at = Instant::now();
        guard.release().await.expect("release");
        at
    });
    queued(&fixture, key, 2).await;
    dead.abort();
    assert!(dead.await.is_err_and(|e| e.is_cancelled()));
    let released = Instant::now();
    holder.release().await.expect("release");
    let acquired = tokio::time::timeout(Duration::from_secs(30), live)
        .await
        .unwrap_or_else(|_| panic!("{engine:?}: the live waiter is blocked by the dead one"))
        .expect("live waiter");
    let took = acquired.saturating_duration_since(released);
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
    let fixture = Fixture::start(engine).await;
    let key = "conformance:fair:gives-up";
    if engine == Engine::Redlock {
        return refused_on_redlock(&fixture, key).await;
    }
    let runtimes = fixture.runtimes(3).await;
    let holder = runtimes[0]
        .lock(key)
        .fair(true)
        .lease(LONG_LEASE)
        .held("the holder")
        .await;
    let impatient = {
        let rt = runtimes[1].clone();
        tokio::spawn(async move {
            rt.lock(key)
                .fair(true)
                .lease(LONG_LEASE)
                .wait(Duration::from_millis(500))
                .acquire()
                .await
        })
    };
    queued(&fixture, key, 1).await;
    let patient = {
        let rt = runtimes[2].clone();
        tokio::spawn(async move {
            let guard = rt
                .lock(key)
                .fair(true)
                .lease(LONG_LEASE)
                .wait(Duration::from_secs(60))
                .held(&format!("{engine:?}: the patient waiter"))
                .await;
            let at = Instant::now();
            guard.release().await.expect("release");
            at
        })
    };
    queued(&fixture, key, 2).await;
    let gave_up = impatient.await.expect("impatient waiter");
    assert!(
        matches!(gave_up, Err(LockError::Timeout { .. })),
        "{engine:?}: {gave_up:?}"
    );
    let released = Instant::now();
    holder.release().await.expect("release");
    let acquired = tokio::time::timeout(Duration::from_secs(30), patient)
        .await
        .unwrap_or_else(|_| panic!("{engine:?}: the patient waiter is blocked"))
        .expect("patient waiter");
    let took = acquired.saturating_duration_since(released);
    let bound = fixture.params().wake_within + Duration::from_millis(300);
    assert!(
        took <= bound,
        "{engine:?}: the patient waiter acquired {took:?} after the release (bound {bound:?})"
    );
}
