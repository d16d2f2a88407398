//! One acquire request of a fresh acquisition: its owner token, chosen before the request is
//! sent, and its compensation (an owner-checked release scheduled if the answer never
//! arrives, a no-op if the request never landed).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Attempt, Backend};
use crate::baton::Baton;
use crate::core::Core;
use crate::error::LockError;
use crate::held::Terms;
use crate::release::ReleaseOnDrop;
use crate::wait::Ticket;

/// Pause before a waiter retries after an engine error.
pub(crate) const ERROR_RETRY: Duration = Duration::from_millis(100);

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
pub(crate) async fn attempt(
    core: &Arc<Core>,
    key: &str,
    owner: &str,
    lease: Duration,
    waiting: bool,
) -> Result<Attempt, LockError> {
    if waiting {
        let request = core.backend.try_acquire_waiting(key, owner, lease);
        compensated(core, key, owner, request).await
    } else {
        let request = core.backend.try_acquire(key, owner, lease);
        compensated(core, key, owner, request).await
    }
}

/// Runs one acquire request; if its answer never arrives (error, timeout, or the future is
/// dropped), schedules an owner-checked release with the same token.
pub(crate) async fn compensated<T>(
    core: &Arc<Core>,
    key: &str,
    owner: &str,
    request: impl Future<Output = Result<T, LockError>>,
) -> Result<T, LockError> {
    let compensate = ReleaseOnDrop::compensate(&core.releaser, key, owner);
    let result = request.await;
    if result.is_ok() {
        compensate.disarm();
    }
    result
}

/// Asks for "may be free" notifications on `key`: `Some(true)` when they flow, `Some(false)`
/// when the engine refused (the waiter then polls within its budget rather than failing), `None`
/// when the deadline passed first.
pub(crate) async fn watch(ticket: &Ticket<Baton>, key: &str, deadline: Instant) -> Option<bool> {
    match tokio::time::timeout_at(deadline, ticket.ensure_watched()).await {
        Ok(Ok(())) => Some(true),
        Ok(Err(err)) => {
            tracing::debug!(key = %key, error = %err, "no notifications for this key; polling within the wait");
            Some(false)
        }
        Err(_) => None,
    }
}

/// The timeout of an acquisition of `key` that started at `started`, whose last busy answer
/// (if any) gave the holder's TTL `seen` and came at the instant beside it.
pub(crate) fn timed_out(
    key: String,
    started: Instant,
    seen: Option<(Duration, Instant)>,
) -> LockError {
    LockError::Timeout {
        key,
        waited: started.elapsed(),
        holder_ttl: seen.map(|(ttl, at)| ttl.saturating_sub(at.elapsed())),
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
