//! A fresh acquisition (not a re-entry): the engine's own queue where it has one, a fair
//! lock's line where the engine keeps one, else one attempt and then the local queue.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Attempt, Backend, Fairness, Queued, Queueing};
use crate::core::{Core, FOREVER};
use crate::error::LockError;
use crate::held::{Held, Terms};

pub(crate) mod attempt;
pub(crate) mod fair;
mod queue;

use attempt::{ERROR_RETRY, attempt, compensated, new_owner, timed_out};

/// A fresh acquisition (not a re-entry): the engine's queue, or one attempt and then the
/// local queue.
/// `started`: a reading of the clock taken just before (the acquisition counts from it).
pub(crate) async fn acquire_fresh(
    core: &Arc<Core>,
    key: String,
    terms: Terms,
    started: Instant,
    wait: Duration,
) -> Result<Arc<Held>, LockError> {
    let lease = terms.lease;
    let owner = new_owner(core, &terms);
    let deadline = started + wait.min(FOREVER);
    let timeout = |key: String, ttl: Option<Duration>| {
        timed_out(key, started, ttl.map(|ttl| (ttl, Instant::now())))
    };

    // A fair lock waits in the engine's line where the engine keeps one for it.
    if terms.fair && core.caps.fairness == Fairness::Queue {
        return Box::pin(fair::acquire(core, key, owner, terms, started, deadline)).await;
    }

    // Engines with their own FIFO queue wait there (no local queue, no polling).
    let mut owner = owner;
    // Whether the clock moved on since `started` (something was awaited).
    let mut awaited = false;
    let queued = loop {
        let ask = Queueing {
            lease,
            renew: terms.renew,
            deadline,
        };
        if !core.caps.queue {
            break None;
        }
        let request = core.backend.acquire_queued(&key, &owner, ask);
        awaited = true;
        match compensated(core, &key, &owner, request).await {
            Ok(answer) => break Some(answer),
            // A transient engine error (a new session, a failover) while the wait budget
            // lasts: queue again with a fresh owner token.
            Err(err) if err.is_backend() && Instant::now() + ERROR_RETRY < deadline => {
                tracing::debug!(key = %key, error = %err, "queueing failed; retrying within the wait");
                owner = new_owner(core, &terms);
                tokio::time::sleep(ERROR_RETRY).await;
            }
            Err(err) => return Err(err),
        }
    };
    if let Some(Queued { attempt, confirmed }) = queued {
        return match attempt {
            Attempt::Acquired { fence } => {
                // Counted from when the engine last confirmed the hold for a whole lease; else
                // the hold was granted when the request started and kept alive while queued:
                // count on it from the later of that start and a third of the part of the lease
                // the engine lets us count on (ZooKeeper: its session timeout) ago.
                // (The margin was checked when the lock was requested.)
                let since = confirmed.unwrap_or_else(|| {
                    let margin = core.backend.lease_margin(lease).unwrap_or_default();
                    let counted = lease.saturating_sub(margin);
                    Instant::now()
                        .checked_sub(counted / 3)
                        .map_or(started, |t| t.max(started))
                });
                Ok(Held::new(core, key, owner, fence, terms, since))
            }
            Attempt::Busy { ttl } => Err(timeout(key, ttl)),
        };
    }

    // Fast path: one attempt, unless local waiters are queued (then queue behind them).
    if wait.is_zero() || !core.hub.has_waiters(&key) {
        // Nothing was awaited since `started` on this path: the request goes out now, and
        // counting the lease from a moment before it was sent is on the safe side.
        let sent_at = if awaited { Instant::now() } else { started };
        match attempt(core, &key, &owner, lease, false).await? {
            Attempt::Acquired { fence } => {
                return Ok(Held::new(core, key, owner, fence, terms, sent_at));
            }
            Attempt::Busy { ttl } if wait.is_zero() => {
                // Asked only now, on the busy path, so that an uncontended attempt stays what
                // it is (the TTL is for `Retry-After`, see `LockError::holder_ttl`).
                let ttl = match ttl {
                    Some(ttl) => Some(ttl),
                    None => core.backend.holder_ttl(&key).await,
                };
                return Err(timeout(key, ttl));
            }
            Attempt::Busy { .. } => {}
        }
    }

    // Slow path, boxed so that the common uncontended acquire stays a small future.
    tracing::debug!(key = %key, ?wait, "lock busy; waiting for a release");
    Box::pin(queue::wait_in_queue(
        core, key, owner, terms, started, deadline,
    ))
    .await
}
