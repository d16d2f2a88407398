//! Each engine's limits as the tests count on them: the shortest lease a holder keeps alive,
//! how soon a dead holder's lock is free, how much an engine restart may extend that, and how
//! soon a release wakes a waiter. One table, read by the conformance suite
//! (`tests/tests/conformance/fixture.rs`) and the torture program (`torture/src/engine.rs`),
//! so that the two cannot drift apart; what differs between them is which row field they use.

use std::time::Duration;

/// The session timeout ZooKeeper holders are given where a dead holder must be freed quickly
/// (the torture workers ask for it; the conformance suite's engine-down server grants no more).
/// The test server's minimum is [`MIN_SESSION_TIMEOUT`](crate::zookeeper::MIN_SESSION_TIMEOUT).
pub const ZOOKEEPER_SESSION: Duration = Duration::from_secs(2);

/// etcd's default election timeout, which the test servers keep.
pub const ETCD_ELECTION_TIMEOUT: Duration = Duration::from_secs(1);

/// The limits of one engine (one constant per engine below).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineLimits {
    /// The shortest lease one holder is tested with (the watchdog renewing it every third):
    /// 1 s; 2 s on etcd (whole seconds, raised to a 2 s server minimum) and ZooKeeper (a
    /// renewal checks the session).
    pub short_lease: Duration,
    /// The shortest lease of many holders contending on a few keys (the torture program's
    /// workers): `short_lease`, and 2 s on Redlock, whose validity must stay above half the
    /// lease after a vote bounded by the node timeout.
    pub contended_lease: Duration,
    /// After this long a holder that died holding a `contended_lease` lock has lost it: the
    /// lease, or on ZooKeeper the session ([`ZOOKEEPER_SESSION`]), whose end deletes the
    /// holder's node.
    pub dead_holder: Duration,
    /// How much longer a dead holder's lock may live when the engine restarts: etcd's new
    /// leader extends every lease by its election timeout ([`ETCD_ELECTION_TIMEOUT`]; a 2 s
    /// lease of a holder killed just before a restart was measured alive 3.1-3.4 s after it);
    /// zero elsewhere.
    pub restart_extends: Duration,
    /// Bound from a release to a waiter (on another runtime) holding the key, far below the
    /// holder's lease: 200 ms on memory and one Redis, 500 ms where a notification crosses
    /// more (a Cluster shard's sharded pub/sub, three Redlock nodes, a watch in etcd or
    /// ZooKeeper).
    pub wake_within: Duration,
}

const ONE_SECOND: EngineLimits = EngineLimits {
    short_lease: Duration::from_secs(1),
    contended_lease: Duration::from_secs(1),
    dead_holder: Duration::from_secs(1),
    restart_extends: Duration::ZERO,
    wake_within: Duration::from_millis(200),
};

/// `memory://`: in-process.
pub const MEMORY: EngineLimits = ONE_SECOND;

/// `redis://`: one `redis-server`.
pub const REDIS: EngineLimits = ONE_SECOND;

/// `redis+cluster://`: three masters, each with a replica.
pub const CLUSTER: EngineLimits = EngineLimits {
    wake_within: Duration::from_millis(500),
    ..ONE_SECOND
};

/// `redlock://`: three independent `redis-server`s.
pub const REDLOCK: EngineLimits = EngineLimits {
    contended_lease: Duration::from_secs(2),
    dead_holder: Duration::from_secs(2),
    wake_within: Duration::from_millis(500),
    ..ONE_SECOND
};

/// `etcd://`: one member.
pub const ETCD: EngineLimits = EngineLimits {
    short_lease: Duration::from_secs(2),
    contended_lease: Duration::from_secs(2),
    dead_holder: Duration::from_secs(2),
    restart_extends: ETCD_ELECTION_TIMEOUT,
    wake_within: Duration::from_millis(500),
};

/// `zk://`: one standalone server.
pub const ZOOKEEPER: EngineLimits = EngineLimits {
    short_lease: Duration::from_secs(2),
    contended_lease: Duration::from_secs(2),
    dead_holder: ZOOKEEPER_SESSION,
    restart_extends: Duration::ZERO,
    wake_within: Duration::from_millis(500),
};

/// The row of the engine named `engine` (`memory`, `redis`, `cluster`, `redlock`, `etcd`,
/// `zookeeper`: the names the torture program and the conformance suite's modules use).
///
/// Panics on any other name.
pub fn of(engine: &str) -> EngineLimits {
    match engine {
        "memory" => MEMORY,
        "redis" => REDIS,
        "cluster" => CLUSTER,
        "redlock" => REDLOCK,
        "etcd" => ETCD,
        "zookeeper" => ZOOKEEPER,
        other => panic!("no limits for an engine named {other:?}"),
    }
}
