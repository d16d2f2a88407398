//! Redis (`redis://`, `rediss://`) and Redis Cluster (`redis+cluster://`): Lua scripts on
//! RESP3 connections. On Cluster every name of one lock shares a hash slot ([`names`]), so each
//! script runs on the key's shard, and the release notification uses sharded pub/sub
//! (`SPUBLISH`/`SSUBSCRIBE`), which follows the shard.
//!
//! By job: [`config`] (URLs and options), [`link`] (the connections, error mapping), [`wire`]
//! and [`frame`] (the command connection of the runtime's own), [`cluster`] (rebuilding a
//! cluster connection, restoring sharded subscriptions), [`names`] (key layout, hash slots),
//! [`script`] (the Lua scripts), [`push`] (notifications).
//!
//! One server has two connections. The commands go through [`wire`] on plaintext TCP: a
//! request is written by its caller when nothing is in flight (one task hop a round trip, not
//! the client library's two) and queued in the order it was made, also across a reconnect
//! (through the client library's connection under TLS or on a Unix socket). The subscriptions
//! are on the client library's `ConnectionManager`, which resubscribes the release channels
//! after a restart. On a disconnect of either every local waiter retries (a message published
//! while the subscription was down reached nobody; a Redlock node is checked for a restart),
//! and every wait is bounded by the holder's TTL anyway.

mod acl;
mod cluster;
pub(crate) mod config;
mod errors;
mod fair;
mod inspect;
mod link;
mod multi;
mod names;
mod push;
pub(crate) mod script;
mod shared;
mod subscribe;
mod wire;

use std::time::Duration;

pub(crate) use inspect::Holding;
pub(crate) use names::{Names, hash_slot};

use self::cluster::ClusterLink;
use self::link::Link;
use self::script::{FENCE_FLOOR_MIN, Scripts, decode_acquire, millis_ceil};
use super::mode::Mode;
use super::{
    Attempt, AttemptAll, Backend, Context, EngineResult, Extension, Fairness, Released, Renewal,
};
use crate::error::LockError;
use crate::inspect::LockInfo;

/// How long the fence counter outlives the last lock on its key (every acquisition and renewal
/// pushes its expiry to this after the lease). Once it has expired, the next token starts at
/// the server clock in microseconds (see `lua/acquire.lua` for the bound that gives).
pub(super) const FENCE_TTL: Duration = Duration::from_secs(600);

/// Message published by a force-unlock (never equal to a runtime id).
const FORCED: &str = "forced";

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
const RESERVATION: Duration = Duration::from_millis(50);

/// An acquisition leaves the counter's `PEXPIRE` out when this backend pushed the counter's
/// expiry (to at least `FENCE_TTL` from then) less than this long before, lease included: the
/// counter then still outlives the lock by more than nine tenths of `FENCE_TTL`.
const COUNTER_PUSH_SPARED: Duration = Duration::from_secs(60);

/// At most this many counters are remembered (the memory is cleared when it is full).
const COUNTERS_REMEMBERED: usize = 4096;

pub(crate) struct RedisBackend {
    link: Link,
    names: Names,
    origin: String,
    timeout: Duration,
    /// Whether each request is bounded by `timeout` here. Not on a Redlock node: the fan-out
    /// bounds each node's call as a whole by the same timeout (`redlock::each_node`,
    /// `on_all`, the background releases), and a second timer a request would be work for
    /// nothing.
    bounds_requests: bool,
    scripts: Scripts,
    /// Whether acquisitions draw fencing tokens (not on a Redlock node).
    fencing: bool,
    /// Key -> when this backend last sent a `PEXPIRE` of its fence counter (that was answered).
    counters: std::sync::Mutex<std::collections::HashMap<String, tokio::time::Instant>>,
}

impl RedisBackend {
    /// Connects to one Redis server (`redis://` or `rediss://`).
    pub(crate) async fn connect(url: &str, ctx: &Context) -> Result<Self, LockError> {
        let names = Names::new(&ctx.prefix);
        let link = Link::single(url, &names, ctx).await?;
        let backend = Self::with_link(link, names, ctx);
        backend.check_notifications().await?;
        Ok(backend)
    }

