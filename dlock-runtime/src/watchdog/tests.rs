//! Unit tests of the watchdog, on the memory engine with tokio's paused clock.

use super::*;
use crate::backend::memory::MemoryBackend;
use crate::backend::{AnyBackend, Attempt, Backend, DynBackend, EngineResult};

async fn setup() -> (Arc<Watchdog>, Arc<AnyBackend>) {
    started(DynBackend::new_arc(MemoryBackend::new()))
}

/// A watchdog running over `backend`.
fn started(backend: Arc<AnyBackend>) -> (Arc<Watchdog>, Arc<AnyBackend>) {
    let wd = Arc::new(Watchdog::new(Arc::new(Observer::new("memory"))));
    tokio::spawn(wd.clone().run(Arc::downgrade(&backend), 512));
    (wd, backend)
}

/// A watchdog over a memory engine that counts its renewal calls (and fails them when told).
fn counting_setup() -> (Arc<Watchdog>, Arc<AnyBackend>, Arc<Counting>) {
    let counting = Arc::new(Counting {
        inner: MemoryBackend::new(),
        calls: Default::default(),
        fail: AtomicBool::new(false),
    });
    let (wd, backend) = started(DynBackend::from_arc(counting.clone()));
    (wd, backend, counting)
}

#[tokio::test(start_paused = true)]
async fn renews_every_third_of_the_lease_and_keeps_the_lock() {
    let (wd, backend) = setup().await;
    let lease = Duration::from_secs(3);
    let sent = Instant::now();
    backend.try_acquire("k", "a", lease).await.ok();
    let (_id, lost) = wd.register("k", "a", lease, Duration::ZERO, true, sent, None);
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(!lost.is_lost());
    let busy = backend.try_acquire("k", "b", lease).await.ok();
    assert!(matches!(busy, Some(Attempt::Busy { .. })), "{busy:?}");
}

#[tokio::test(start_paused = true)]
async fn hard_cap_fires_lost_at_the_lease() {
    let (wd, backend) = setup().await;
    let lease = Duration::from_secs(2);
    let sent = Instant::now();
    backend.try_acquire("k", "a", lease).await.ok();
    let (_id, lost) = wd.register("k", "a", lease, Duration::ZERO, false, sent, None);
    tokio::time::sleep(Duration::from_millis(1990)).await;
    assert!(!lost.is_lost());
    tokio::time::timeout(Duration::from_millis(20), lost.wait())
        .await
        .expect("lost resolves at the lease");
}

#[tokio::test(start_paused = true)]
async fn deleted_lock_is_lost_within_a_renewal_interval() {
    let (wd, backend) = setup().await;
    let lease = Duration::from_secs(3);
    let sent = Instant::now();
    backend.try_acquire("k", "a", lease).await.ok();
    let (_id, lost) = wd.register("k", "a", lease, Duration::ZERO, true, sent, None);
    backend.force_unlock("k").await.ok();
    tokio::time::timeout(lease / 3 + Duration::from_millis(10), lost.wait())
        .await
        .expect("lost within lease/3");
}

/// Counts renewal calls; with `fail` set, every renewal errors (engine unreachable).
struct Counting {
    inner: MemoryBackend,
    calls: std::sync::atomic::AtomicUsize,
    fail: AtomicBool,
}

impl Backend for Counting {
    async fn try_acquire(&self, key: &str, owner: &str, lease: Duration) -> EngineResult<Attempt> {
        Backend::try_acquire(&self.inner, key, owner, lease).await
    }

