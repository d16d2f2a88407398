//! Waiting in the local queue of a key: the head waiter alone contends with the engine,
//! subscribed to the key's releases, and takes a hold a holder of this runtime hands it.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::attempt::{ERROR_RETRY, attempt, new_owner, timed_out, watch};
use crate::backend::{Attempt, Backend};
use crate::baton::Baton;
use crate::core::{Core, FOREVER};
use crate::error::LockError;
use crate::handoff::Head;
use crate::held::{Held, Terms};
use crate::wait::Ticket;

/// How often a waiter without notifications (the engine refused the subscription) looks
/// again, and asks for the subscription again.
const POLL_UNWATCHED: Duration = Duration::from_millis(200);

/// Queues locally; the head of the queue subscribes and contends until `deadline`.
pub(super) async fn wait_in_queue(
    core: &Arc<Core>,
    key: String,
    mut owner: String,
    terms: Terms,
    started: Instant,
    deadline: Instant,
) -> Result<Arc<Held>, LockError> {
    let lease = terms.lease;
    // The holder's TTL as the last busy answer said, and when that answer came.
    let mut seen_ttl: Option<(Duration, Instant)> = None;
    let timeout = |key: String, seen| timed_out(key, started, seen);
    let ticket = core.hub.join(&key);
    let Ok(_turn) = tokio::time::timeout_at(deadline, ticket.queue().turn.lock()).await else {
        // A head before this waiter may have left a place in the engine's line.
        give_up(core, &ticket, &key).await;
        return Err(timeout(key, seen_ttl));
    };
    let queue = ticket.queue();
    // First in line: a holder of this runtime may hand the lock over from now on.
    let head = Head::new(core, queue, terms);
    // Left in the background if this wait is cancelled after it joined the engine's line.
    let mut place = LinePlace {
        core,
        ticket: &ticket,
        key: key.clone(),
        joined: false,
    };
    let Some(mut watched) = watch(&ticket, &key, deadline).await else {
        return Err(timeout(key, seen_ttl));
    };
    loop {
        let freed = queue.freed.notified();
        tokio::pin!(freed);
        freed.as_mut().enable();
        if let Some(held) = head.take(&key, terms) {
            place.joined = false;
            queue.mark_held(lease);
            return Ok(held);
        }

        // The previous head of this queue holds the key: its release wakes us, and an attempt
        // now could only fail (no herd, no wasted round trip on a hot key).
        if let Some(holder_lease) = queue.held_here() {
            let until = (Instant::now() + holder_lease.min(FOREVER)).min(deadline);
            tokio::select! {
                _ = freed => {}
                _ = tokio::time::sleep_until(until) => queue.clear_held(),
            }
            continue;
        }
        let sent_at = Instant::now();
        // The attempt may put this runtime in the engine's line, even if its answer never
        // arrives here (the wait cancelled while it is out).
        place.joined = true;
        let answer = match attempt(core, &key, &owner, lease, true).await {
            Ok(answer) => answer,
            // A transient engine error (a failover, a reconnect) while the wait budget lasts:
            // try again shortly. The failed attempt's compensating release carries the old
            // owner token, so the next attempt takes a fresh one.
            Err(err) if err.is_backend() && Instant::now() + ERROR_RETRY < deadline => {
                tracing::debug!(key = %key, error = %err, "attempt failed; retrying within the wait");
                owner = new_owner(core, &terms);
                tokio::time::sleep(ERROR_RETRY).await;
                continue;
            }
            Err(err) => return Err(err),
        };
        match answer {
            Attempt::Acquired { fence } => {
                place.joined = false;
                // Shared holds (readers, permits) do not keep the next head from trying.
                if !terms.mode.is_shared() {
                    queue.mark_held(lease);
                }
                return Ok(Held::new(core, key, owner, fence, terms, sent_at));
            }
            Attempt::Busy { ttl } => {
                let now = Instant::now();
                seen_ttl = ttl.map(|ttl| (ttl, now));
                if now >= deadline {
                    place.give_up().await;
                    return Err(timeout(key, seen_ttl));
                }
                // A lost notification costs at most the holder's remaining TTL. Without a TTL
                // (somebody persisted the key) look again after a short while; without a
                // subscription, poll.
                let mut pause = ttl.unwrap_or(Duration::from_millis(100)).min(FOREVER);
                if !watched {
                    pause = pause.min(POLL_UNWATCHED);
                }
                tokio::select! {
                    _ = freed => {}
                    _ = tokio::time::sleep_until((now + pause).min(deadline)) => {}
                }
                if !watched {
                    let Some(now_watched) = watch(&ticket, &key, deadline).await else {
                        place.give_up().await;
                        return Err(timeout(key, seen_ttl));
                    };
                    watched = now_watched;
                }
            }
        }
    }
}

/// The head waiter's place in the engine's line of processes while it waits: a wait that is
/// cancelled (its future dropped) after it contended leaves the line in the background when
/// no other waiter of this runtime takes over, so that no release is reserved for a process
/// that stopped waiting (a wait that ends by itself leaves through [`give_up`]).
struct LinePlace<'a> {
    core: &'a Arc<Core>,
    ticket: &'a Ticket<Baton>,
    key: String,
    /// An attempt was sent since the last acquisition: the engine may have put this runtime
    /// in line.
    joined: bool,
}

impl LinePlace<'_> {
    /// The wait ends without the lock: leaves the line now (see [`give_up`]), not from the
    /// drop.
    async fn give_up(&mut self) {
        self.joined = false;
        give_up(self.core, self.ticket, &self.key).await;
    }
}

impl Drop for LinePlace<'_> {
    fn drop(&mut self) {
        if self.joined && self.ticket.alone() {
            let (core, key) = (self.core.clone(), std::mem::take(&mut self.key));
            self.core
                .handle
                .spawn(async move { core.backend.leave_line(&key).await });
        }
    }
}

/// The head waiter stops waiting without the lock after it contended in the engine: when no
/// other waiter of this runtime takes over, the engine is told that this process no longer
/// waits (it took a place in the engine's line of processes with its attempts).
async fn give_up(core: &Core, ticket: &Ticket<Baton>, key: &str) {
    if ticket.alone() {
        core.backend.leave_line(key).await;
    }
}
