//! Acquisition shorthands: one line per expected outcome, the failure naming what was expected.

use std::future::Future;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dlock_runtime::{LockBuilder, LockError, LockGuard, Runtime, RuntimeBuilder, with_lock};
use tokio::task::JoinHandle;

/// Holding a key, in one call.
pub trait HoldExt {
    /// Acquires `key` with `lease` (default wait); panics naming both if that fails.
    fn hold(&self, key: &str, lease: Duration) -> impl Future<Output = LockGuard> + Send;
    /// Acquires `key` with `lease` as a hard cap (no watchdog: lost when the lease runs out);
    /// panics naming both if that fails.
    fn hold_capped(&self, key: &str, lease: Duration) -> impl Future<Output = LockGuard> + Send;
    /// Acquires `key` with `lease`, waiting up to `wait`; panics naming the key if that fails.
    fn hold_within(
        &self,
        key: &str,
        lease: Duration,
        wait: Duration,
    ) -> impl Future<Output = LockGuard> + Send;
}

impl HoldExt for Runtime {
    fn hold(&self, key: &str, lease: Duration) -> impl Future<Output = LockGuard> + Send {
        let (lock, what) = (self.lock(key).lease(lease), format!("hold {key:?}"));
        async move { lock.held(&what).await }
    }

    fn hold_capped(&self, key: &str, lease: Duration) -> impl Future<Output = LockGuard> + Send {
        let lock = self.lock(key).lease(lease).watchdog(false);
        let what = format!("hold {key:?} capped at {lease:?}");
        async move { lock.held(&what).await }
    }

    fn hold_within(
        &self,
        key: &str,
        lease: Duration,
        wait: Duration,
    ) -> impl Future<Output = LockGuard> + Send {
        let lock = self.lock(key).lease(lease).wait(wait);
        let what = format!("hold {key:?} waiting up to {wait:?}");
        async move { lock.held(&what).await }
    }
}

/// Building a runtime a test needs.
pub trait BuildExt {
    /// Builds the runtime; panics with the error if that fails.
    fn built(self) -> impl Future<Output = Runtime> + Send;
    /// Builds the runtime and returns the outcome, a runtime or an error; panics naming `what`
    /// if building gives neither within `within` (it must not hang).
    fn build_within(
        self,
        within: Duration,
        what: &str,
    ) -> impl Future<Output = Result<Runtime, LockError>> + Send;
}

impl BuildExt for RuntimeBuilder {
    async fn built(self) -> Runtime {
        self.build()
            .await
            .unwrap_or_else(|e| panic!("build a runtime: {e:?}"))
    }

    fn build_within(
        self,
        within: Duration,
        what: &str,
    ) -> impl Future<Output = Result<Runtime, LockError>> + Send {
        let what = format!("{what}: building hung for {within:?}");
        async move {
            tokio::time::timeout(within, self.build())
                .await
                .unwrap_or_else(|_| panic!("{what}"))
        }
    }
}

/// The outcomes a test expects of [`LockBuilder::acquire`].
pub trait AcquireExt {
    /// Acquires; panics with `what` and the error if that fails.
    fn held(self, what: &str) -> impl Future<Output = LockGuard> + Send;
    /// Expects the acquisition to fail and returns the error; panics with `what` if it succeeded
    /// (the guard is dropped).
    fn refused(self, what: &str) -> impl Future<Output = LockError> + Send;
    /// Expects `LockError::Timeout`; panics with `what` on success or any other error.
    fn times_out(self, what: &str) -> impl Future<Output = LockError> + Send;
    /// Expects `LockError::InvalidConfig`; panics with `what` on success or any other error.
    fn invalid_config(self, what: &str) -> impl Future<Output = LockError> + Send;
    /// Acquires and releases at once; panics with `what` and the error if either fails.
    fn cycled(self, what: &str) -> impl Future<Output = ()> + Send;
    /// Runs `with_lock` on this lock and a body that must never run; expects an error within
    /// `within` (no hang) and returns it with how long it took. Panics with `what` otherwise.
    fn body_refused(
        self,
        within: Duration,
        what: &str,
    ) -> impl Future<Output = (LockError, Duration)> + Send;
    /// Acquires in a spawned task (another owner); the task returns the outcome and when it
    /// came.
    fn spawn(self) -> JoinHandle<(Result<LockGuard, LockError>, Instant)>;
    /// Acquires, waiting up to 5 s past the end of `bounds`, and asserts it took a time within
    /// `bounds` from the call (e.g. after a holder was killed: about its lease); panics with
    /// `what` otherwise.
    fn held_between(
        self,
        bounds: RangeInclusive<Duration>,
        what: &str,
    ) -> impl Future<Output = LockGuard> + Send;
}

impl AcquireExt for LockBuilder {
    fn held(self, what: &str) -> impl Future<Output = LockGuard> + Send {
        let what = what.to_owned();
        async move {
            self.acquire()
                .await
                .unwrap_or_else(|e| panic!("{what}: {e:?}"))
        }
    }

