//! The lease state of one held lock: the lost signal and the confirmed validity.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Context;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;
use tokio::time::Instant;

use crate::held::Held;

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

/// What a [`LossCheck`] reads of a lease: a [`LostSignal`], or a [`Held`] that may not have
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

/// Stops a body once its lease is known lost: before each step of the body the confirmed
/// validity is checked on the local clock, so a body never takes another step once it ran out,
/// even if the watchdog has not run yet (a process resumed after a pause); once the body has
/// had to wait, the watchdog tracks its hold (see [`Held::watch`]) and the lost signal is
/// watched too, so that a loss wakes it. A body that completes at once costs a few loads.
pub(crate) struct LossCheck {
    // The first step is checked against the clock reading of the signal's making.
    first: bool,
    // The lost notification, watched once the body has had to wait.
    watching: Option<Pin<Box<OwnedNotified>>>,
}

impl LossCheck {
    /// A check of a body not started yet. `fresh`: its lease's signal was made (its validity
    /// set against the clock read then) in the same poll as the body's first step, so that
    /// step is checked against that reading instead of a new one.
    pub(crate) fn new(fresh: bool) -> Self {
        Self {
            first: fresh,
            watching: None,
        }
    }

    /// Whether the body may take its next step (the `lease` is not known lost).
    pub(crate) fn may_step(&mut self, lease: &impl Validity) -> bool {
        let expired = if std::mem::take(&mut self.first) {
            lease.expired_when_made()
        } else {
            lease.expired()
        };
        !(lease.is_lost() || expired)
    }

    /// Whether the body has had to wait (its hold is tracked, and its lost signal watched).
    pub(crate) fn watching(&self) -> bool {
        self.watching.is_some()
    }

    /// After a step that left the body waiting: whether the lease of `held` is known lost by
    /// now (the task is woken when it is). The first time, has the watchdog track the hold.
    pub(crate) fn lost_while_waiting(&mut self, held: &Held, cx: &mut Context<'_>) -> bool {
        let lost = self.watching.get_or_insert_with(|| {
            held.watch();
            held.lost().watch()
        });
        lost.as_mut().poll(cx).is_ready() || held.is_lost()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body resumed after its validity ran out (the process was stopped; the watchdog has not
    /// run since) takes no further step.
    #[tokio::test(start_paused = true)]
    async fn no_step_after_the_validity_ran_out_even_before_the_watchdog_runs() {
        let signal = LostSignal::default();
        signal.set_valid_until(Instant::now() + Duration::from_secs(1));
        let mut check = LossCheck::new(false);
        let mut steps = 0;
        while check.may_step(&signal) && steps < 10 {
            steps += 1;
            tokio::time::advance(Duration::from_millis(400)).await;
        }
        assert!(!signal.is_lost(), "nobody fired the signal");
        // Steps at 0, 400 and 800 ms; none at 1200 ms.
        assert_eq!(steps, 3);
    }

    /// A hold whose validity had run out before it was registered (the acquire's answer came
    /// back later than the lease) takes no step, although its first step is checked against
    /// the registration's clock reading rather than a new one.
    #[tokio::test(start_paused = true)]
    async fn fresh_hold_whose_validity_ran_out_before_it_was_registered_takes_no_step() {
        let sent = Instant::now();
        tokio::time::advance(Duration::from_secs(2)).await;
        let signal = LostSignal::default();
        signal.set_valid_until(sent + Duration::from_secs(1));
        assert!(!LossCheck::new(true).may_step(&signal));
        // Still valid when registered: the first step runs.
        let signal = LostSignal::default();
        signal.set_valid_until(Instant::now() + Duration::from_secs(1));
        assert!(LossCheck::new(true).may_step(&signal));
    }
}
