//! What happens to the locks of a runtime, as events ([`Runtime::events`]), metrics (feature
//! `metrics`) and tracing, from one place: [`Observer`].
//!
//! Every acquisition of the engine's lock (or a hand-over within the runtime) is one
//! `Acquired` and, when its hold ends, one `Released`; a re-entry of a hold the call chain
//! already has is neither. Renewals are reported per lock, not per batched call.
//!
//! [`Runtime::events`]: crate::Runtime::events

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::broadcast;

/// How many events a receiver of [`Runtime::events`](crate::Runtime::events) may fall behind
/// before it loses the oldest: it is then told how many it lost
/// ([`RecvError::Lagged`](tokio::sync::broadcast::error::RecvError::Lagged)).
pub const EVENT_BUFFER: usize = 1024;

/// Something that happened to a lock of this runtime ([`Runtime::events`](crate::Runtime::events)).
///
/// `key` is always the user's key, without the runtime's prefix. New variants and fields may
/// be added: match with `..` and a wildcard arm.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockEvent {
    /// The lock was acquired from the engine, or handed over by another holder of this
    /// runtime.
    #[non_exhaustive]
    Acquired {
        /// The user's key.
        key: String,
        /// The holder's fencing token (`None` where the engine gives none: Redlock).
        fence: Option<u64>,
        /// From the call to `acquire` to holding the lock.
        waited: Duration,
    },
    /// The watchdog renewed the lease.
    #[non_exhaustive]
    Renewed {
        /// The user's key.
        key: String,
    },
    /// A renewal got no answer, or too few nodes answered; the watchdog retries, and the
    /// lock is `Lost` if no renewal is confirmed before the lease runs out.
    #[non_exhaustive]
    RenewalFailed {
        /// The user's key.
        key: String,
        /// What went wrong (the error's message: never a secret).
        error: String,
    },
    /// The lease was lost while held: the engine says the lock is no longer this holder's,
    /// or no renewal was confirmed before it ran out, or a hard-capped lock reached its
    /// lease.
    #[non_exhaustive]
    Lost {
        /// The user's key.
        key: String,
    },
    /// The hold ended: released, dropped, or handed to the next holder of this runtime.
    #[non_exhaustive]
    Released {
        /// The user's key.
        key: String,
        /// From sending the acquisition request (or the hand-over) to the end of the hold.
        held: Duration,
    },
    /// An acquisition gave up: the lock was still busy when its `wait` ran out.
    #[non_exhaustive]
    Timeout {
        /// The user's key.
        key: String,
        /// How long it waited.
        waited: Duration,
    },
}

impl LockEvent {
    /// The key the event is about (the user's key, without the runtime's prefix).
    pub fn key(&self) -> &str {
        match self {
            Self::Acquired { key, .. }
            | Self::Renewed { key }
            | Self::RenewalFailed { key, .. }
            | Self::Lost { key }
            | Self::Released { key, .. }
            | Self::Timeout { key, .. } => key,
        }
    }
}

/// The outlets of one runtime: its event channel, the `metrics` facade (feature `metrics`),
/// and `tracing`.
#[derive(Debug)]
pub(crate) struct Observer {
    /// The engine's name, the `engine` label of every metric.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    engine: &'static str,
    events: broadcast::Sender<LockEvent>,
    /// Set by the first [`subscribe`](Observer::subscribe): until then no event is built.
    subscribed: AtomicBool,
}

impl Observer {
    pub(crate) fn new(engine: &'static str) -> Self {
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        Self {
            engine,
            events,
            subscribed: AtomicBool::new(false),
        }
    }

    /// A receiver of the events from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<LockEvent> {
        self.subscribed.store(true, Ordering::Relaxed);
        self.events.subscribe()
    }

    /// Whether anything reads timings (events or metrics): without either, the hot paths
    /// read no clock for them.
    pub(crate) fn timed(&self) -> bool {
        cfg!(feature = "metrics") || self.subscribed.load(Ordering::Relaxed)
    }

    /// Sends the event `make` builds, if anybody ever subscribed. Never waits: a receiver
    /// that falls behind by more than [`EVENT_BUFFER`] loses the oldest and is told so.
    fn emit(&self, make: impl FnOnce() -> LockEvent) {
        if self.subscribed.load(Ordering::Relaxed) {
            // An error only says that no receiver is left.
            let _ = self.events.send(make());
        }
    }

    pub(crate) fn acquired(&self, key: &str, fence: Option<u64>, waited: Duration) {
        #[cfg(feature = "metrics")]
        {
            metrics::histogram!("dlock_acquire_seconds", "engine" => self.engine, "outcome" => "acquired")
                .record(waited.as_secs_f64());
            metrics::gauge!("dlock_held_locks", "engine" => self.engine).increment(1.0);
        }
        self.emit(|| LockEvent::Acquired {
            key: key.to_owned(),
            fence,
            waited,
        });
    }

    pub(crate) fn timed_out(&self, key: &str, waited: Duration) {
        tracing::debug!(key = %key, waited_ms = waited.as_millis() as u64, "lock still busy at the end of the wait");
        #[cfg(feature = "metrics")]
        {
            metrics::histogram!("dlock_acquire_seconds", "engine" => self.engine, "outcome" => "timeout")
                .record(waited.as_secs_f64());
            metrics::counter!("dlock_timeouts_total", "engine" => self.engine).increment(1);
        }
        self.emit(|| LockEvent::Timeout {
            key: key.to_owned(),
            waited,
        });
    }

    /// An acquisition failed otherwise (engine error, bad configuration).
    pub(crate) fn failed(&self, _waited: Duration) {
        #[cfg(feature = "metrics")]
        metrics::histogram!("dlock_acquire_seconds", "engine" => self.engine, "outcome" => "error")
            .record(_waited.as_secs_f64());
    }

    pub(crate) fn released(&self, key: &str, held: Duration) {
        #[cfg(feature = "metrics")]
        {
            metrics::histogram!("dlock_held_seconds", "engine" => self.engine)
                .record(held.as_secs_f64());
            metrics::gauge!("dlock_held_locks", "engine" => self.engine).decrement(1.0);
        }
        self.emit(|| LockEvent::Released {
            key: key.to_owned(),
            held,
        });
    }

    pub(crate) fn renewed(&self, key: &str) {
        tracing::debug!(key = %key, "lease renewed");
        #[cfg(feature = "metrics")]
        metrics::counter!("dlock_renewals_total", "engine" => self.engine, "outcome" => "ok")
            .increment(1);
        self.emit(|| LockEvent::Renewed {
            key: key.to_owned(),
        });
    }

    /// A renewal failed with `error`; the caller logs it (at warn) with its retry plan.
    pub(crate) fn renewal_failed(&self, key: &str, error: impl FnOnce() -> String) {
        #[cfg(feature = "metrics")]
        metrics::counter!("dlock_renewals_total", "engine" => self.engine, "outcome" => "failed")
            .increment(1);
        self.emit(|| LockEvent::RenewalFailed {
            key: key.to_owned(),
            error: error(),
        });
    }

    /// The lease of a held lock was lost, for `why`.
    pub(crate) fn lost(&self, key: &str, why: &str) {
        tracing::error!(key = %key, "lease lost: {why}");
        #[cfg(feature = "metrics")]
        metrics::counter!("dlock_lost_total", "engine" => self.engine).increment(1);
        self.emit(|| LockEvent::Lost {
            key: key.to_owned(),
        });
    }
}
