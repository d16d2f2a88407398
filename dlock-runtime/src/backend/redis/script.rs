//! The Lua scripts (`lua/*.lua`, each with its KEYS/ARGV/return comment block) and how they are
//! run: `EVALSHA` routed by the first key; when the node does not have the script (first use,
//! `SCRIPT FLUSH`, a restart, a failover) `EVAL` on that same node, which also caches it there.
//! (A `SCRIPT LOAD` would go to every node of a cluster and wait for all.)

use std::cell::Cell;
use std::time::Duration;

use redis::Script;

use crate::backend::Attempt;

/// The sources, each with its comment block (KEYS, ARGV, return values); the scripts that
/// reserve a block of fencing tokens start with `lua/fence_block.lua`, the one copy of it.
pub(crate) const ACQUIRE_LUA: &str = concat!(
    include_str!("lua/fence_block.lua"),
    include_str!("lua/acquire.lua")
);
pub(crate) const FLOOR_LUA: &str = include_str!("lua/floor.lua");
pub(crate) const RENEW_LUA: &str = include_str!("lua/renew.lua");
pub(crate) const RELEASE_LUA: &str = include_str!("lua/release.lua");
pub(crate) const EXTEND_LUA: &str = concat!(
    include_str!("lua/fence_block.lua"),
    include_str!("lua/extend.lua")
);
pub(crate) const HOLD_LUA: &str = include_str!("lua/hold.lua");
pub(crate) const FORCE_UNLOCK_LUA: &str = include_str!("lua/force_unlock.lua");
pub(crate) const INSPECT_LUA: &str = include_str!("lua/inspect.lua");
pub(crate) const READ_ACQUIRE_LUA: &str = include_str!("lua/read_acquire.lua");
pub(crate) const READ_RELEASE_LUA: &str = include_str!("lua/read_release.lua");
pub(crate) const PERMIT_ACQUIRE_LUA: &str = include_str!("lua/permit_acquire.lua");
pub(crate) const PERMIT_RELEASE_LUA: &str = include_str!("lua/permit_release.lua");
pub(crate) const SHARED_RENEW_LUA: &str = include_str!("lua/shared_renew.lua");
pub(crate) const ACQUIRE_ALL_LUA: &str = include_str!("lua/acquire_all.lua");
pub(crate) const FAIR_ACQUIRE_LUA: &str = concat!(
    include_str!("lua/fence_block.lua"),
    include_str!("lua/fair_acquire.lua")
);
pub(crate) const FAIR_LEAVE_LUA: &str = include_str!("lua/fair_leave.lua");

/// One script: its name (for messages), source and SHA1.
pub(super) struct Lua {
    pub(super) name: &'static str,
    pub(super) sha: String,
    pub(super) src: &'static str,
}

impl Lua {
    fn new(name: &'static str, src: &'static str) -> Self {
        Self {
            name,
            sha: Script::new(src).get_hash().to_owned(),
            src,
        }
    }
}

pub(super) struct Scripts {
    pub(super) acquire: Lua,
    pub(super) floor: Lua,
    pub(super) renew: Lua,
    pub(super) release: Lua,
    pub(super) extend: Lua,
    pub(super) hold: Lua,
    pub(super) force_unlock: Lua,
    pub(super) inspect: Lua,
    pub(super) read_acquire: Lua,
    pub(super) read_release: Lua,
    pub(super) permit_acquire: Lua,
    pub(super) permit_release: Lua,
    pub(super) shared_renew: Lua,
    pub(super) acquire_all: Lua,
    pub(super) fair_acquire: Lua,
    pub(super) fair_leave: Lua,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Self {
            acquire: Lua::new("acquire", ACQUIRE_LUA),
            floor: Lua::new("fence floor", FLOOR_LUA),
            renew: Lua::new("renew", RENEW_LUA),
            release: Lua::new("release", RELEASE_LUA),
            extend: Lua::new("extend", EXTEND_LUA),
            hold: Lua::new("hold", HOLD_LUA),
            force_unlock: Lua::new("force-unlock", FORCE_UNLOCK_LUA),
            inspect: Lua::new("inspect", INSPECT_LUA),
            read_acquire: Lua::new("read acquire", READ_ACQUIRE_LUA),
            read_release: Lua::new("read release", READ_RELEASE_LUA),
            permit_acquire: Lua::new("permit acquire", PERMIT_ACQUIRE_LUA),
            permit_release: Lua::new("permit release", PERMIT_RELEASE_LUA),
            shared_renew: Lua::new("shared renew", SHARED_RENEW_LUA),
            acquire_all: Lua::new("acquire all", ACQUIRE_ALL_LUA),
            fair_acquire: Lua::new("fair acquire", FAIR_ACQUIRE_LUA),
            fair_leave: Lua::new("fair leave", FAIR_LEAVE_LUA),
        }
    }
}

/// How long the fence counter outlives the last lock on its key (every acquisition and renewal
/// pushes its expiry to this after the lease). Once it has expired, the next token starts at
/// the server clock in microseconds (see `lua/acquire.lua` for the bound that gives).
pub(super) const FENCE_TTL: Duration = Duration::from_secs(600);

/// Fencing tokens one acquisition reserves (`INCRBY`): the first is the holder's, the others go
/// to waiters of the same runtime that it hands the lock to without a round trip (at most
/// this many holders per acquisition, so at most this many before the runtime releases in
/// Redis and waiters of other processes get their turn). A turn of a key busy in several
/// processes is that long: the switch to the next process (a release, a message, an attempt,
/// a wake-up in another process) is paid once a block; blocks of 16 cost the benchmark's
/// 4-process hot key a fifth of its rate, while 64 keep the others' longest wait at a few
/// tens of milliseconds.
pub(crate) const FENCE_BLOCK: u64 = 64;

