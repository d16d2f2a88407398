//! Engine naming rules, exposed for the end-to-end tests so that they check the library's own
//! rules instead of a copy. Not a public API: names and signatures here change without notice.

/// The Redis Cluster hash slot of `key` (CRC16/XMODEM of its hash tag, mod 16384).
#[cfg(feature = "redis")]
pub fn hash_slot(key: &[u8]) -> u16 {
    crate::backend::redis::hash_slot(key)
}

/// The Redis names of `key` under `prefix`: lock, fence counter, release channel, and the line
/// of runtimes waiting for their turn.
#[cfg(feature = "redis")]
pub fn redis_names(prefix: &str, key: &str) -> [String; 4] {
    let names = crate::backend::redis::Names::new(prefix);
    [
        names.lock(key),
        names.fence(key),
        names.channel(key),
        names.turns(key),
    ]
}

/// The Redis names of a fair lock's line for `key` under `prefix`: the queue of waiters and
/// the deadlines of their places.
#[cfg(feature = "redis")]
pub fn redis_fair_names(prefix: &str, key: &str) -> [String; 2] {
    let names = crate::backend::redis::Names::new(prefix);
    [names.fair_queue(key), names.fair_places(key)]
}

/// A user key as the one ZooKeeper path segment the engine stores it under.
#[cfg(feature = "zookeeper")]
pub fn zookeeper_segment(key: &str) -> String {
    crate::backend::zookeeper::path_segment(key)
}

/// The Lua scripts of the Redis engine, as the engine sends them (for tests of the scripts
/// themselves and for the benchmark's raw-script baseline).
#[cfg(feature = "redis")]
pub mod scripts {
    use crate::backend::redis::script;

    /// `acquire.lua` (a waiter's attempt; the first attempt is a plain pipeline).
    pub const ACQUIRE: &str = script::ACQUIRE_LUA;
    /// `acquire_all.lua` (several keys at once, all or nothing).
    pub const ACQUIRE_ALL: &str = script::ACQUIRE_ALL_LUA;
    /// `floor.lua`.
    pub const FLOOR: &str = script::FLOOR_LUA;
    /// Tokens one acquisition reserves: at most this many holders of one runtime in a row.
    pub const FENCE_BLOCK: u64 = crate::backend::redis::FENCE_BLOCK;
    /// The lowest value of a fence counter that was not recreated (`acquire.lua`'s `ARGV[4]`).
    pub const FENCE_FLOOR_MIN: i64 = script::FENCE_FLOOR_MIN;
    /// `renew.lua`.
    pub const RENEW: &str = script::RENEW_LUA;
    /// `release.lua`.
    pub const RELEASE: &str = script::RELEASE_LUA;
    /// `extend.lua`.
    pub const EXTEND: &str = script::EXTEND_LUA;
    /// `read_acquire.lua`.
    pub const READ_ACQUIRE: &str = script::READ_ACQUIRE_LUA;
    /// `read_release.lua`.
    pub const READ_RELEASE: &str = script::READ_RELEASE_LUA;
    /// `fair_acquire.lua`.
    pub const FAIR_ACQUIRE: &str = script::FAIR_ACQUIRE_LUA;
    /// `fair_leave.lua`.
    pub const FAIR_LEAVE: &str = script::FAIR_LEAVE_LUA;
    /// `force_unlock.lua`.
    pub const FORCE_UNLOCK: &str = script::FORCE_UNLOCK_LUA;
}