    /// Like [`RedisBackend::connect`], but connects on first use: a node that is down now
    /// answers each call with an error (Redlock tolerates a minority of those). A Redlock node
    /// keeps no fence counter (independent counters cannot make one sequence): its first
    /// attempt is the `SET` alone. Its requests carry no bound of their own: the caller bounds
    /// every call (Redlock's per-node timeout).
    pub(crate) fn connect_lazy(url: &str, ctx: &Context) -> Result<Self, LockError> {
        let names = Names::new(&ctx.prefix);
        let link = Link::single_lazy(url, &names, ctx)?;
        let mut node = Self::with_link(link, names, ctx);
        node.fencing = false;
        node.bounds_requests = false;
        Ok(node)
    }

    /// Connects to a Redis Cluster through any of its `seeds` (one URL per node).
    pub(crate) async fn connect_cluster(
        seeds: &[String],
        ctx: &Context,
    ) -> Result<Self, LockError> {
        let names = Names::new(&ctx.prefix);
        let link = Link::Cluster(ClusterLink::connect(seeds, &names, ctx).await?);
        let backend = Self::with_link(link, names, ctx);
        backend.check_notifications().await?;
        Ok(backend)
    }

    /// The `INFO server` section of this server (Redlock reads the run id and uptime in it to
    /// tell a restarted node).
    pub(crate) async fn server_info(&self) -> Result<String, LockError> {
        let mut conn = self.link.handle();
        let cmd = redis::cmd("INFO").arg("server").clone();
        self.call(None, "INFO server failed", cmd.query_async(&mut conn))
            .await
    }

    /// Loads the scripts of an exclusive lock's life (waiter's acquire, renew, release, hold)
    /// with one `SCRIPT LOAD` each, pipelined. Redlock sends it ahead of its next request on a
    /// node that may not have them (first contact, a reconnect): a script run that finds none
    /// falls back to `EVAL` *after* whatever was queued on the connection meanwhile, which
    /// would let the next acquire overtake a release whose answer nobody waits for.
    pub(crate) async fn load_scripts(&self) -> Result<(), LockError> {
        let mut conn = self.link.handle();
        let mut pipe = redis::pipe();
        for lua in [
            &self.scripts.acquire,
            &self.scripts.renew,
            &self.scripts.release,
            &self.scripts.hold,
        ] {
            pipe.cmd("SCRIPT").arg("LOAD").arg(lua.src).ignore();
        }
        self.call(
            None,
            "SCRIPT LOAD failed",
            pipe.query_async::<()>(&mut conn),
        )
        .await
    }

    fn with_link(link: Link, names: Names, ctx: &Context) -> Self {
        Self {
            link,
            names,
            origin: ctx.origin.clone(),
            timeout: ctx.timeout,
            bounds_requests: true,
            scripts: Scripts::new(),
            fencing: true,
            counters: std::sync::Mutex::default(),
        }
    }

