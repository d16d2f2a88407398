//! Redis (`redis://`, `rediss://`) and Redis Cluster (`redis+cluster://`): Lua scripts on
//! RESP3 connections. [`RedisBackend`] dispatches each operation by mode to a job file
//! (`exclusive`, `shared`, `fair`, `multi`, `inspect`, `subscribe`), every one calling the
//! request layer [`client`] over one connection ([`link`]).
//!
//! Invariant: every name of one lock shares a hash slot ([`names`]), so each script runs on
//! the key's shard and the release notification follows it (`SPUBLISH`/`SSUBSCRIBE` on
//! Cluster); every wait is bounded by the holder's TTL, notifications are only hints.

mod acl;
mod client;
mod cluster;
pub(crate) mod config;
mod errors;
mod exclusive;
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

pub(crate) use self::exclusive::place_now;
pub(crate) use self::inspect::Holding;
pub(crate) use self::names::{Names, hash_slot};
pub(crate) use self::script::FENCE_BLOCK;

use self::client::Client;
use self::cluster::ClusterLink;
use self::config::{CLIENT_OPTIONS, RedisConfig, check_tls};
use self::exclusive::Counters;
use self::link::Link;
use super::mode::Mode;
use super::{
    Attempt, AttemptAll, Backend, Capabilities, Connecting, Context, DynBackend, EngineConfig,
    EngineResult, Extension, Fairness, Released, Renewal,
};
use crate::error::LockError;
use crate::inspect::LockInfo;

/// Message published by a force-unlock (never equal to a runtime id).
const FORCED: &str = "forced";

pub(crate) struct RedisBackend {
    client: Client,
    /// Whether acquisitions draw fencing tokens (not on a Redlock node).
    fencing: bool,
    /// When this backend last pushed the expiry of each fence counter.
    counters: Counters,
}

impl RedisBackend {
    /// Connects to one Redis server (`redis://` or `rediss://`).
    pub(crate) async fn connect(url: &str, ctx: &Context) -> Result<Self, LockError> {
        let names = Names::new(&ctx.prefix);
        let link = Link::single(url, &names, ctx).await?;
        let backend = Self::with_link(link, names, ctx);
        subscribe::check(&backend.client).await?;
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
        node.client.bounds_requests = false;
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
        subscribe::check(&backend.client).await?;
        Ok(backend)
    }

    fn with_link(link: Link, names: Names, ctx: &Context) -> Self {
        Self {
            client: Client::new(link, names, ctx),
            fencing: true,
            counters: Counters::default(),
        }
    }

    /// A call to this server timed out after `timeout` (a Redlock node's, bounded by the
    /// fan-out): a connection that delivered nothing for as long is replaced.
    pub(crate) fn note_timeout(&self, timeout: Duration) {
        self.client.link.note_timeout(timeout);
    }

    /// The `INFO server` section of this server (Redlock reads the run id and uptime in it to
    /// tell a restarted node).
    pub(crate) async fn server_info(&self) -> Result<String, LockError> {
        let mut conn = self.client.handle();
        let cmd = redis::cmd("INFO").arg("server").clone();
        self.client
            .call(None, "INFO server failed", cmd.query_async(&mut conn))
            .await
    }

    /// Loads the scripts of an exclusive lock's life (waiter's acquire, renew, release, hold)
    /// with one `SCRIPT LOAD` each, pipelined. Redlock sends it ahead of its next request on a
    /// node that may not have them (first contact, a reconnect): a script run that finds none
    /// falls back to `EVAL` *after* whatever was queued on the connection meanwhile, which
    /// would let the next acquire overtake a release whose answer nobody waits for.
    pub(crate) async fn load_scripts(&self) -> Result<(), LockError> {
        let scripts = &self.client.scripts;
        let mut conn = self.client.handle();
        let mut pipe = redis::pipe();
        for lua in [
            &scripts.acquire,
            &scripts.renew,
            &scripts.release,
            &scripts.hold,
        ] {
            pipe.cmd("SCRIPT").arg("LOAD").arg(lua.src).ignore();
        }
        self.client
            .call(
                None,
                "SCRIPT LOAD failed",
                pipe.query_async::<()>(&mut conn),
            )
            .await
    }

    /// [`Backend::try_acquire_waiting`], taking a place in the key's line at `place` (see
    /// [`place_now`]) if given, else at the server's clock (Redlock gives every node the same).
    pub(crate) async fn try_acquire_waiting_at(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
        place: Option<u64>,
    ) -> EngineResult<Attempt> {
        let mode = Mode::of(owner);
        if mode.is_shared() {
            return shared::acquire(&self.client, key, owner, lease, mode, true).await;
        }
        exclusive::try_acquire_waiting(&self.client, key, owner, lease, place).await
    }

    /// The holder of `key` now, if any, with its whole owner token (Redlock compares nodes).
    pub(crate) async fn holding(&self, key: &str) -> Result<Option<Holding>, LockError> {
        inspect::holding(&self.client, key).await
    }

    /// Every lock held now whose key starts with `prefix` (any order).
    pub(crate) async fn holdings(&self, prefix: &str) -> Result<Vec<Holding>, LockError> {
        inspect::holdings(&self.client, prefix).await
    }
}