/// How long a flagged release reserves the key for the runtime first in line (see
/// `lua/release.lua`): long enough for a published message and one attempt; should it be
/// gone, the key is free again after this.
pub(super) const RESERVATION: Duration = Duration::from_millis(50);

/// How long a writer that found readers keeps new readers out without asking again; it asks
/// again on every release it is told of, and at least every half of this.
pub(super) const WRITER_WAITING: Duration = Duration::from_secs(2);

/// The lowest value a fence counter that was not recreated can hold: counters start at the
/// server clock in microseconds (2001-09-09 in microseconds is 10^15), so a value below this
/// was drawn from a counter recreated from zero (first use, expired, the server lost its data)
/// and is raised to the clock first (`lua/floor.lua`, or inside `lua/acquire.lua`).
pub(crate) const FENCE_FLOOR_MIN: i64 = 1_000_000_000_000_000;

/// The acquire script's one-integer answer (see `lua/acquire.lua`): a grant carries the last
/// token of a block of `block`, and the holder's fence is the block's first.
pub(super) fn decode_acquire(reply: i64, block: u64) -> Attempt {
    match reply {
        last @ 1.. => Attempt::Acquired {
            fence: u64::try_from(last)
                .ok()
                .map(|last| last.saturating_sub(block.saturating_sub(1)).max(1)),
        },
        -1 | 0 => Attempt::Busy { ttl: None },
        busy => Attempt::Busy {
            ttl: u64::try_from(-2 - busy).ok().map(Duration::from_millis),
        },
    }
}

/// Milliseconds, rounded up (Redis TTLs have millisecond resolution; never round a lease down).
pub(super) fn millis_ceil(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX).max(1)
}

/// A kept command is at most this many arguments (the scripts' usual count; a large renewal
/// batch's command is dropped, not kept).
const SPARE_ARGS: usize = 16;

thread_local! {
    /// The command of the last script call on this thread that gave it back, for the next
    /// call to write into (its two buffers reused: no allocation a call).
    static SPARE: Cell<Option<redis::Cmd>> = const { Cell::new(None) };
}

/// An empty command: this thread's spare one, else a new one sized for the scripts'
/// arguments (no reallocation while they are written).
pub(super) fn spare_command() -> redis::Cmd {
    match SPARE.try_with(Cell::take) {
        Ok(Some(mut cmd)) => {
            cmd.clear();
            cmd
        }
        _ => redis::Cmd::with_capacity(SPARE_ARGS, 256),
    }
}

/// Gives `cmd` back for the next [`spare_command`] of this thread, if it is not a large one.
pub(super) fn keep_command(cmd: redis::Cmd) {
    if cmd.args_iter().len() <= SPARE_ARGS {
        // After the thread's storage is gone the command is just dropped.
        let _ = SPARE.try_with(|spare| spare.set(Some(cmd)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_answers_decode() {
        assert_eq!(
            decode_acquire(1_795_246_357_831_253, 1),
            Attempt::Acquired {
                fence: Some(1_795_246_357_831_253)
            }
        );
        assert_eq!(
            decode_acquire(1_795_246_357_831_268, 16),
            Attempt::Acquired {
                fence: Some(1_795_246_357_831_253)
            }
        );
        assert_eq!(decode_acquire(-1, 16), Attempt::Busy { ttl: None });
        assert_eq!(
            decode_acquire(-2, 16),
            Attempt::Busy {
                ttl: Some(Duration::ZERO)
            }
        );
        assert_eq!(
            decode_acquire(-2 - 29_500, 16),
            Attempt::Busy {
                ttl: Some(Duration::from_millis(29_500))
            }
        );
    }

    #[test]
    fn a_spare_command_comes_back_empty_and_a_large_one_is_not_kept() {
        let mut cmd = spare_command();
        cmd.arg("EVALSHA").arg("abc").arg(1).arg("dlock:{k}");
        keep_command(cmd);
        let cmd = spare_command();
        assert_eq!(cmd.args_iter().len(), 0);
        assert_eq!(
            cmd.get_packed_command(),
            redis::Cmd::new().get_packed_command()
        );

        let mut large = spare_command();
        for i in 0..=SPARE_ARGS {
            large.arg(i);
        }
        keep_command(large);
        assert!(SPARE.with(|spare| spare.take().is_none()));
    }

    #[test]
    fn the_scripts_that_reserve_fences_share_one_copy_of_the_reservation() {
        for src in [ACQUIRE_LUA, EXTEND_LUA, FAIR_ACQUIRE_LUA] {
            assert!(src.starts_with(include_str!("lua/fence_block.lua")));
            assert_eq!(src.matches("'INCRBY'").count(), 1, "{src}");
            assert!(src.contains("return reserve_block(KEYS[2], ARGV[5], ARGV[4], ARGV[3]"));
        }
    }

    #[test]
    fn leases_round_up_to_whole_milliseconds() {
        assert_eq!(millis_ceil(Duration::from_micros(1)), 1);
        assert_eq!(millis_ceil(Duration::from_micros(1500)), 2);
        assert_eq!(millis_ceil(Duration::from_secs(30)), 30_000);
        assert_eq!(millis_ceil(Duration::MAX), u64::MAX);
    }
}
