//! Lock events (`Runtime::events`): what a receiver sees of one lock's life on each engine:
//! acquired (with the guard's fence), renewed by the watchdog, released (with the hold time),
//! another runtime's wait that timed out, and a loss.

use std::time::{Duration, Instant};

use dlock_runtime::LockEvent;
use dlock_tests::{AcquireExt, HoldExt};
use tokio::sync::broadcast::Receiver;

use crate::fixture::{Engine, Fixture};

/// Bound on one expected event: generous, the engine's renewals come every third of a lease.
const WITHIN: Duration = Duration::from_secs(5);

/// The next event of `events` that is not a renewal (renewals may come at any time), within
/// [`WITHIN`].
async fn next_not_renewal(
    engine: Engine,
    events: &mut Receiver<LockEvent>,
    what: &str,
) -> LockEvent {
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let event = tokio::time::timeout_at(deadline, events.recv())
            .await
            .unwrap_or_else(|_| panic!("{engine:?}: no event within {WITHIN:?}, expected {what}"))
            .unwrap_or_else(|e| panic!("{engine:?}: receiving {what}: {e}"));
        if !matches!(event, LockEvent::Renewed { .. }) {
            return event;
        }
    }
}

/// One runtime's receiver sees `Acquired` with the guard's fence and a short wait, at least one
/// `Renewed` while the lock is held past a third of its lease, and `Released` with a hold time
/// at least as long as the hold; another runtime's receiver sees its `Timeout` with the wait it
/// gave up after; a lock deleted behind its holder's back is `Lost`, then `Released` when its
/// guard goes. Every event names the user's key.
pub(crate) async fn events_tell_acquired_renewed_timeout_lost_and_released(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let params = fixture.params();
    let [rt, other] = fixture.each_runtime().await;
    let (mut events, mut other_events) = (rt.events(), other.events());
    let key = "conformance:events:one";

    let guard = rt.lock(key).lease(params.short_lease).held("acquire").await;
    let acquired_at = Instant::now();
    match next_not_renewal(engine, &mut events, "Acquired").await {
        LockEvent::Acquired {
            key: k,
            fence,
            waited,
            ..
        } => {
            assert_eq!(k, key, "{engine:?}");
            assert_eq!(fence, guard.fence(), "{engine:?}: the event's fence");
            assert!(
                waited < WITHIN,
                "{engine:?}: waited {waited:?} for a free key"
            );
        }
        other => panic!("{engine:?}: expected Acquired, got {other:?}"),
    }

    // Renewals every third of the (effective) lease: one within a lease.
    let renewed = tokio::time::timeout(params.short_lease + Duration::from_secs(2), events.recv())
        .await
        .unwrap_or_else(|_| panic!("{engine:?}: no Renewed within a lease of holding"));
    let renewed = match renewed {
        Ok(LockEvent::Renewed { key: k, .. }) => k,
        other => panic!("{engine:?}: expected Renewed, got {other:?}"),
    };
    assert_eq!(renewed, key, "{engine:?}");

    let wait = Duration::from_millis(300);
    other
        .lock(key)
        .wait(wait)
        .times_out("a wait on the held key")
        .await;
    // On the memory engine both runtimes are one: skip the holder's own events there.
    loop {
        match next_not_renewal(engine, &mut other_events, "Timeout").await {
            LockEvent::Timeout { key: k, waited, .. } => {
                assert_eq!(k, key, "{engine:?}");
                assert!(waited >= wait, "{engine:?}: Timeout after {waited:?}");
                break;
            }
            LockEvent::Acquired { .. } if engine == Engine::Memory => {}
            other => panic!("{engine:?}: expected Timeout, got {other:?}"),
        }
    }

    let hold = acquired_at.elapsed();
    guard.release().await.expect("release");
    loop {
        match next_not_renewal(engine, &mut events, "Released").await {
            LockEvent::Released { key: k, held, .. } => {
                assert_eq!(k, key, "{engine:?}");
                assert!(
                    held >= hold,
                    "{engine:?}: held {held:?}, the test held {hold:?}"
                );
                break;
            }
            LockEvent::Timeout { .. } if engine == Engine::Memory => {}
            other => panic!("{engine:?}: expected Released, got {other:?}"),
        }
    }

    // A loss: the lock deleted behind the holder's back is seen at the next renewal.
    let key = "conformance:events:lost";
    let guard = rt.hold(key, Duration::from_secs(6)).await;
    assert!(matches!(
        next_not_renewal(engine, &mut events, "Acquired").await,
        LockEvent::Acquired { .. }
    ));
    fixture.delete_lock(key).await;
    match next_not_renewal(engine, &mut events, "Lost").await {
        LockEvent::Lost { key: k, .. } => assert_eq!(k, key, "{engine:?}"),
        other => panic!("{engine:?}: expected Lost, got {other:?}"),
    }
    drop(guard);
    match next_not_renewal(engine, &mut events, "Released").await {
        LockEvent::Released { key: k, .. } => assert_eq!(k, key, "{engine:?}"),
        other => panic!("{engine:?}: expected Released after Lost, got {other:?}"),
    }
}
