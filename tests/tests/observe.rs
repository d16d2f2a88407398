//! Lock events (`Runtime::events`) when a receiver is slow or the engine stops answering. The
//! events of a lock's whole life on every engine are in the conformance suite (`events`);
//! tracing and metrics each have a test binary of their own (`tracing.rs`, `metrics.rs`: one
//! global subscriber or recorder each).

use std::time::Duration;

use dlock_runtime::{EVENT_BUFFER, LockEvent, Runtime};
use dlock_testkit::RedisServer;
use dlock_tests::{AcquireExt, runtime_with_timeout};
use tokio::sync::broadcast::error::RecvError;

/// A receiver that never reads does not hold locking up: thousands of acquisitions go through
/// while it sleeps, and its next `recv` says exactly how many events it lost (all but the last
/// [`EVENT_BUFFER`]), then hands it the ones kept, oldest first.
#[tokio::test]
async fn a_receiver_that_never_reads_does_not_block_locking_and_is_told_how_many_it_lost() {
    let rt = Runtime::from_url("memory://")
        .await
        .expect("memory runtime");
    let mut stalled = rt.events();
    let pairs = 3 * EVENT_BUFFER;
    tokio::time::timeout(Duration::from_secs(30), async {
        for _ in 0..pairs {
            rt.lock("events:lagging").cycled("a pair").await;
        }
    })
    .await
    .expect("locking went on with a receiver that never reads");
    let sent = 2 * pairs; // Acquired + Released each
    match stalled.recv().await {
        Err(RecvError::Lagged(lost)) => assert_eq!(lost, (sent - EVENT_BUFFER) as u64),
        other => panic!("expected Lagged, got {other:?}"),
    }
    let mut kept = 0;
    while let Ok(event) = stalled.try_recv() {
        let expected = if kept % 2 == 0 {
            "Acquired"
        } else {
            "Released"
        };
        assert!(
            format!("{event:?}").starts_with(expected),
            "event {kept} kept: {event:?}"
        );
        kept += 1;
    }
    assert_eq!(kept, EVENT_BUFFER, "the events kept after the lag");
}

/// A server that stops answering (SIGSTOP) while a lock is held: the receiver sees
/// `RenewalFailed` with the engine's error (which never carries the URL's password), then
/// `Lost` within the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_answering_shows_as_renewal_failures_then_the_loss() {
    let password = "events-secret-pw";
    let mut server = RedisServer::start_with_password(password);
    let rt = runtime_with_timeout(&server, Duration::from_millis(200)).await;
    let mut events = rt.events();
    let lease = Duration::from_millis(1500);
    let guard = rt.lock("events:paused").lease(lease).held("acquire").await;
    server.pause();
    let mut failures = Vec::new();
    let lost = tokio::time::timeout(lease + Duration::from_secs(2), async {
        loop {
            match events.recv().await.expect("recv") {
                LockEvent::RenewalFailed { key, error, .. } => {
                    assert_eq!(key, "events:paused");
                    failures.push(error);
                }
                LockEvent::Lost { key, .. } => return key,
                _ => {}
            }
        }
    })
    .await;
    server.resume();
    assert_eq!(lost.expect("Lost within the lease"), "events:paused");
    assert!(!failures.is_empty(), "no RenewalFailed before the loss");
    for error in &failures {
        assert!(!error.is_empty());
        assert!(!error.contains(password), "a secret in {error:?}");
    }
    assert!(guard.is_lost());
}