    fn counters(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, tokio::time::Instant>> {
        // Map operations cannot be interrupted half-way: a poisoned lock is consistent.
        self.counters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The first attempt without a fencing token (a Redlock node): `SET lock owner NX PX lease
    /// GET` alone. Idempotent per owner like the fenced one.
    async fn try_acquire_unfenced(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
    ) -> EngineResult<Attempt> {
        let tag = self.names.tag(key);
        let cmd = set_if_free(self.names.name(&tag, ""), owner, lease);
        let mut conn = self.link.handle();
        let answer = self.bounded(std::pin::pin!(conn.query(&cmd))).await;
        let held: Option<String> = self.settle(Some(key), "acquire failed", answer)?;
        match held.as_deref() {
            Some(held) if !is_owner(held, owner) => {
                Box::pin(self.found_taken(key, owner, lease, held)).await
            }
            _ => Ok(Attempt::Acquired { fence: None }),
        }
    }

    /// The answer of a first attempt that found the lock holding `held`, not `owner`'s: a
    /// reservation for this runtime after another runtime's flagged release (release.lua) is
    /// taken the way a waiter does; anything else is busy.
    async fn found_taken(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
        held: &str,
    ) -> EngineResult<Attempt> {
        if self.reserved_for_us(held) {
            return self.try_acquire_waiting_at(key, owner, lease, None).await;
        }
        Ok(Attempt::Busy { ttl: None })
    }

    /// Whether an acquisition with `lease`, sent now, needs to push the expiry of `key`'s counter:
    /// not when this backend pushed it recently enough (see [`COUNTER_PUSH_SPARED`]). Every
    /// push sets at least `FENCE_TTL` from its own time, so a later one by anybody never
    /// shortens what an earlier one promised.
    fn counter_push_needed(&self, key: &str, lease: Duration, now: tokio::time::Instant) -> bool {
        self.counters()
            .get(key)
            .is_none_or(|&pushed| now + lease >= pushed + COUNTER_PUSH_SPARED)
    }

    /// Remembers that a `PEXPIRE` of `key`'s counter sent at `sent_at` was answered.
    fn counter_pushed(&self, key: &str, sent_at: tokio::time::Instant) {
        let mut counters = self.counters();
        if counters.len() >= COUNTERS_REMEMBERED && !counters.contains_key(key) {
            counters.clear();
        }
        counters.insert(key.to_owned(), sent_at);
    }
}

impl RedisBackend {
    /// Renews the locks of `batch` (no reader, no permit) with one script call.
    pub(super) async fn renew_locks(
        &self,
        batch: &[Renewal],
    ) -> Result<Vec<Option<bool>>, LockError> {
        let key = (batch.len() == 1).then(|| batch[0].key.as_str());
        let reply: Vec<i64> = self
            .run_script(&self.scripts.renew, key, "renewal failed", |cmd| {
                cmd.arg(2 * batch.len());
                for item in batch {
                    let tag = self.names.tag(&item.key);
                    cmd.arg(self.names.name(&tag, ""))
                        .arg(self.names.name(&tag, names::FENCE));
                }
                cmd.arg(millis_ceil(FENCE_TTL));
                for item in batch {
                    cmd.arg(&item.owner).arg(millis_ceil(item.lease));
                }
            })
            .await?;
        Ok(reply.into_iter().map(|r| Some(r == 1)).collect())
    }

    /// Whether the lock's value `held` is a reservation (`+` appended when flagged again) made
    /// by another runtime's release for this runtime's turn (`><runtime id>`) or for every
    /// runtime but the releaser's (`~<runtime id>`), or the writers' turn: this runtime may
    /// take the key.
    fn reserved_for_us(&self, held: &str) -> bool {
        let unflagged = held.strip_suffix('+').unwrap_or(held);
        // The writers' turn (`^`, `lua/read_release.lua`) is every writer's.
        unflagged.starts_with('^')
            || unflagged.strip_prefix('>') == Some(self.origin.as_str())
            || unflagged
                .strip_prefix('~')
                .is_some_and(|by| by != self.origin)
    }

    /// The keys and first arguments of the scripts that reserve a block of fences
    /// (`acquire.lua`, `extend.lua`): lock and counter, owner, lease, counter TTL, floor, block.
    fn block_args(&self, cmd: &mut redis::Cmd, key: &str, owner: &str, lease: Duration) {
        let tag = self.names.tag(key);
        cmd.arg(3)
            .arg(self.names.name(&tag, ""))
            .arg(self.names.name(&tag, names::FENCE))
            .arg(self.names.name(&tag, names::TURNS))
            .arg(owner)
            .arg(millis_ceil(lease))
            .arg(millis_ceil(lease.saturating_add(FENCE_TTL)))
            .arg(FENCE_FLOOR_MIN)
            .arg(FENCE_BLOCK);
    }

    /// [`Backend::try_acquire_waiting`], taking a place in the key's line at `place` (see
    /// [`place_now`]) if given, else at the server's clock: Redlock gives every node the same,
    /// so that the nodes order the runtimes alike and reserve a release for the same one. A lock's attempt is `lua/acquire.lua`
    /// (acquires, or flags the holder's lock so that its release notifies, takes this
    /// runtime's place in the key's line, and answers the holder's TTL).
    pub(crate) async fn try_acquire_waiting_at(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
        place: Option<u64>,
    ) -> EngineResult<Attempt> {
        let mode = Mode::of(owner);
        if mode.is_shared() {
            return self.acquire_shared(key, owner, lease, mode, true).await;
        }
        let reply: i64 = self
            .run_script(&self.scripts.acquire, Some(key), "acquire failed", |cmd| {
                self.block_args(cmd, key, owner, lease);
                cmd.arg(&self.origin)
                    .arg(millis_ceil(shared::WRITER_WAITING));
                if let Some(place) = place {
                    cmd.arg(place);
                }
            })
            .await?;
        Ok(decode_acquire(reply, FENCE_BLOCK))
    }
}

/// Where a Redlock waiter attempting now takes its runtime's place in a key's line of runtimes
/// on every node (`lua/acquire.lua`): microseconds since the Unix epoch on this machine's
/// clock. Places are compared across processes, so across machines the order is as fair as
/// the clocks agree (a place counts only for the order of runtimes waiting at once, never for
/// exclusion); one server or a Cluster orders by the server's clock instead.
pub(crate) fn place_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// `SET lock owner NX PX lease GET`: writes the lock if it is free, and answers the value it
/// held before either way.
fn set_if_free(lock: names::Name<'_>, owner: &str, lease: Duration) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(7, lock.len() + owner.len() + 32);
    cmd.arg("SET")
        .arg(lock)
        .arg(owner)
        .arg("NX")
        .arg("PX")
        .arg(millis_ceil(lease))
        .arg("GET");
    cmd
}

/// The replies of the first attempt's `SET … GET` and `INCRBY`: the lock's previous value and
/// the counter's new one (a `PEXPIRE` after them is ignored).
fn held_and_fence(replies: Vec<redis::Value>) -> redis::RedisResult<(Option<String>, i64)> {
    let mut replies = replies.into_iter();
    match (replies.next(), replies.next()) {
        (Some(held), Some(fence)) => Ok((
            redis::from_redis_value(held)?,
            redis::from_redis_value(fence)?,
        )),
        _ => Err(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "fewer replies than commands in the acquire pipeline",
        ))),
    }
}

