//! The memory engine's state, under its one mutex: the locks by key, one fence counter, the
//! readers' and semaphores' holders, and the writer-waiting marks.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::mode::Mode;

#[derive(Debug)]
pub(super) struct Entry {
    pub(super) owner: String,
    pub(super) count: u64,
    pub(super) fence: u64,
    pub(super) expires: Instant,
}

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) locks: HashMap<String, Entry>,
    /// One counter for every key: strictly increasing per key, and no per-key state to leak.
    pub(super) fence: u64,
    /// Read locks by key (see `shared.rs`).
    pub(super) readers: HashMap<String, Group>,
    /// Semaphores by key.
    pub(super) permits: HashMap<String, Group>,
    /// The writer waiting for each key's readers, and until when its mark holds.
    pub(super) writer_waiting: HashMap<String, (String, Instant)>,
}

/// How long a writer that found readers keeps new readers out without asking again; it asks
/// again (on every release, and at least every half of this) while it waits.
pub(super) const WRITER_WAITING: Duration = Duration::from_secs(2);

/// The shared holders of one key.
#[derive(Debug, Default)]
pub(super) struct Group {
    /// The semaphore's size (0 for readers).
    pub(super) permits: u32,
    pub(super) holders: HashMap<String, Entry>,
}

impl Group {
    fn sweep(&mut self, now: Instant) {
        self.holders.retain(|_, e| e.expires > now);
    }

    /// The earliest expiry of a holder, from `now`.
    pub(super) fn first_ttl(&self, now: Instant) -> Option<Duration> {
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
    /// The live entry for `key`, dropping it when its lease has run out.
    pub(super) fn live(&mut self, key: &str, now: Instant) -> Option<&mut Entry> {
        if self.locks.get(key).is_some_and(|e| e.expires <= now) {
            self.locks.remove(key);
        }
        self.locks.get_mut(key)
    }

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
