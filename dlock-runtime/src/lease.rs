//! The lease state of one held lock: the lost signal and the confirmed validity.
//!
//! A signal is fired at most once (lost is final); the validity only moves forward with
//! confirmed renewals, and is read on the local monotonic clock.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;
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
        Self::default_at(Instant::now())
    }
}

impl LostSignal {
    /// A signal whose confirmed validity runs until `valid_until`, made as the clock read
    /// `now` (see [`expired_when_made`](LostSignal::expired_when_made)).
    pub(crate) fn new(now: Instant, valid_until: Instant) -> Self {
        let signal = Self::default_at(now);
        signal.set_valid_until(valid_until);
        signal
    }

    fn default_at(base: Instant) -> Self {
        Self {
            lost: AtomicBool::new(false),
            orphaned: AtomicBool::new(false),
            notify: Arc::default(),
            base,
            valid_nanos: AtomicU64::new(0),
        }
    }

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
    pub(crate) fn watch(&self) -> Pin<Box<OwnedNotified>> {
        let mut notified = Box::pin(self.notify.clone().notified_owned());
        notified.as_mut().enable();
        notified
    }

    /// Whether the validity had already run out when this signal was made (the clock was
    /// read then: `base`).
    fn expired_when_made(&self) -> bool {
        self.valid_nanos.load(Ordering::Acquire) == 0
    }

    /// Whether the confirmed validity has run out on the local clock, although the watchdog
    /// has not said so yet (it runs as a task of its own: after the process was stopped, or
    /// under load, it may not have run since).
    pub(crate) fn expired(&self) -> bool {
        let until = self.base + Duration::from_nanos(self.valid_nanos.load(Ordering::Acquire));
        Instant::now() >= until
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

/// What a body's loss check reads of a lease: a [`LostSignal`], or a hold that may not have
/// made its signal yet.
pub(crate) trait Validity {
    /// Whether the validity had already run out when the clock was read at the registration.
    fn expired_when_made(&self) -> bool;
    /// Whether the confirmed validity has run out on the local clock.
    fn expired(&self) -> bool;
    /// Whether the lease is known lost (or the acquisition ended under a reentrant guard).
    fn is_lost(&self) -> bool;
}

impl Validity for LostSignal {
    fn expired_when_made(&self) -> bool {
        LostSignal::expired_when_made(self)
    }

    fn expired(&self) -> bool {
        LostSignal::expired(self)
    }

    fn is_lost(&self) -> bool {
        LostSignal::is_lost(self)
    }
}

/// Resolves when any of `signals` is lost.
pub(crate) async fn any_lost(signals: impl Iterator<Item = &LostSignal>) {
    let signals: Vec<&LostSignal> = signals.collect();
    loop {
        // Registered before the check, so that no `fire` in between is missed.
        let mut watches: Vec<_> = signals.iter().map(|s| s.watch()).collect();
        if signals.iter().any(|s| s.is_lost()) {
            return;
        }
        std::future::poll_fn(|cx| {
            if watches.iter_mut().any(|w| w.as_mut().poll(cx).is_ready()) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
    }
}

/// What remains of a hold that keeps its key until `until` (`hold_at_least`): `None` once it
/// passed (or without a hold).
pub(crate) fn hold_left(until: Option<Instant>) -> Option<Duration> {
    until
        .map(|until| until.saturating_duration_since(Instant::now()))
        .filter(|left| !left.is_zero())
}