    fn refused(self, what: &str) -> impl Future<Output = LockError> + Send {
        let what = what.to_owned();
        async move {
            match self.acquire().await {
                Ok(_guard) => panic!("{what}: acquired, expected an error"),
                Err(e) => e,
            }
        }
    }

    fn times_out(self, what: &str) -> impl Future<Output = LockError> + Send {
        let what = what.to_owned();
        async move {
            let err = self.refused(&what).await;
            assert!(err.is_timeout(), "{what}: expected Timeout, got {err:?}");
            err
        }
    }

    fn held_between(
        self,
        bounds: RangeInclusive<Duration>,
        what: &str,
    ) -> impl Future<Output = LockGuard> + Send {
        let what = what.to_owned();
        async move {
            let (min, max) = bounds.into_inner();
            let start = Instant::now();
            let guard = self.wait(max + Duration::from_secs(5)).held(&what).await;
            let took = start.elapsed();
            println!("{what}: acquired after {took:?}");
            crate::assert_between(&what, took, min, max);
            guard
        }
    }

    fn invalid_config(self, what: &str) -> impl Future<Output = LockError> + Send {
        let what = what.to_owned();
        async move {
            let err = self.refused(&what).await;
            assert!(
                err.is_invalid_config(),
                "{what}: expected InvalidConfig, got {err:?}"
            );
            err
        }
    }

    fn cycled(self, what: &str) -> impl Future<Output = ()> + Send {
        let what = what.to_owned();
        async move {
            let guard = self.held(&what).await;
            guard
                .release()
                .await
                .unwrap_or_else(|e| panic!("{what}: release: {e:?}"));
        }
    }

    fn body_refused(
        self,
        within: Duration,
        what: &str,
    ) -> impl Future<Output = (LockError, Duration)> + Send {
        let what = what.to_owned();
        async move {
            let ran = AtomicBool::new(false);
            let start = Instant::now();
            let body = async { ran.store(true, Ordering::SeqCst) };
            let out = tokio::time::timeout(within, with_lock(self, body))
                .await
                .unwrap_or_else(|_| panic!("{what}: with_lock must not hang past {within:?}"));
            let took = start.elapsed();
            println!("{what}: with_lock returned {out:?} after {took:?}");
            assert!(
                !ran.load(Ordering::SeqCst),
                "{what}: the body ran without the lock"
            );
            let err = out.map(drop).expect_err("no lock, no body");
            (err, took)
        }
    }

    fn spawn(self) -> JoinHandle<(Result<LockGuard, LockError>, Instant)> {
        tokio::spawn(async move {
            let out = self.acquire().await;
            (out, Instant::now())
        })
    }
}

/// A lease no test waits out: a key that frees up within a test's bounds was released.
pub const LONG_LEASE: Duration = Duration::from_secs(30);

/// A wait no contender of a test runs out of: a waiter that gives up was kept out.
pub const LONG_WAIT: Duration = Duration::from_secs(60);

/// Acquires `lock` (a plain lock, a read lock, a permit or a key set) with [`LONG_LEASE`],
/// waiting up to `wait`; panics with `what` and the error if that fails.
pub async fn held_long(lock: LockBuilder, wait: Duration, what: &str) -> LockGuard {
    lock.lease(LONG_LEASE).wait(wait).held(what).await
}

/// Joins a waiter from [`AcquireExt::spawn`] within `within`; panics with `what` unless it got
/// the key. Returns the guard and when it came.
pub async fn waiter_got_it(
    waiter: JoinHandle<(Result<LockGuard, LockError>, Instant)>,
    within: Duration,
    what: &str,
) -> (LockGuard, Instant) {
    let (guard, came) = tokio::time::timeout(within, waiter)
        .await
        .unwrap_or_else(|_| panic!("{what}: the waiter did not finish within {within:?}"))
        .expect("the waiter task");
    (guard.unwrap_or_else(|e| panic!("{what}: {e:?}")), came)
}

/// Asserts `rt` (another owner: a spawned task, outside any call chain) can take `key` in one
/// attempt, then releases it.
pub async fn assert_free(rt: &Runtime, key: &str, when: &str) {
    let lock = rt.lock(key).lease(LONG_LEASE).wait(Duration::ZERO);
    let out = tokio::spawn(async move { lock.acquire().await?.release().await })
        .await
        .expect("task");
    if let Err(e) = out {
        panic!("{when}: {key:?} should be free for another owner, got {e:?}");
    }
}

/// Asserts `rt` (another owner: a spawned task, outside any call chain) finds `key` busy.
pub async fn assert_busy(rt: &Runtime, key: &str, when: &str) {
    let lock = rt.lock(key).lease(LONG_LEASE).wait(Duration::ZERO);
    let (out, _) = lock.spawn().await.expect("task");
    match out {
        Err(e) if e.is_timeout() => {}
        other => panic!("{when}: {key:?} must be busy for another owner, got {other:?}"),
    }
}

