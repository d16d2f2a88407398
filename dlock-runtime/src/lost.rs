//! The lease state of one held lock: the lost signal and the confirmed validity.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The lease state of one held lock, shared by its guards and the watchdog: the lost signal
/// and the confirmed validity.
#[derive(Debug)]
pub(crate) struct LostSignal {
    lost: AtomicBool,
    /// The acquisition ended while reentrant guards were still alive: to them it is lost.
    orphaned: AtomicBool,
    notify: Arc<Notify>,
    /// Reference point for `valid_nanos`.
    base: Instant,
    /// Confirmed validity, as nanoseconds after `base`.
    valid_nanos: AtomicU64,
}

impl Default for LostSignal {
    fn default() -> Self {
        Self {
            lost: AtomicBool::new(false),
            orphaned: AtomicBool::new(false),
            notify: Arc::default(),
            base: Instant::now(),
            valid_nanos: AtomicU64::new(0),
        }
    }
}

impl LostSignal {
    pub(crate) fn set_valid_until(&self, until: Instant) {
        let nanos = until.saturating_duration_since(self.base).as_nanos();
        self.valid_nanos
            .store(u64::try_from(nanos).unwrap_or(u64::MAX), Ordering::Release);
    }

    /// How long the lock stays ours if no renewal succeeds from now on (zero once lost).
    pub(crate) fn valid_for(&self) -> Duration {
        if self.is_lost() {
            return Duration::ZERO;
        }
        let until = self.base + Duration::from_nanos(self.valid_nanos.load(Ordering::Acquire));
        until.saturating_duration_since(Instant::now())
    }

    pub(crate) fn fire(&self) {
        self.lost.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// The acquisition ended under guards that re-entered it: they count it lost, though the
    /// lease itself was not.
    pub(crate) fn orphan(&self) {
        self.orphaned.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// Whether the lock no longer protects its guards: the lease was lost, or (for a reentrant
    /// guard that outlived it) the acquisition ended.
    pub(crate) fn is_lost(&self) -> bool {
        self.lease_lost() || self.orphaned.load(Ordering::Acquire)
    }

    /// Whether the lease was lost in the engine (or on the local clock).
    pub(crate) fn lease_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// A registered waiter that resolves at the next `fire` (check [`is_lost`] after
    /// registering to close the race with an earlier one).
    ///
    /// [`is_lost`]: LostSignal::is_lost
    pub(crate) fn watch(&self) -> std::pin::Pin<Box<tokio::sync::futures::OwnedNotified>> {
        let mut notified = Box::pin(self.notify.clone().notified_owned());
        notified.as_mut().enable();
        notified
    }

    pub(crate) async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_lost() {
                return;
            }
            notified.await;
        }
    }
}
