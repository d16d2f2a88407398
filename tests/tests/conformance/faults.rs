//! The engine itself going down while a lock is held, and coming back: real faults (kill -9,
//! restart) on every engine with a server.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock_runtime::with_lock;

use crate::fixture::{Engine, Fixture};
use dlock_tests::LongBody;

/// How many waiters queue for the key before the engine goes down.
const WAITERS: usize = 3;

/// The waiters' budget: the holder's loss, the engine down and restarting, and on Redlock the
/// restarted nodes' rejoin delay (the longest lease), with room to spare.
const WAIT: Duration = Duration::from_secs(40);

/// The engine killed (kill -9) while a `with_lock` body runs: nothing can confirm a renewal,
/// so the body is dropped before its end and the call returns `Err(Lost)` for the key within
/// the engine's bound (`Params::lost_within`: the lease, on ZooKeeper the negotiated session,
/// plus slack). Waiters that queued before the kill, each on a runtime of its own, keep trying
/// within their budget; once the engine is restarted every one of them gets the key, one at a
/// time.
pub(crate) async fn engine_down_while_held_is_lost_and_waiters_acquire_after_restart(
    engine: Engine,
) {
    let mut fixture = Fixture::start_for_faults(engine).await;
    let params = fixture.params();
    let (lease, bound) = (params.down_lease, params.lost_within);
    let key = "conformance:faults:engine-down";
    let holder = fixture.runtime().await;
    let long_body = LongBody::default();
    let (body, held_rx) = long_body.spawn(holder.lock(key).lease(lease));
    held_rx.await.expect("the holder's body runs");

    let inside = Arc::new(AtomicUsize::new(0));
    let served = Arc::new(Mutex::new(Vec::new()));
    let waiters: Vec<_> = fixture
        .runtimes(WAITERS)
        .await
        .into_iter()
        .enumerate()
        .map(|(i, rt)| {
            let (inside, served) = (inside.clone(), served.clone());
            tokio::spawn(async move {
                let lock = rt.lock(key).lease(lease).wait(WAIT);
                let out = with_lock(lock, async {
                    assert_eq!(
                        inside.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two waiters inside"
                    );
                    served.lock().expect("list").push(i);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                })
                .await;
                (i, out)
            })
        })
        .collect();
    fixture
        .wait_for_waiters(key, WAITERS, Duration::from_secs(10))
        .await;
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "{engine:?}: a waiter got a held key"
    );

    fixture.kill_engine(key).await;
    let killed = Instant::now();
    let outcome = tokio::time::timeout(bound + Duration::from_secs(10), body)
        .await
        .unwrap_or_else(|_| panic!("{engine:?}: the body must end once nothing confirms the lock"))
        .expect("the holder task");
    let lost_after = killed.elapsed();
    println!("{engine:?} killed: the holder's with_lock returned {outcome:?} after {lost_after:?}");
    long_body.assert_cancelled_with_lost(&format!("{engine:?}"), key, outcome);
    assert!(
        lost_after <= bound,
        "{engine:?}: Lost {lost_after:?} after the kill, later than {bound:?}"
    );

    // The engine stays down a while (the waiters' attempts fail meanwhile), then comes back.
    tokio::time::sleep(Duration::from_secs(1)).await;
    fixture.restart_engine();
    let restarted = Instant::now();
    for waiter in waiters {
        let (i, out) = tokio::time::timeout(WAIT, waiter)
            .await
            .unwrap_or_else(|_| panic!("{engine:?}: a waiter must finish within its budget"))
            .expect("the waiter task");
        assert!(
            out.is_ok(),
            "{engine:?}: waiter {i} after the restart: {out:?}"
        );
    }
    let served = served.lock().expect("list").clone();
    println!(
        "{engine:?}: every waiter held the key within {:?} of the restart, in order {served:?}",
        restarted.elapsed()
    );
    assert_eq!(
        served.len(),
        WAITERS,
        "{engine:?}: every waiter served once"
    );
}
