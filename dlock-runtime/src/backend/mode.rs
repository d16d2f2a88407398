//! What an acquisition asks for: the exclusive lock (a write lock), a read lock, or one permit
//! of a semaphore of `n`.
//!
//! Invariant: the mode travels in the owner token's tag (`-r` a reader, `-s<n>` a permit,
//! nothing the exclusive lock), so every owner-checked path, and every listing of a queue named
//! after owners, knows it without another parameter.

/// An acquisition's mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Mode {
    /// One holder, excluding every other (a write lock is this).
    #[default]
    Exclusive,
    /// Any number of readers together, none while a writer holds or waits.
    Read,
    /// One of at most `n` permits.
    Permits(u32),
}

impl Mode {
    /// The owner token `base` (32 hex digits) tagged with this mode.
    pub(crate) fn tag(self, base: String) -> String {
        match self {
            Mode::Exclusive => base,
            Mode::Read => base + "-r",
            Mode::Permits(n) => format!("{base}-s{n}"),
        }
    }

    /// The mode an owner token was made for (also read from a name that continues after the
    /// token, as ZooKeeper's `lock-<owner>-<sequence>`).
    pub(crate) fn of(owner: &str) -> Mode {
        let Some(tag) = owner.get(32..).and_then(|t| t.strip_prefix('-')) else {
            return Mode::Exclusive;
        };
        if tag == "r" || tag.starts_with("r-") {
            return Mode::Read;
        }
        if let Some(n) = tag.strip_prefix('s') {
            let digits = n.split('-').next().unwrap_or_default();
            if let Ok(n) = digits.parse() {
                return Mode::Permits(n);
            }
        }
        Mode::Exclusive
    }

    /// Whether holders of this mode share the key (readers, permits).
    pub(crate) fn is_shared(self) -> bool {
        !matches!(self, Mode::Exclusive)
    }

    /// How `LockInfo::mode` names it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Read => "read",
            Mode::Permits(_) => "semaphore",
        }
    }
}

/// How many contenders at the front of a queue (etcd, ZooKeeper: in order, by their modes)
/// hold the key now: the first if it is exclusive; the readers before the first writer; the
/// permits among the first N of a semaphore of N.
#[cfg_attr(
    not(any(feature = "etcd", feature = "zookeeper")),
    allow(dead_code, reason = "read by the engines with a queue")
)]
pub(crate) fn holding_now(queue: &[Mode]) -> usize {
    match queue.first() {
        None => 0,
        Some(Mode::Exclusive) => 1,
        Some(Mode::Read) => queue.iter().take_while(|m| **m == Mode::Read).count(),
        Some(Mode::Permits(n)) => queue
            .iter()
            .take(*n as usize)
            .take_while(|m| matches!(m, Mode::Permits(_)))
            .count(),
    }
}

/// Where an entry of a queue stands, seen from the contender asking ([`shared_holds`]).
#[cfg_attr(
    not(any(feature = "etcd", feature = "zookeeper")),
    allow(dead_code, reason = "read by the engines with a queue")
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Position {
    /// The contender's own entry.
    Mine,
    /// Created before it.
    Ahead,
    /// Created after it.
    Behind,
}

/// Whether a reader or a permit of `key` (`mode`) holds, from every entry of its queue (etcd,
/// ZooKeeper: in any order) with its mode and position: a reader when no writer is ahead, a
/// permit of a semaphore of N when fewer than N entries are. `Ok(None)` when its own entry is
/// missing; `InvalidConfig` when a contender of the semaphore asked for another number of
/// permits. (Which of the front entries hold *now*, for inspection, is [`holding_now`].)
#[cfg_attr(
    not(any(feature = "etcd", feature = "zookeeper")),
    allow(dead_code, reason = "read by the engines with a queue")
)]
pub(crate) fn shared_holds(
    key: &str,
    mode: Mode,
    queue: impl IntoIterator<Item = (Mode, Position)>,
) -> Result<Option<bool>, crate::error::LockError> {
    let mut earlier = 0usize;
    let mut writer_ahead = false;
    let mut present = false;
    for (other, position) in queue {
        if let (Mode::Permits(asked), Mode::Permits(held)) = (mode, other)
            && asked != held
        {
            return Err(permits_mismatch(key, asked, held));
        }
        match position {
            Position::Mine => present = true,
            Position::Ahead => {
                earlier += 1;
                writer_ahead |= other == Mode::Exclusive;
            }
            Position::Behind => {}
        }
    }
    if !present {
        return Ok(None);
    }
    Ok(Some(match mode {
        Mode::Permits(n) => earlier < n as usize,
        _ => !writer_ahead,
    }))
}

/// `InvalidConfig` for a semaphore asked with `asked` permits while its holders use `held`.
pub(crate) fn permits_mismatch(key: &str, asked: u32, held: u32) -> crate::error::LockError {
    crate::error::LockError::config(format!(
        "semaphore `{key}` asked with {asked} permits while its holders use {held}: \
         every holder of a semaphore must ask for the same number"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn the_front_of_a_queue_holds_by_its_modes() {
        use Mode::{Exclusive, Permits, Read};
        assert_eq!(holding_now(&[]), 0);
        assert_eq!(holding_now(&[Exclusive, Read, Read]), 1);
        assert_eq!(holding_now(&[Read, Read, Exclusive, Read]), 2);
        assert_eq!(holding_now(&[Permits(2), Permits(2), Permits(2)]), 2);
        assert_eq!(holding_now(&[Permits(3), Permits(3)]), 2);
    }

    #[test]
    fn a_reader_holds_with_no_writer_ahead_and_a_permit_among_the_first_n() {
        use Mode::{Exclusive, Permits, Read};
        use Position::{Ahead, Behind, Mine};
        let holds = |mode, queue: &[(Mode, Position)]| {
            shared_holds("k", mode, queue.iter().copied()).map_err(|e| e.to_string())
        };
        assert_eq!(holds(Read, &[(Read, Ahead), (Read, Mine)]), Ok(Some(true)));
        assert_eq!(
            holds(Read, &[(Exclusive, Ahead), (Read, Mine)]),
            Ok(Some(false))
        );
        assert_eq!(
            holds(Read, &[(Read, Mine), (Exclusive, Behind)]),
            Ok(Some(true))
        );
        let semaphore = [(Permits(2), Ahead), (Permits(2), Ahead), (Permits(2), Mine)];
        assert_eq!(holds(Permits(2), &semaphore), Ok(Some(false)));
        assert_eq!(holds(Permits(2), &semaphore[1..]), Ok(Some(true)));
        assert_eq!(holds(Read, &[(Read, Ahead)]), Ok(None), "its entry is gone");
        let refused = holds(Permits(2), &[(Permits(3), Behind), (Permits(2), Mine)]);
        assert!(refused.is_err_and(|e| e.contains("asked with 2 permits while its holders use 3")));
    }

    #[test]
    fn the_mode_round_trips_through_the_owner_token() {
        for mode in [
            Mode::Exclusive,
            Mode::Read,
            Mode::Permits(1),
            Mode::Permits(80),
        ] {
            let owner = mode.tag(BASE.to_owned());
            assert_eq!(Mode::of(&owner), mode, "{owner}");
            // As ZooKeeper's node names continue it.
            assert_eq!(Mode::of(&format!("{owner}-0000000042")), mode, "{owner}");
        }
        assert_eq!(Mode::of("short"), Mode::Exclusive);
    }
}
