//! The watchdog's clock thread: wakes the scheduler task from outside the tokio runtime at
//! each look it plans, so a worker blocked by a holder cannot hold renewals back.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use tokio::time::Instant;

use super::Watchdog;

impl Watchdog {
    /// Starts the clock thread (see [`clock`]); without one, the scheduler task is woken
    /// directly and by its own timer only.
    pub(super) fn start_clock(self: &Arc<Self>) {
        let watchdog = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("dlock-watchdog".into())
            .spawn(move || clock(&watchdog));
        match spawned {
            Ok(thread) => {
                // Set once, here; the thread reads the plan itself when it starts.
                let _ = self.clock.set(thread.thread().clone());
            }
            Err(err) => {
                tracing::warn!(error = %err, "no watchdog clock thread: renewals wait on the runtime's own timers");
            }
        }
    }
}

/// The clock thread of a watchdog: wakes the scheduler task, from outside the runtime, when
/// each look it planned comes (once per planned look), so that it runs on a worker that is not
/// blocked, and that worker drives the runtime's timers and sockets if the one that did is
/// blocked (tokio leaves them to the worker that parked last). The task also sleeps on its
/// own timer (which follows tokio's clock when a test pauses it). Ends with the watchdog.
fn clock(watchdog: &Weak<Watchdog>) {
    let mut woken_for: Option<Instant> = None;
    loop {
        let Some(wd) = watchdog.upgrade() else {
            return;
        };
        if wd.closed.load(Ordering::Acquire) {
            return;
        }
        let next = wd.state().next_wake;
        let wait = match next {
            Some(at) if Some(at) != woken_for => {
                let left = at.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    wd.wake.notify_one();
                    woken_for = Some(at);
                    None
                } else {
                    Some(left)
                }
            }
            // Nothing planned, or woken for it already: until the plan changes.
            _ => None,
        };
        drop(wd);
        match wait {
            Some(left) => std::thread::park_timeout(left),
            None => std::thread::park(),
        }
    }
}