impl Backend for RedisBackend {
    /// The first attempt: plain commands in one round trip for a lock
    /// ([`exclusive::try_acquire`]), a script for readers and permits.
    async fn try_acquire(&self, key: &str, owner: &str, lease: Duration) -> EngineResult<Attempt> {
        let mode = Mode::of(owner);
        if mode.is_shared() {
            // Boxed, as every path but the common one: the future of a first attempt stays
            // small (the runtime boxes it, a copy of all of it, see `DynBackend`).
            return Box::pin(shared::acquire(
                &self.client,
                key,
                owner,
                lease,
                mode,
                false,
            ))
            .await;
        }
        if !self.fencing {
            return exclusive::try_acquire_unfenced(&self.client, key, owner, lease).await;
        }
        exclusive::try_acquire(&self.client, &self.counters, key, owner, lease).await
    }

    async fn leave_line(&self, key: &str) {
        let mut cmd = redis::cmd("ZREM");
        cmd.arg(self.client.names.turns(key))
            .arg(&self.client.origin);
        let mut conn = self.client.handle();
        let left: Result<i64, _> = self
            .client
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
            return shared::renew_mixed(&self.client, batch).await;
        }
        exclusive::renew(&self.client, batch).await
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fairness: Fairness::Queue,
            fence_block: FENCE_BLOCK,
            ..Capabilities::DEFAULT
        }
    }

    fn renew_partition(&self, key: &str) -> u16 {
        match self.client.link {
            Link::Single(..) => 0,
            Link::Cluster(_) => hash_slot(self.client.names.lock(key).as_bytes()),
        }
    }

    async fn release(&self, key: &str, owner: &str) -> Result<Released, LockError> {
        let mode = Mode::of(owner);
        if mode.is_shared() {
            return Box::pin(shared::release(&self.client, key, owner, mode)).await;
        }
        exclusive::release(&self.client, key, owner).await
    }

    async fn release_or_extend(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<Extension, LockError> {
        exclusive::release_or_extend(&self.client, key, owner, lease).await
    }

    async fn release_after(
        &self,
        key: &str,
        owner: &str,
        hold: Duration,
    ) -> Result<Released, LockError> {
        exclusive::release_after(&self.client, key, owner, hold).await
    }

    async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        let (client, names) = (&self.client, &self.client.names);
        let reply: i64 = client
            .run_script(
                &client.scripts.force_unlock,
                Some(key),
                "force unlock failed",
                |cmd| {
                    cmd.arg(4)
                        .arg(names.lock(key))
                        .arg(names.readers(key))
                        .arg(names.permits(key))
                        .arg(names.permits_size(key))
                        .arg(names.channel(key))
                        .arg(FORCED)
                        .arg(client.publish_command());
                },
            )
            .await?;
        Ok(reply == 1)
    }

    async fn is_locked(&self, key: &str) -> Result<bool, LockError> {
        let mut conn = self.client.handle();
        let cmd = redis::cmd("EXISTS")
            .arg(self.client.names.lock(key))
            .clone();
        let n: i64 = self
            .client
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
        let mut conn = self.client.handle();
        let cmd = redis::cmd("PTTL").arg(self.client.names.lock(key)).clone();
        let pttl: i64 = self
            .client
            .call(Some(key), "lookup failed", cmd.query_async(&mut conn))
            .await
            .ok()?;
        // -2: no key, -1: no TTL.
        u64::try_from(pttl).ok().map(Duration::from_millis)
    }

    async fn watch(&self, key: &str) -> Result<(), LockError> {
        subscribe::set(&self.client, key, true).await
    }

    async fn unwatch(&self, key: &str) -> Result<(), LockError> {
        subscribe::set(&self.client, key, false).await
    }

    /// One script for every key on one server or one Cluster hash slot; never on a Redlock
    /// node (no fence counters there).
    fn acquires_all_at_once(&self, keys: &[String]) -> bool {
        self.fencing && multi::one_step(&self.client, keys)
    }

    async fn try_acquire_all(
        &self,
        keys: &[String],
        owner: &str,
        lease: Duration,
    ) -> EngineResult<AttemptAll> {
        multi::acquire_all(&self.client, keys, owner, lease).await
    }

    async fn try_acquire_fair(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
        place: Duration,
    ) -> EngineResult<Attempt> {
        fair::attempt(&self.client, key, owner, lease, place).await
    }

    async fn leave_fair_queue(&self, key: &str, owner: &str) -> EngineResult<()> {
        fair::leave(&self.client, key, owner).await
    }
}

impl EngineConfig for RedisConfig {
    fn name(&self) -> &'static str {
        match self {
            Self::Single(_) => "redis",
            Self::Cluster(_) => "redis-cluster",
        }
    }

    fn options(&self) -> &'static [&'static str] {
        &CLIENT_OPTIONS
    }

    fn connect(self: Box<Self>, ctx: Context) -> Connecting {
        Box::pin(async move {
            let backend = match *self {
                Self::Single(url) => {
                    check_tls(&url)?;
                    RedisBackend::connect(&url, &ctx).await?
                }
                Self::Cluster(seeds) => {
                    if seeds.is_empty() {
                        return Err(LockError::config(
                            "redis_cluster needs at least one seed URL",
                        ));
                    }
                    for seed in &seeds {
                        check_tls(seed)?;
                    }
                    RedisBackend::connect_cluster(&seeds, &ctx).await?
                }
            };
            Ok(DynBackend::new_arc(backend))
        })
    }
}
