//! Read locks and semaphore permits in the memory engine: per key, the live readers (or
//! permit holders) by owner, each with its own expiry and fence; and the writer-waiting mark
//! that makes new readers queue behind a writer.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::{Entry, MemoryBackend, State};
use crate::backend::mode::{Mode, permits_mismatch};
use crate::backend::{Attempt, Released};
use crate::error::LockError;

/// How long a writer that found readers keeps new readers out without asking again; it asks
/// again (on every release, and at least every half of this) while it waits.
pub(super) const WRITER_WAITING: Duration = Duration::from_secs(2);

/// The shared holders of one key.
#[derive(Debug, Default)]
pub(super) struct Group {
    /// The semaphore's size (0 for readers).
    permits: u32,
    holders: HashMap<String, Entry>,
}

impl Group {
    fn sweep(&mut self, now: Instant) {
        self.holders.retain(|_, e| e.expires > now);
    }

    /// The earliest expiry of a holder, from `now`.
    fn first_ttl(&self, now: Instant) -> Option<Duration> {
        self.holders
            .values()
            .map(|e| e.expires.saturating_duration_since(now))
            .min()
    }

    /// The latest expiry of a holder, from `now`.
    pub(super) fn last_ttl(&self, now: Instant) -> Option<Duration> {
        self.holders
            .values()
            .map(|e| e.expires.saturating_duration_since(now))
            .max()
    }

    pub(super) fn holders(&self) -> impl Iterator<Item = &Entry> {
        self.holders.values()
    }
}

impl State {
    /// The live shared group of `key` in `mode`'s map, swept; `None` when empty.
    pub(super) fn group(&mut self, key: &str, mode: Mode, now: Instant) -> Option<&mut Group> {
        let map = match mode {
            Mode::Permits(_) => &mut self.permits,
            _ => &mut self.readers,
        };
        let empty = map.get_mut(key).is_some_and(|g| {
            g.sweep(now);
            g.holders.is_empty()
        });
        if empty {
            map.remove(key);
        }
        map.get_mut(key)
    }

    /// Whether readers hold `key` now: an exclusive attempt finding them marks a writer
    /// waiting (`owner`, when it waits) and answers when to look again.
    pub(super) fn readers_block(
        &mut self,
        key: &str,
        owner: &str,
        waiting: bool,
        now: Instant,
    ) -> Option<Duration> {
        let ttl = self.group(key, Mode::Read, now)?.first_ttl(now)?;
        if waiting {
            self.writer_waiting
                .insert(key.to_owned(), (owner.to_owned(), now + WRITER_WAITING));
        }
        Some(ttl.min(WRITER_WAITING / 2))
    }

    /// Forgets the writer-waiting mark of `key` if `owner` set it (or in any case).
    pub(super) fn clear_writer_waiting(&mut self, key: &str, owner: Option<&str>) {
        if self
            .writer_waiting
            .get(key)
            .is_some_and(|(by, _)| owner.is_none_or(|o| o == by))
        {
            self.writer_waiting.remove(key);
        }
    }
}

impl MemoryBackend {
    /// A reader's or a permit's attempt.
    pub(super) fn acquire_shared(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
        mode: Mode,
    ) -> Result<Attempt, LockError> {
        let now = Instant::now();
        let mut state = self.state();
        if mode == Mode::Read {
            // A writer holds: wait for its release.
            if let Some(entry) = Self::live(&mut state, key, now) {
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
    pub(super) fn release_shared(&self, key: &str, owner: &str, mode: Mode) -> Released {
        let now = Instant::now();
        let mut state = self.state();
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
    pub(super) fn renew_shared(
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
}
