use super::*;

const LEASE: Duration = Duration::from_secs(10);

#[tokio::test(start_paused = true)]
async fn lease_expires_on_the_tokio_clock() {
    let m = MemoryBackend::new();
    assert!(matches!(
        m.acquire_now("k", "a", LEASE),
        Attempt::Acquired { .. }
    ));
    tokio::time::advance(Duration::from_secs(4)).await;
    assert_eq!(
        m.acquire_now("k", "b", LEASE),
        Attempt::Busy {
            ttl: Some(Duration::from_secs(6))
        }
    );
    tokio::time::advance(Duration::from_secs(6)).await;
    assert!(matches!(
        m.acquire_now("k", "b", LEASE),
        Attempt::Acquired { .. }
    ));
    assert_eq!(m.release_now("k", "a"), Released::NotOwner);
}

#[tokio::test(start_paused = true)]
async fn reentry_counts_holds_and_keeps_the_fence() {
    let m = MemoryBackend::new();
    let Attempt::Acquired { fence: f1 } = m.acquire_now("k", "a", LEASE) else {
        panic!("first acquire must succeed");
    };
    assert_eq!(
        m.acquire_now("k", "a", LEASE),
        Attempt::Acquired { fence: f1 }
    );
    assert_eq!(m.release_now("k", "a"), Released::StillHeld);
    assert_eq!(m.release_now("k", "a"), Released::Freed);
    let Attempt::Acquired { fence: f2 } = m.acquire_now("k", "b", LEASE) else {
        panic!("free key must be acquired");
    };
    assert!(f2 > f1);
}

#[tokio::test(start_paused = true)]
async fn a_kept_key_expires_when_its_hold_ends() {
    let m = MemoryBackend::new();
    m.acquire_now("k", "a", LEASE);
    let hold = Duration::from_secs(3);
    assert_eq!(m.release_after_now("k", "z", hold), Released::NotOwner);
    assert_eq!(m.release_after_now("k", "a", hold), Released::Kept);
    tokio::time::advance(Duration::from_millis(2999)).await;
    assert!(matches!(
        m.acquire_now("k", "b", LEASE),
        Attempt::Busy { .. }
    ));
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(matches!(
        m.acquire_now("k", "b", LEASE),
        Attempt::Acquired { .. }
    ));
}

#[tokio::test(start_paused = true)]
async fn renew_is_owner_checked() {
    let m = MemoryBackend::new();
    m.acquire_now("k", "a", LEASE);
    let batch = [
        Renewal {
            key: "k".into(),
            owner: "a".into(),
            lease: LEASE,
        },
        Renewal {
            key: "k".into(),
            owner: "z".into(),
            lease: LEASE,
        },
    ];
    tokio::time::advance(Duration::from_secs(9)).await;
    assert_eq!(m.renew_now(&batch), vec![true, false]);
    tokio::time::advance(Duration::from_secs(9)).await;
    assert!(matches!(
        m.acquire_now("k", "b", LEASE),
        Attempt::Busy { .. }
    ));
}