    async fn renew(&self, batch: &[Renewal]) -> Result<Vec<Option<bool>>, crate::LockError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.fail.load(Ordering::SeqCst) {
            return Err(crate::LockError::backend(None, "unreachable", None));
        }
        Backend::renew(&self.inner, batch).await
    }

    async fn release(
        &self,
        key: &str,
        owner: &str,
    ) -> Result<crate::backend::Released, crate::LockError> {
        Backend::release(&self.inner, key, owner).await
    }

    async fn release_after(
        &self,
        key: &str,
        owner: &str,
        hold: Duration,
    ) -> Result<crate::backend::Released, crate::LockError> {
        Backend::release_after(&self.inner, key, owner, hold).await
    }

    async fn force_unlock(&self, key: &str) -> Result<bool, crate::LockError> {
        Backend::force_unlock(&self.inner, key).await
    }

    async fn is_locked(&self, key: &str) -> Result<bool, crate::LockError> {
        Backend::is_locked(&self.inner, key).await
    }

    async fn inspect(&self, key: &str) -> Result<Option<crate::LockInfo>, crate::LockError> {
        Backend::inspect(&self.inner, key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<crate::LockInfo>, crate::LockError> {
        Backend::list(&self.inner, prefix).await
    }
}

#[tokio::test(start_paused = true)]
async fn batches_locks_due_together() {
    let (wd, backend, counting) = counting_setup();
    let lease = Duration::from_secs(3);
    // 1,000 locks acquired evenly over one second (one every millisecond).
    let mut lost = Vec::new();
    for i in 0..1000 {
        let key = format!("k{i}");
        backend.try_acquire(&key, "a", lease).await.ok();
        lost.push(
            wd.register(&key, "a", lease, Duration::ZERO, true, Instant::now(), None)
                .1,
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let before = counting.calls.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let calls = counting.calls.load(Ordering::SeqCst) - before;
    // One lock at a time would be 1,000 locks x 10 renewals; the coalescing window
    // (lease/12) allows at most about 4 calls per renewal interval (1 s).
    assert!(calls <= 50, "{calls} renewal calls in 10 s for 1,000 locks");
    assert!(
        calls >= 10,
        "{calls}: locks must still be renewed every interval"
    );
    assert!(lost.iter().all(|l| !l.is_lost()));
    for i in 0..1000 {
        let busy = backend.try_acquire(&format!("k{i}"), "b", lease).await.ok();
        assert!(matches!(busy, Some(Attempt::Busy { .. })), "k{i} expired");
    }
}

#[tokio::test(start_paused = true)]
async fn unreachable_engine_is_lost_when_the_lease_runs_out_not_before() {
    let (wd, backend, failing) = counting_setup();
    let lease = Duration::from_secs(3);
    backend.try_acquire("k", "a", lease).await.ok();
    let (_id, lost) = wd.register("k", "a", lease, Duration::ZERO, true, Instant::now(), None);
    // First renewal (at 1 s) succeeds: the lease is confirmed until about 4 s.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    failing.fail.store(true, Ordering::SeqCst);
    // Failed renewals are retried, not a loss, while the confirmed lease lasts.
    tokio::time::sleep(Duration::from_millis(2800)).await;
    assert!(
        !lost.is_lost(),
        "a transient renewal error alone is not a loss"
    );
    assert!(
        failing.calls.load(Ordering::SeqCst) > 3,
        "failed renewals are retried"
    );
    tokio::time::timeout(Duration::from_millis(200), lost.wait())
        .await
        .expect("lost when the last confirmed lease runs out");
}

/// Locks taken and released in a row do not wake the scheduler each time: once nothing is
/// tracked it keeps the look it had planned, and a lock due after that look needs no wake-up.
/// A lock due sooner still wakes it.
#[tokio::test(start_paused = true)]
async fn a_lock_due_after_the_planned_look_does_not_wake_the_scheduler() {
    let wd = Watchdog::new(Arc::new(Observer::new("memory")));
    let lease = Duration::from_secs(30);
    let (first, _) = wd.register("k", "a", lease, Duration::ZERO, true, Instant::now(), None);
    let planned = wd.collect(Instant::now()).next.expect("a look planned");
    // The scheduler took the wake-up of the first registration.
    wd.wake.notified().await;
    wd.unregister(first);
    let empty = wd.collect(Instant::now());
    assert_eq!(empty.next, Some(planned), "the planned look is kept");
    tokio::time::advance(Duration::from_millis(10)).await;
    let (second, _) = wd.register("k", "a", lease, Duration::ZERO, true, Instant::now(), None);
    let woken = tokio::time::timeout(Duration::from_millis(1), wd.wake.notified()).await;
    assert!(
        woken.is_err(),
        "a lock due after the planned look woke the scheduler"
    );
    wd.unregister(second);
    let shorter = Duration::from_secs(3);
    wd.register(
        "k",
        "b",
        shorter,
        Duration::ZERO,
        true,
        Instant::now(),
        None,
    );
    let woken = tokio::time::timeout(Duration::from_millis(1), wd.wake.notified()).await;
    assert!(woken.is_ok(), "a lock due sooner must wake the scheduler");
    // Once the planned look has passed with nothing tracked, the scheduler sleeps until woken.
    let idle = Watchdog::new(Arc::new(Observer::new("memory")));
    let (id, _) = idle.register(
        "k",
        "a",
        shorter,
        Duration::ZERO,
        true,
        Instant::now(),
        None,
    );
    idle.collect(Instant::now());
    idle.unregister(id);
    tokio::time::advance(2 * shorter).await;
    assert_eq!(idle.collect(Instant::now()).next, None);
}