/// Another owner on `rt` waits at most `within` for `key`, then releases it; returns how long
/// the acquisition took. Panics if it timed out.
pub async fn acquire_within(rt: &Runtime, key: &str, within: Duration, when: &str) -> Duration {
    let start = Instant::now();
    let (out, at) = rt
        .lock(key)
        .lease(LONG_LEASE)
        .wait(within)
        .spawn()
        .await
        .expect("task");
    let guard = out.unwrap_or_else(|e| {
        panic!("{when}: another owner did not get {key:?} within {within:?}: {e:?}")
    });
    guard.release().await.expect("release");
    at.duration_since(start)
}

/// For `period`, every `every`: asserts `guard` is not lost, then runs `check` with the time
/// since the start. Returns how many rounds ran.
pub async fn while_held<F, Fut>(
    guard: &LockGuard,
    period: Duration,
    every: Duration,
    mut check: F,
) -> u32
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = ()>,
{
    let start = Instant::now();
    let mut rounds = 0;
    while start.elapsed() < period {
        assert!(!guard.is_lost(), "lost after {:?}", start.elapsed());
        check(start.elapsed()).await;
        rounds += 1;
        tokio::time::sleep(every).await;
    }
    rounds
}

/// Keeps `guard` for `period`, asserting every 100 ms that it is not lost.
pub async fn stays_held(guard: &LockGuard, period: Duration) {
    while_held(guard, period, Duration::from_millis(100), |_| async {}).await;
}

/// Awaits the tasks in order, giving each up to `within` once the previous one has finished;
/// panics if one takes longer or panicked. Returns their outputs in order.
pub async fn finish_within<T>(
    tasks: impl IntoIterator<Item = JoinHandle<T>>,
    within: Duration,
) -> Vec<T> {
    let mut out = Vec::new();
    for (i, task) in tasks.into_iter().enumerate() {
        let joined = tokio::time::timeout(within, task)
            .await
            .unwrap_or_else(|_| panic!("task {i} did not finish within {within:?}"));
        out.push(joined.unwrap_or_else(|e| panic!("task {i}: {e}")));
    }
    out
}

/// Asserts a lock's TTL on the server (`PTTL`, ms) is within its lease: `0 < PTTL <= lease`.
#[track_caller]
pub fn assert_ttl_within_lease(pttl: i64, lease: Duration, at: Duration) {
    assert!(
        pttl > 0 && u128::try_from(pttl).is_ok_and(|ms| ms <= lease.as_millis()),
        "PTTL {pttl} ms {at:?} in: expected 0 < PTTL <= the {lease:?} lease"
    );
}

/// `rounds` times: a holder on `holder_rt` (30 s lease), a waiter on `rt` that finds the key
/// busy and sleeps; the release must hand the key to the waiter within `bound` (see
/// [`hand_off`]), long before the lease.
pub async fn release_wakes_the_waiter(
    holder_rt: &Runtime,
    rt: &Runtime,
    key: &str,
    (rounds, bound): (u32, Duration),
    what: &str,
) {
    for round in 0..rounds {
        let holder = holder_rt.lock(key).lease(LONG_LEASE).held("holder").await;
        let waiter = rt.lock(key).lease(LONG_LEASE).wait(Duration::from_secs(20));
        let waiter = waiter.spawn();
        // Let the waiter find the key busy and go to sleep.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !waiter.is_finished(),
            "{what} round {round}: the waiter got a held key"
        );
        let what = format!("{what} round {round}");
        let guard = hand_off(holder, waiter, bound, &what).await;
        guard.release().await.expect("release");
    }
}

/// Releases `holder`, then awaits `waiter` (from [`AcquireExt::spawn`]) and asserts it held the
/// key within `bound` of the release (the holder's lease is far longer: a notification woke
/// it). Returns the waiter's guard.
pub async fn hand_off(
    holder: LockGuard,
    waiter: JoinHandle<(Result<LockGuard, LockError>, Instant)>,
    bound: Duration,
    what: &str,
) -> LockGuard {
    let released = Instant::now();
    holder.release().await.expect("the holder releases");
    let (guard, acquired) = tokio::time::timeout(Duration::from_secs(25), waiter)
        .await
        .unwrap_or_else(|_| panic!("{what}: the waiter finishes"))
        .expect("waiter task");
    let guard = guard.unwrap_or_else(|e| panic!("{what}: the waiter: {e:?}"));
    let latency = acquired.saturating_duration_since(released);
    println!("{what}: release -> waiter holds in {latency:?}");
    assert!(
        latency < bound,
        "{what}: the waiter held the key {latency:?} after the release (bound {bound:?})"
    );
    guard
}