/// Whether the lock's value `held` is `owner`'s (a `+` appended when a waiter flagged it): a
/// retried request of the same owner, which keeps its one hold.
fn is_owner(held: &str, owner: &str) -> bool {
    held.strip_suffix('+').unwrap_or(held) == owner
}

impl Backend for RedisBackend {
    /// The first attempt, plain commands in one round trip (no script): `SET lock owner NX PX
    /// lease GET`, `INCRBY counter FENCE_BLOCK`, and `PEXPIRE counter` unless this backend
    /// pushed the counter's expiry lately (see [`COUNTER_PUSH_SPARED`]; a recreated counter
    /// gets its expiry from the floor script). Not atomic, and need not be: the
    /// counter only grows, an attempt that found the key taken just spends a value, and a
    /// holder's `INCR` runs after its `SET` and before the release that lets the next holder
    /// in, so tokens follow the order of the holds. (A holder whose value came from a
    /// recreated counter raises it to the clock first, see [`FENCE_FLOOR_MIN`].)
    async fn try_acquire(&self, key: &str, owner: &str, lease: Duration) -> EngineResult<Attempt> {
        let mode = Mode::of(owner);
        if mode.is_shared() {
            // Boxed, as every path but the common one: the future of a first attempt stays
            // small (the runtime boxes it, a copy of all of it, see `DynBackend`).
            return Box::pin(self.acquire_shared(key, owner, lease, mode, false)).await;
        }
        if !self.fencing {
            return self.try_acquire_unfenced(key, owner, lease).await;
        }
        let tag = self.names.tag(key);
        let (lock, counter) = (
            self.names.name(&tag, ""),
            self.names.name(&tag, names::FENCE),
        );
        let sent_at = tokio::time::Instant::now();
        let push = self.counter_push_needed(key, lease, sent_at);
        let mut pipe = redis::Pipeline::with_capacity(3);
        // Sized for its arguments, as `set_if_free`: no reallocation while they are written.
        let mut draw = redis::Cmd::with_capacity(3, counter.len() + 16);
        draw.arg("INCRBY").arg(counter).arg(FENCE_BLOCK);
        pipe.add_command(set_if_free(lock, owner, lease))
            .add_command(draw);
        if push {
            pipe.cmd("PEXPIRE")
                .arg(counter)
                .arg(millis_ceil(lease.saturating_add(FENCE_TTL)))
                .ignore();
        }
        let mut conn = self.link.handle();
        let sent = std::pin::pin!(conn.replies(&pipe, if push { 3 } else { 2 }));
        let replies = self
            .bounded_by(sent, std::pin::pin!(self.bound_from(sent_at)))
            .await;
        let (held, fence) = self.settle(
            Some(key),
            "acquire failed",
            replies.map(|replies| held_and_fence(replies?)),
        )?;
        if push {
            self.counter_pushed(key, sent_at);
        }
        if let Some(held) = held.as_deref().filter(|held| !is_owner(held, owner)) {
            return Box::pin(self.found_taken(key, owner, lease, held)).await;
        }
        let last = if fence < FENCE_FLOOR_MIN {
            Box::pin(
                self.run_script(&self.scripts.floor, Some(key), "acquire failed", |cmd| {
                    cmd.arg(1)
                        .arg(counter)
                        .arg(millis_ceil(lease.saturating_add(FENCE_TTL)))
                        .arg(FENCE_BLOCK);
                }),
            )
            .await?
        } else {
            fence
        };
        Ok(decode_acquire(last, FENCE_BLOCK))
    }

