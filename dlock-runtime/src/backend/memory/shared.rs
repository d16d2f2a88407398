//! Read locks and semaphore permits in the memory engine: per key, the live readers (or
//! permit holders) by owner, each with its own expiry and fence; and the writer-waiting mark
//! that makes new readers queue behind a writer.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::state::{Entry, Group, State};
use crate::backend::mode::{Mode, permits_mismatch};
use crate::backend::{Attempt, Released};
use crate::error::LockError;

/// A reader's or a permit's attempt.
pub(super) fn acquire(
    state: &mut State,
    key: &str,
    owner: &str,
    lease: Duration,
    mode: Mode,
    now: Instant,
) -> Result<Attempt, LockError> {
    if mode == Mode::Read {
        // A writer holds: wait for its release.
        if let Some(entry) = state.live(key, now) {
            return Ok(Attempt::Busy {
                ttl: Some(entry.expires.saturating_duration_since(now)),
            });
        }
        // A writer waits: queue behind it (unless this reader already holds).
        let holds = state
            .group(key, mode, now)
            .is_some_and(|g| g.holders.contains_key(owner));
        if let Some(until) = state.writer_waiting.get(key).map(|(_, until)| *until)
            && until > now
            && !holds
        {
            return Ok(Attempt::Busy {
                ttl: Some(until - now),
            });
        }
    }
    let permits = match mode {
        Mode::Permits(n) => n,
        _ => 0,
    };
    if let Some(group) = state.group(key, mode, now) {
        if group.permits != permits {
            return Err(permits_mismatch(key, permits, group.permits));
        }
        if let Some(entry) = group.holders.get_mut(owner) {
            entry.count += 1;
            entry.expires = now + lease;
            return Ok(Attempt::Acquired {
                fence: Some(entry.fence),
            });
        }
        if permits > 0 && group.holders.len() >= permits as usize {
            return Ok(Attempt::Busy {
                ttl: group.first_ttl(now),
            });
        }
    }
    state.fence += 1;
    let fence = state.fence;
    let map = match mode {
        Mode::Permits(_) => &mut state.permits,
        _ => &mut state.readers,
    };
    let group = map.entry(key.to_owned()).or_insert_with(|| Group {
        permits,
        holders: HashMap::new(),
    });
    group.holders.insert(
        owner.to_owned(),
        Entry {
            owner: owner.to_owned(),
            count: 1,
            fence,
            expires: now + lease,
        },
    );
    Ok(Attempt::Acquired { fence: Some(fence) })
}

/// A reader's or a permit's release.
pub(super) fn release(
    state: &mut State,
    key: &str,
    owner: &str,
    mode: Mode,
    now: Instant,
) -> Released {
    let Some(group) = state.group(key, mode, now) else {
        return Released::NotOwner;
    };
    let Some(entry) = group.holders.get_mut(owner) else {
        return Released::NotOwner;
    };
    entry.count -= 1;
    if entry.count > 0 {
        return Released::StillHeld;
    }
    group.holders.remove(owner);
    // Sweeps the group away when it was the last.
    state.group(key, mode, now);
    Released::Freed
}

/// Renews a reader or a permit; `false` when it is no longer held.
pub(super) fn renew(
    state: &mut State,
    key: &str,
    owner: &str,
    lease: Duration,
    now: Instant,
) -> bool {
    match state
        .group(key, Mode::of(owner), now)
        .and_then(|g| g.holders.get_mut(owner))
    {
        Some(entry) => {
            entry.expires = now + lease;
            true
        }
        None => false,
    }
}
