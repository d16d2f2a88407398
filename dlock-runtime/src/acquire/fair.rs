//! Fair locks on an engine that queues waiters on request (Redis, Redis Cluster): every waiter
//! of the key, in every process, takes its own place in the engine's line on its first busy
//! attempt and keeps it by attempting again (a heartbeat) at least every third of its place's
//! life; the first in line gets the lock. The local queue and the hand-off within a process are
//! not used, so the engine's line alone decides the order. Waiters of one process still share
//! one subscription per key: a release wakes all of them (each asks once; only the first in
//! line acquires).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::attempt::{ERROR_RETRY, compensated, new_owner, timed_out, watch};
use crate::backend::{Attempt, Backend};
use crate::core::Core;
use crate::error::LockError;
use crate::held::{Held, Terms};

/// How long a fair waiter's place in line lasts past its last heartbeat on Redis (or the
/// lock's lease, if shorter, but at least half a second): a waiter whose process died stops
/// blocking the line at most this long later. A waiter refreshes its place every third of it
/// while it waits; one whose `wait` runs out leaves the line at once, and one whose
/// acquisition is cancelled (its future dropped) leaves it from a background task.
pub const FAIR_PLACE: Duration = Duration::from_secs(5);

/// The shortest place: three heartbeats must fit in it on a loaded machine.
const MIN_PLACE: Duration = Duration::from_millis(500);

/// The life of a place in line for a lock with `lease` (see [`FAIR_PLACE`]).
pub(crate) fn place_for(lease: Duration) -> Duration {
    lease.min(FAIR_PLACE).max(MIN_PLACE)
}

/// A fresh acquisition of a fair lock through the engine's line, until `deadline`.
pub(crate) async fn acquire(
    core: &Arc<Core>,
    key: String,
    mut owner: String,
    terms: Terms,
    started: Instant,
    deadline: Instant,
) -> Result<Arc<Held>, LockError> {
    let place = place_for(terms.lease);
    let heartbeat = place / 3;
    let timeout = |key: String, seen| timed_out(key, started, seen);
    // Shares the runtime's subscription to the key's releases, and its local wake-ups.
    let ticket = core.hub.join(&key);
    let mut watched = false;
    let mut in_line = false;
    // Cancelled while in line: leave it in the background rather than block it until the
    // place runs out.
    let mut place_left = LeaveOnDrop {
        core,
        key: key.clone(),
        owner: None,
    };
    loop {
        let freed = ticket.queue().freed.notified();
        tokio::pin!(freed);
        freed.as_mut().enable();
        let sent_at = Instant::now();
        // Without time to wait, one try that does not join the line.
        let ask = if sent_at >= deadline && !in_line {
            Duration::ZERO
        } else {
            place
        };
        // The request may put this waiter in line, even if its answer never arrives here (the
        // wait cancelled while it is out): from now on a cancellation leaves the line.
        if !ask.is_zero() && place_left.owner.is_none() {
            place_left.owner = Some(owner.clone());
        }
        let request = core
            .backend
            .try_acquire_fair(&key, &owner, terms.lease, ask);
        let ttl = match compensated(core, &key, &owner, request).await {
            Ok(Attempt::Acquired { fence }) => {
                place_left.owner = None;
                return Ok(Held::new(core, key, owner, fence, terms, sent_at));
            }
            Ok(Attempt::Busy { ttl }) => ttl,
            // A transient engine error while the wait budget lasts: again shortly, with a fresh
            // owner token (the failed attempt's compensating release carries the old one; the
            // old place runs out by itself).
            Err(err) if err.is_backend() && Instant::now() + ERROR_RETRY < deadline => {
                tracing::debug!(key = %key, error = %err, "fair attempt failed; retrying within the wait");
                owner = new_owner(core, &terms);
                place_left.owner = None;
                tokio::time::sleep(ERROR_RETRY).await;
                continue;
            }
            Err(err) => {
                place_left.owner = None;
                leave(core, &key, &owner, in_line).await;
                return Err(err);
            }
        };
        if !ask.is_zero() {
            in_line = true;
        }
        let now = Instant::now();
        // The holder's TTL as this busy answer said, and when it came.
        let seen_ttl = ttl.map(|ttl| (ttl, now));
        if now >= deadline {
            place_left.owner = None;
            leave(core, &key, &owner, in_line).await;
            return Err(timeout(key, seen_ttl));
        }
        if !watched {
            // Notifications flow from here on; ask again at once, so that a release between
            // the busy answer and the subscription is not waited out.
            match watch(&ticket, &key, deadline).await {
                Some(now_watched) => watched = now_watched,
                None => {
                    place_left.owner = None;
                    leave(core, &key, &owner, in_line).await;
                    return Err(timeout(key, seen_ttl));
                }
            }
            if watched {
                continue;
            }
        }
        // Until a release (notified) or the holder's lease runs out, but at least every
        // heartbeat, which keeps this waiter's place.
        let pause = ttl.unwrap_or(heartbeat).min(heartbeat);
        tokio::select! {
            _ = freed => {}
            _ = tokio::time::sleep_until((now + pause).min(deadline)) => {}
        }
    }
}

/// Takes `owner` out of the line (a waiter that gives up), so that those behind it need not
/// wait for its place to run out.
async fn leave(core: &Core, key: &str, owner: &str, in_line: bool) {
    if !in_line {
        return;
    }
    if let Err(err) = core.backend.leave_fair_queue(key, owner).await {
        tracing::debug!(key = %key, error = %err, "leaving the line failed; the place runs out by itself");
    }
}

/// Takes a waiter that is dropped while in line (its acquisition cancelled) out of the line in
/// the background. `owner`: the token the waiter is in line with, if any.
struct LeaveOnDrop<'a> {
    core: &'a Arc<Core>,
    key: String,
    owner: Option<String>,
}

impl Drop for LeaveOnDrop<'_> {
    fn drop(&mut self) {
        let Some(owner) = self.owner.take() else {
            return;
        };
        let (core, key) = (self.core.clone(), std::mem::take(&mut self.key));
        self.core.handle.spawn(async move {
            leave(&core, &key, &owner, true).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_lasts_the_lease_within_bounds() {
        assert_eq!(place_for(Duration::from_secs(30)), FAIR_PLACE);
        assert_eq!(place_for(Duration::from_secs(2)), Duration::from_secs(2));
        assert_eq!(place_for(Duration::from_millis(10)), MIN_PLACE);
    }
}