    async fn leave_line(&self, key: &str) {
        let mut cmd = redis::cmd("ZREM");
        cmd.arg(self.names.turns(key)).arg(&self.origin);
        let mut conn = self.link.handle();
        let left: Result<i64, _> = self
            .call(
                Some(key),
                "leaving the line failed",
                cmd.query_async(&mut conn),
            )
            .await;
        if let Err(err) = left {
            tracing::debug!(key = %key, error = %err, "could not leave the line of waiting processes");
        }
    }

    async fn try_acquire_waiting(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
    ) -> EngineResult<Attempt> {
        self.try_acquire_waiting_at(key, owner, lease, None).await
    }

    /// Renews `batch` with one script call (the watchdog groups batches by
    /// [`renew_partition`](Backend::renew_partition): on Cluster one hash slot per call).
    async fn renew(&self, batch: &[Renewal]) -> Result<Vec<Option<bool>>, LockError> {
        if batch.iter().any(|r| Mode::of(&r.owner).is_shared()) {
            return self.renew_mixed(batch).await;
        }
        self.renew_locks(batch).await
    }

    fn fence_block(&self) -> u64 {
        FENCE_BLOCK
    }

    fn renew_partition(&self, key: &str) -> u16 {
        match self.link {
            Link::Single(..) => 0,
            Link::Cluster(_) => hash_slot(self.names.lock(key).as_bytes()),
        }
    }

    async fn release(&self, key: &str, owner: &str) -> Result<Released, LockError> {
        let mode = Mode::of(owner);
        if mode.is_shared() {
            return Box::pin(self.release_shared(key, owner, mode)).await;
        }
        let tag = self.names.tag(key);
        let reply: i64 = self
            .run_script(&self.scripts.release, Some(key), "release failed", |cmd| {
                cmd.arg(2)
                    .arg(self.names.name(&tag, ""))
                    .arg(self.names.name(&tag, names::TURNS))
                    .arg(owner)
                    .arg(self.link.publish_command())
                    .arg(millis_ceil(RESERVATION));
            })
            .await?;
        Ok(match reply {
            1 => Released::Freed,
            _ => Released::NotOwner,
        })
    }

