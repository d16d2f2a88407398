//! One key: a re-entry of a hold of the call chain, or a fresh acquisition, in the span
//! `dlock.acquire`, reported to the runtime's observer (a re-entry is not an acquisition).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use super::builder::LockBuilder;
use super::validate::check_reentry;
use crate::acquire::acquire_fresh;
use crate::chain::Frame;
use crate::core::{Core, FOREVER};
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::held::{Held, Reentry, Registry, Terms};

/// Acquires the one-key lock `lock` in `core` from the call-chain frame `frame` (`scope`: the
/// frame a scoped acquisition opens for its body).
pub(super) async fn acquire(
    lock: LockBuilder,
    core: &Arc<Core>,
    frame: Option<&Arc<Frame>>,
    scope: Option<u64>,
) -> Result<LockGuard, LockError> {
    let span = tracing::info_span!(
        "dlock.acquire",
        key = %lock.key,
        engine = core.engine,
        fence = tracing::field::Empty,
        waited_ms = tracing::field::Empty,
    );
    let started = Instant::now();
    // Pinned where it is made: wrapped by reference, the future (large) is not copied into
    // the span's wrapper.
    let acquiring = std::pin::pin!(acquire_from(lock, core, frame, scope, started));
    let outcome = acquiring.instrument(span.clone()).await;
    let observer = &core.observer;
    match &outcome {
        Ok(guard) if guard.is_first() => {
            if observer.timed() || !span.is_disabled() {
                let waited = started.elapsed();
                let fence = guard.fence();
                if let Some(fence) = fence {
                    span.record("fence", fence);
                }
                span.record("waited_ms", waited.as_millis() as u64);
                observer.acquired(guard.key(), fence, waited);
            }
        }
        Ok(_) => {}
        Err(LockError::Timeout { key, waited, .. }) => observer.timed_out(key, *waited),
        Err(_) => observer.failed(started.elapsed()),
    }
    outcome
}

/// [`acquire`] in `core`, started at `started`.
async fn acquire_from(
    lock: LockBuilder,
    core: &Arc<Core>,
    frame: Option<&Arc<Frame>>,
    scope: Option<u64>,
    started: Instant,
) -> Result<LockGuard, LockError> {
    let lease = lock.checked_lease(core)?;
    let wait = lock.wait.unwrap_or(core.default_wait);
    let deadline = started + wait.min(FOREVER);

    // The clock is read again only after a wait; a read costs as much as a good part of
    // an in-process acquisition.
    let mut now = started;
    if let Some(frame) = frame
        && let Some(held) = frame.find(core.id, &lock.key)
    {
        check_reentry(held.terms.mode, lock.mode, &lock.key)?;
        if let Some(guard) = reenter(held, &**frame, scope, started, deadline).await? {
            return Ok(guard);
        }
        now = Instant::now();
    }
    let wait = deadline.saturating_duration_since(now);
    let terms = lock.terms(lease, frame, scope);
    let held = acquire_fresh(core, lock.key, terms, now, wait).await?;
    // A scoped acquisition's frame is made around the hold by the caller.
    let frame = match scope {
        Some(_) => None,
        None => frame.cloned(),
    };
    if let Some(frame) = &frame {
        frame.push(held.clone());
    }
    Ok(LockGuard::first(
        held,
        frame.map(|f| f as Arc<dyn Registry>),
    ))
}

/// Re-enters `held` from `frame`, taking turns with concurrent branches of the chain until
/// `deadline`. `None` when the hold ended meanwhile (acquire fresh).
async fn reenter(
    held: Arc<Held>,
    frame: &dyn Registry,
    scope: Option<u64>,
    started: Instant,
    deadline: Instant,
) -> Result<Option<LockGuard>, LockError> {
    // Registered before the check that finds the hold busy, so no wake-up is missed.
    let mut turn = None;
    loop {
        match held.reenter(frame, scope) {
            Reentry::Entered => {
                let guard = LockGuard::reentrant(held.clone(), scope);
                if guard.is_lost() {
                    let key = guard.key().to_owned();
                    drop(guard);
                    return Err(LockError::Lost { key });
                }
                tracing::trace!(key = %guard.key(), "lock re-entered");
                return Ok(Some(guard));
            }
            Reentry::Ended => return Ok(None),
            Reentry::Busy => match turn.take() {
                None => turn = Some(held.turn()),
                Some(turn) => {
                    tracing::trace!(key = %held.key, "a concurrent branch of the call chain holds the lock; waiting for its turn");
                    if tokio::time::timeout_at(deadline, turn).await.is_err() {
                        return Err(LockError::Timeout {
                            key: held.key.clone(),
                            waited: started.elapsed(),
                            holder_ttl: None,
                        });
                    }
                }
            },
        }
    }
}

impl LockBuilder {
    /// What a fresh acquisition from `frame` asks for, with `lease`; the frame that uses the
    /// hold is the one a scoped acquisition opens (`scope`), else the caller's.
    pub(super) fn terms(
        &self,
        lease: Duration,
        frame: Option<&Arc<Frame>>,
        scope: Option<u64>,
    ) -> Terms {
        Terms {
            lease,
            renew: self.watchdog,
            frame: scope.or(frame.map(|f| f.id)).unwrap_or(0),
            hold: self.hold_at_least,
            mode: self.mode,
            fair: self.fair,
            track_on_wait: self.track_on_wait,
        }
    }
}
