//! A fresh acquisition: one owner-checked attempt (compensated if its answer is lost), the
//! engine's own queue where it has one, else the local queue of waiters behind one head that
//! contends with the engine, woken by notifications.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::LockError;
use crate::backend::{Attempt, Fairness, Queued, Queueing};
use crate::core::{Core, ReleaseOnDrop};
use crate::handoff::Head;
use crate::held::{Held, Terms};
use crate::wait::Ticket;

/// Pause before a waiter retries after an engine error.
pub(crate) const ERROR_RETRY: Duration = Duration::from_millis(100);

/// How often a waiter without notifications (the engine refused the subscription) looks
/// again, and asks for the subscription again.
const POLL_UNWATCHED: Duration = Duration::from_millis(200);

/// Longest deadline the runtime computes; a larger `wait` means "until acquired".
pub(crate) const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// An owner token, chosen before any request is sent: 32 hex digits, the runtime's id (16,
/// the engines' "runtime id") then 64 random bits. The Redis engine reads the prefix to tell a
/// holder of the waiter's own runtime, whose release wakes the waiter without a message.
/// The mode is appended as a tag (see [`Mode`](crate::backend::mode::Mode)).
pub(crate) fn new_owner(core: &Core, terms: &Terms) -> String {
    let mut token = String::with_capacity(48);
    push_hex(&mut token, core.id);
    push_hex(&mut token, rand::random::<u64>());
    terms.mode.tag(token)
}

/// Appends `n` as 16 lowercase hex digits (what `{:016x}` writes, without the formatting
/// machinery: this runs on every acquisition).
fn push_hex(out: &mut String, n: u64) {
    let mut digits = [0u8; 16];
    digits[..8].copy_from_slice(&hex_word((n >> 32) as u32));
    digits[8..].copy_from_slice(&hex_word(n as u32));
    // Every byte is an ASCII hex digit: always valid UTF-8.
    out.push_str(std::str::from_utf8(&digits).unwrap_or_default());
}

/// The 8 lowercase hex digits of `word`, most significant first, computed on all of them at
/// once (a byte a nibble, then `'0'` or `'a' - 10` added a byte) rather than a digit at a time.
fn hex_word(word: u32) -> [u8; 8] {
    let x = u64::from(word);
    // Spread the nibbles, one a byte, most significant in the highest byte.
    let x = ((x & 0xffff_0000) << 16) | (x & 0xffff);
    let x = ((x & 0x0000_ff00_0000_ff00) << 8) | (x & 0x0000_00ff_0000_00ff);
    let x = ((x & 0x00f0_00f0_00f0_00f0) << 4) | (x & 0x000f_000f_000f_000f);
    // 1 in each byte whose nibble is 10 or more (adding 6 carries it into bit 4).
    let letters = ((x + 0x0606_0606_0606_0606) >> 4) & 0x0101_0101_0101_0101;
    (x + 0x3030_3030_3030_3030 + letters * 0x27).to_be_bytes()
}

/// One owner-checked attempt; if the answer never arrives (error, timeout, or the future is
/// dropped), a compensating release with the same owner token is scheduled, which is a no-op
/// if the request never landed.
/// `waiting`: the attempt of a waiter at the head of its local queue (the engine is asked to
/// notify it when the key is released), not the first attempt of an acquisition.
async fn attempt(
    core: &Arc<Core>,
    key: &str,
    owner: &str,
    lease: Duration,
    waiting: bool,
) -> Result<Attempt, LockError> {
    let request = if waiting {
        core.backend.try_acquire_waiting(key, owner, lease)
    } else {
        core.backend.try_acquire(key, owner, lease)
    };
    compensated(core, key, owner, request).await
}

/// Runs one acquire request; if its answer never arrives (error, timeout, or the future is
/// dropped), schedules an owner-checked release with the same token.
pub(crate) async fn compensated<T>(
    core: &Arc<Core>,
    key: &str,
    owner: &str,
    request: impl Future<Output = Result<T, LockError>>,
) -> Result<T, LockError> {
    let compensate = ReleaseOnDrop::compensate(core, key, owner);
    let result = request.await;
    if result.is_ok() {
        compensate.disarm();
    }
    result
}

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
    let timeout = |key: String, holder_ttl: Option<Duration>| {
        core.busy.note(&key, holder_ttl);
        LockError::Timeout {
            key,
            waited: started.elapsed(),
        }
    };

    // A fair lock waits in the engine's line where the engine keeps one for it.
    if terms.fair && core.backend.fairness() == Fairness::Queue {
        return Box::pin(crate::fair::acquire(
            core, key, owner, terms, started, deadline,
        ))
        .await;
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
        let Some(request) = core.backend.acquire_queued(&key, &owner, ask) else {
            break None;
        };
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
    Box::pin(wait_in_queue(core, key, owner, terms, started, deadline)).await
}

/// Queues locally; the head of the queue subscribes and contends until `deadline`.
async fn wait_in_queue(
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
    let timeout = |key: String, seen_ttl: Option<(Duration, Instant)>| {
        let holder_ttl = seen_ttl.map(|(ttl, at)| ttl.saturating_sub(at.elapsed()));
        core.busy.note(&key, holder_ttl);
        LockError::Timeout {
            key,
            waited: started.elapsed(),
        }
    };
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
    ticket: &'a Ticket,
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
async fn give_up(core: &Core, ticket: &Ticket, key: &str) {
    if ticket.alone() {
        core.backend.leave_line(key).await;
    }
}

/// Asks for "may be free" notifications on `key`: `Some(true)` when they flow, `Some(false)`
/// when the engine refused (the waiter then polls within its budget rather than failing), `None`
/// when the deadline passed first.
pub(crate) async fn watch(ticket: &Ticket, key: &str, deadline: Instant) -> Option<bool> {
    match tokio::time::timeout_at(deadline, ticket.ensure_watched()).await {
        Ok(Ok(())) => Some(true),
        Ok(Err(err)) => {
            tracing::debug!(key = %key, error = %err, "no notifications for this key; polling within the wait");
            Some(false)
        }
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::push_hex;

    #[test]
    fn hex_digits_are_those_of_the_formatter() {
        for n in [
            0,
            1,
            0xf,
            0x10,
            0xdead_beef,
            u64::MAX - 1,
            u64::MAX,
            0x0123_4567_89ab_cdef,
            0xfedc_ba98_7654_3210,
            0x9a9a_0909_afaf_f0f0,
        ]
        .into_iter()
        .chain((0..1000).map(|_| rand::random::<u64>()))
        {
            let mut out = String::from("x");
            push_hex(&mut out, n);
            assert_eq!(out, format!("x{n:016x}"));
        }
    }
}