    async fn release_or_extend(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<Extension, LockError> {
        let reply: i64 = self
            .run_script(&self.scripts.extend, Some(key), "release failed", |cmd| {
                self.block_args(cmd, key, owner, lease);
                cmd.arg(self.names.channel(key))
                    .arg(&self.origin)
                    .arg(self.link.publish_command())
                    .arg(millis_ceil(RESERVATION));
            })
            .await?;
        Ok(match u64::try_from(reply) {
            Ok(last @ 1..) => Extension::Extended { last },
            _ if reply == -1 => Extension::Released(Released::Freed),
            _ => Extension::Released(Released::NotOwner),
        })
    }

    async fn release_after(
        &self,
        key: &str,
        owner: &str,
        hold: Duration,
    ) -> Result<Released, LockError> {
        let reply: i64 = self
            .run_script(&self.scripts.hold, Some(key), "release failed", |cmd| {
                cmd.arg(1)
                    .arg(self.names.lock(key))
                    .arg(owner)
                    .arg(millis_ceil(hold))
                    .arg(self.names.channel(key))
                    .arg(&self.origin)
                    .arg(self.link.publish_command());
            })
            .await?;
        Ok(match reply {
            1 => Released::Kept,
            _ => Released::NotOwner,
        })
    }

    async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        let reply: i64 = self
            .run_script(
                &self.scripts.force_unlock,
                Some(key),
                "force unlock failed",
                |cmd| {
                    cmd.arg(4)
                        .arg(self.names.lock(key))
                        .arg(self.names.readers(key))
                        .arg(self.names.permits(key))
                        .arg(self.names.permits_size(key))
                        .arg(self.names.channel(key))
                        .arg(FORCED)
                        .arg(self.link.publish_command());
                },
            )
            .await?;
        Ok(reply == 1)
    }

    async fn is_locked(&self, key: &str) -> Result<bool, LockError> {
        let mut conn = self.link.handle();
        let cmd = redis::cmd("EXISTS").arg(self.names.lock(key)).clone();
        let n: i64 = self
            .call(Some(key), "lookup failed", cmd.query_async(&mut conn))
            .await?;
        Ok(n == 1)
    }

    async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        Ok(self.holding(key).await?.map(|held| held.info()))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>, LockError> {
        Ok(self
            .holdings(prefix)
            .await?
            .iter()
            .map(Holding::info)
            .collect())
    }

    async fn holder_ttl(&self, key: &str) -> Option<Duration> {
        let mut conn = self.link.handle();
        let cmd = redis::cmd("PTTL").arg(self.names.lock(key)).clone();
        let pttl: i64 = self
            .call(Some(key), "lookup failed", cmd.query_async(&mut conn))
            .await
            .ok()?;
        // -2: no key, -1: no TTL.
        u64::try_from(pttl).ok().map(Duration::from_millis)
    }

    async fn watch(&self, key: &str) -> Result<(), LockError> {
        self.set_subscribed(key, true).await
    }

    fn acquires_all_at_once(&self, keys: &[String]) -> bool {
        self.one_step(keys)
    }

    async fn try_acquire_all(
        &self,
        keys: &[String],
        owner: &str,
        lease: Duration,
    ) -> EngineResult<AttemptAll> {
        self.acquire_all(keys, owner, lease).await
    }

    fn fairness(&self) -> Fairness {
        Fairness::Queue
    }

    async fn try_acquire_fair(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
        place: Duration,
    ) -> EngineResult<Attempt> {
        self.fair_attempt(key, owner, lease, place).await
    }

    async fn leave_fair_queue(&self, key: &str, owner: &str) -> EngineResult<()> {
        self.fair_leave(key, owner).await
    }

    async fn unwatch(&self, key: &str) -> Result<(), LockError> {
        self.set_subscribed(key, false).await
    }
}
