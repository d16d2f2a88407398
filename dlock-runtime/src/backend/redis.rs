//! Redis (`redis://`, `rediss://`) and Redis Cluster (`redis+cluster://`): Lua scripts on a
//! RESP3 connection that carries both the commands and the pub/sub pushes. On Cluster every
//! name of one lock shares a hash slot, so each script runs on the key's shard, and the release
//! notification uses sharded pub/sub (`SPUBLISH`/`SSUBSCRIBE`), which follows the shard.
//!
//! Layout, every name of one lock in one hash slot:
//! - lock hash `<prefix>{<key>}`: `owner`, `count` (hold count), `fence`; its TTL is the lease;
//! - fence counter `<prefix>{<key>}:fence`;
//! - release channel `<prefix>{<key>}:released`.
//!
//! The connection is a [`ConnectionManager`]: it reconnects by itself after a restart and
//! resubscribes the release channels; on a disconnect every local waiter retries (a message
//! published while the subscription was down reached nobody), and every wait is bounded by
//! the holder's TTL anyway.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{IntoConnectionInfo, ProtocolVersion, PushInfo, PushKind, RedisError, Script, Value};

use super::{Attempt, Backend, BoxFuture, Released, Renewal};
use crate::LockError;
use crate::wait::WaitHub;

/// How long the fence counter outlives the lock. After that the next token is floored at the
/// server clock in microseconds, which is above every earlier token unless the server's clock
/// was stepped back by more than this.
const FENCE_TTL: Duration = Duration::from_secs(600);

/// Message published by a force-unlock (never equal to a runtime id).
const FORCED: &str = "forced";

/// A Lua script: run by `EVALSHA`, routed by its first key; when the node does not have it
/// (first use, `SCRIPT FLUSH`, a restart, a failover) by `EVAL` on that same node, which also
/// caches it there. (A `SCRIPT LOAD` would go to every node of a cluster and wait for all.)
struct Lua {
    sha: String,
    src: &'static str,
}

impl Lua {
    fn new(src: &'static str) -> Self {
        Self {
            sha: Script::new(src).get_hash().to_owned(),
            src,
        }
    }
}

struct Scripts {
    acquire: Lua,
    renew: Lua,
    release: Lua,
    force_unlock: Lua,
}

/// One server (reconnecting, resubscribing) or a cluster (slot-routed, MOVED/ASK and failover
/// handled by the client).
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(cmd, offset, count),
            Self::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// The connection a backend holds.
enum Link {
    Single(ConnectionManager),
    Cluster(Arc<ClusterLink>),
}

/// A cluster connection that can be rebuilt, plus the sharded subscriptions to restore.
///
/// The cluster client follows MOVED/ASK and refreshes its slot map after connection errors,
/// but not after timeouts: a master that froze (rather than died) and was failed over would
/// keep its slots' calls timing out. Any timeout therefore asks the maintenance task to
/// rebuild the connection from the seeds (a fresh slot map); a disconnect or a rebuild makes it
/// re-issue `SSUBSCRIBE` for every watched channel until all are confirmed, then wake every
/// waiter.
struct ClusterLink {
    client: redis::cluster::ClusterClient,
    conn: std::sync::RwLock<ClusterConnection>,
    channels: std::sync::Mutex<std::collections::HashSet<String>>,
    repair: Arc<tokio::sync::Notify>,
    rebuild: std::sync::atomic::AtomicBool,
    timeout: Duration,
}

impl Drop for ClusterLink {
    fn drop(&mut self) {
        // Lets the maintenance task notice that the backend is gone.
        self.repair.notify_one();
    }
}

impl ClusterLink {
    fn conn(&self) -> ClusterConnection {
        self.conn
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn channels(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.channels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Rebuilds the connection when asked, then restores every sharded subscription.
    async fn maintain(
        link: std::sync::Weak<Self>,
        repair: Arc<tokio::sync::Notify>,
        hub: Arc<WaitHub>,
    ) {
        use std::sync::atomic::Ordering;
        loop {
            repair.notified().await;
            // Let a burst of triggers (many calls timing out at once) settle into one repair.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let Some(this) = link.upgrade() else {
                return;
            };
            let mut retry = false;
            if this.rebuild.swap(false, Ordering::AcqRel) {
                match tokio::time::timeout(this.timeout, this.client.get_async_connection()).await {
                    Ok(Ok(conn)) => {
                        *this
                            .conn
                            .write()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) = conn;
                        tracing::debug!("cluster connection rebuilt after a timeout");
                    }
                    _ => {
                        this.rebuild.store(true, Ordering::Release);
                        retry = true;
                    }
                }
            }
            let channels: Vec<String> = this.channels().iter().cloned().collect();
            let mut conn = this.conn();
            for channel in channels {
                let confirmed = tokio::time::timeout(this.timeout, conn.ssubscribe(&channel)).await;
                retry |= !matches!(confirmed, Ok(Ok(())));
            }
            hub.wake_all();
            drop(this);
            if retry {
                tokio::time::sleep(Duration::from_millis(500)).await;
                repair.notify_one();
            }
        }
    }
}

impl Link {
    fn handle(&self) -> Conn {
        match self {
            Self::Single(c) => Conn::Single(c.clone()),
            Self::Cluster(link) => Conn::Cluster(link.conn()),
        }
    }

    fn publish_command(&self) -> &'static str {
        match self {
            Self::Single(_) => "PUBLISH",
            Self::Cluster(_) => "SPUBLISH",
        }
    }

    /// A call timed out: on Cluster the slot map may be stale (a frozen master failed over).
    fn note_timeout(&self) {
        if let Self::Cluster(link) = self {
            link.rebuild
                .store(true, std::sync::atomic::Ordering::Release);
            link.repair.notify_one();
        }
    }
}

/// The hash slot of a key (CRC16/XMODEM of its hash tag, mod 16384), as Redis Cluster computes
/// it: renewals are batched per slot there.
pub(crate) fn hash_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in tagged {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

pub(crate) struct RedisBackend {
    link: Link,
    names: Names,
    origin: String,
    timeout: Duration,
    scripts: Scripts,
}

/// Key and channel names for one prefix.
#[derive(Debug, Clone)]
struct Names {
    prefix: String,
}

impl Names {
    fn lock(&self, key: &str) -> String {
        format!("{}{{{key}}}", self.prefix)
    }

    fn fence(&self, key: &str) -> String {
        format!("{}{{{key}}}:fence", self.prefix)
    }

    fn channel(&self, key: &str) -> String {
        format!("{}{{{key}}}:released", self.prefix)
    }

    /// The user key of a release channel, if the channel is one of ours.
    fn key_of_channel<'c>(&self, channel: &'c str) -> Option<&'c str> {
        channel
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix('{')?
            .strip_suffix("}:released")
    }
}

/// The acquire script's one-integer answer (see `lua/acquire.lua`).
fn decode_acquire(reply: i64) -> Attempt {
    match reply {
        fence @ 1.. => Attempt::Acquired {
            fence: u64::try_from(fence).ok(),
        },
        -1 | 0 => Attempt::Busy { ttl: None },
        busy => Attempt::Busy {
            ttl: u64::try_from(-2 - busy).ok().map(Duration::from_millis),
        },
    }
}

/// Milliseconds, rounded up (Redis TTLs have millisecond resolution; never round a lease down).
fn millis_ceil(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX).max(1)
}

fn redis_error(key: Option<&str>, what: &str, err: RedisError) -> LockError {
    LockError::backend(key, what, Some(Arc::new(err)))
}

impl RedisBackend {
    /// Connects to one Redis server. `url` is a `redis://` or `rediss://` URL understood by the
    /// redis crate; the connection is switched to RESP3 for pushes.
    pub(crate) async fn connect(
        url: &str,
        prefix: String,
        hub: Arc<WaitHub>,
        origin: String,
        timeout: Duration,
    ) -> Result<Self, LockError> {
        let (client, config, names) = Self::open(url, prefix, hub, &origin, timeout)?;
        let conn = connect_within(
            timeout,
            &format!("cannot connect to {url}"),
            ConnectionManager::new_with_config(client, config),
        )
        .await?;
        Ok(Self::with_connection(
            Link::Single(conn),
            names,
            origin,
            timeout,
        ))
    }

    /// Like [`RedisBackend::connect`], but connects on first use: a node that is down now
    /// answers each call with an error (Redlock tolerates a minority of those).
    pub(crate) fn connect_lazy(
        url: &str,
        prefix: String,
        hub: Arc<WaitHub>,
        origin: String,
        timeout: Duration,
    ) -> Result<Self, LockError> {
        let (client, config, names) = Self::open(url, prefix, hub, &origin, timeout)?;
        // No retries inside a call: a node that is down fails fast (connection refused) and
        // the next call tries again.
        let config = config.set_number_of_retries(0);
        let conn = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| redis_error(None, &format!("cannot set up a connection to {url}"), e))?;
        Ok(Self::with_connection(
            Link::Single(conn),
            names,
            origin,
            timeout,
        ))
    }

    /// Connects to a Redis Cluster through any of its `seeds` (one URL per node).
    pub(crate) async fn connect_cluster(
        seeds: &[String],
        prefix: String,
        hub: Arc<WaitHub>,
        origin: String,
        timeout: Duration,
    ) -> Result<Self, LockError> {
        let names = Names { prefix };
        let repair = Arc::new(tokio::sync::Notify::new());
        let on_push = push_handler(
            hub.clone(),
            names.clone(),
            origin.clone(),
            Some(repair.clone()),
        );
        let seeds_text = seeds.join(",");
        let client = redis::cluster::ClusterClientBuilder::new(seeds.to_vec())
            .use_protocol(ProtocolVersion::RESP3)
            .push_sender(on_push)
            // Shorter than the outer bound: a seed that does not answer must not fail the
            // connection while others do.
            .connection_timeout(timeout / 2)
            .response_timeout(timeout)
            .build()
            .map_err(|e| LockError::config(format!("bad cluster seeds `{seeds_text}`: {e}")))?;
        let conn = connect_within(
            timeout,
            &format!("cannot connect to cluster {seeds_text}"),
            client.get_async_connection(),
        )
        .await?;
        let link = Arc::new(ClusterLink {
            client,
            conn: std::sync::RwLock::new(conn),
            channels: std::sync::Mutex::default(),
            repair: repair.clone(),
            rebuild: std::sync::atomic::AtomicBool::new(false),
            timeout,
        });
        tokio::spawn(ClusterLink::maintain(Arc::downgrade(&link), repair, hub));
        Ok(Self::with_connection(
            Link::Cluster(link),
            names,
            origin,
            timeout,
        ))
    }

    fn open(
        url: &str,
        prefix: String,
        hub: Arc<WaitHub>,
        origin: &str,
        timeout: Duration,
    ) -> Result<(redis::Client, ConnectionManagerConfig, Names), LockError> {
        let info = url
            .into_connection_info()
            .map_err(|e| LockError::config(format!("bad redis url `{url}`: {e}")))?;
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let info = info.set_redis_settings(settings);
        let client = redis::Client::open(info)
            .map_err(|e| LockError::config(format!("bad redis url `{url}`: {e}")))?;
        let names = Names { prefix };
        let on_push = push_handler(hub, names.clone(), origin.to_owned(), None);
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            // Each call is bounded by `timeout` in `RedisBackend::call` (one timer per call).
            .set_response_timeout(None)
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500))
            .set_push_sender(on_push)
            .set_automatic_resubscription();
        Ok((client, config, names))
    }

    fn with_connection(link: Link, names: Names, origin: String, timeout: Duration) -> Self {
        Self {
            link,
            names,
            origin,
            timeout,
            scripts: Scripts {
                acquire: Lua::new(include_str!("lua/acquire.lua")),
                renew: Lua::new(include_str!("lua/renew.lua")),
                release: Lua::new(include_str!("lua/release.lua")),
                force_unlock: Lua::new(include_str!("lua/force_unlock.lua")),
            },
        }
    }

    fn timed_out(&self, key: Option<&str>, what: &str) -> LockError {
        let elapsed = timed_out(format!("no reply within {:?}", self.timeout));
        LockError::backend(key, what, Some(elapsed))
    }

    /// Runs one call with the response bound, mapping errors to `Backend` naming the key.
    async fn call<T>(
        &self,
        key: Option<&str>,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, RedisError>>,
    ) -> Result<T, LockError> {
        let answer = tokio::time::timeout(self.timeout, fut).await;
        self.settle(key, what, answer)
    }

    /// Maps one bounded call's outcome: errors become `Backend` naming the key, and a timeout
    /// (ours or the client's) is reported to the link (a stale cluster slot map).
    fn settle<T>(
        &self,
        key: Option<&str>,
        what: &str,
        answer: Result<Result<T, RedisError>, tokio::time::error::Elapsed>,
    ) -> Result<T, LockError> {
        match answer {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                if e.is_timeout() {
                    self.link.note_timeout();
                }
                Err(redis_error(key, what, e))
            }
            Err(_) => {
                self.link.note_timeout();
                Err(self.timed_out(key, what))
            }
        }
    }
}

/// An I/O "timed out" error as the source of a `Backend` error.
fn timed_out(message: String) -> Arc<dyn std::error::Error + Send + Sync> {
    Arc::new(std::io::Error::new(std::io::ErrorKind::TimedOut, message))
}

/// Awaits a connection attempt bounded by `timeout`; a failure is `Backend` saying `what`.
async fn connect_within<T>(
    timeout: Duration,
    what: &str,
    connecting: impl std::future::Future<Output = Result<T, RedisError>>,
) -> Result<T, LockError> {
    match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(redis_error(None, what, e)),
        Err(_) => Err(LockError::backend(
            None,
            what,
            Some(timed_out(format!("no connection within {timeout:?}"))),
        )),
    }
}

/// The push sender of a connection: hands every push to [`on_push`]; on Cluster a disconnect
/// also asks for `repair` (subscriptions restored by the maintenance task).
fn push_handler(
    hub: Arc<WaitHub>,
    names: Names,
    origin: String,
    repair: Option<Arc<tokio::sync::Notify>>,
) -> impl Fn(PushInfo) -> Result<(), std::convert::Infallible> + Send + Sync + 'static {
    move |push: PushInfo| {
        if push.kind == PushKind::Disconnection
            && let Some(repair) = &repair
        {
            repair.notify_one();
        }
        on_push(&hub, &names, &origin, push);
        Ok(())
    }
}

/// Handles one push from the connection: a release message wakes that key's local waiters
/// (unless it came from this runtime, which woke them already); a (re)subscription confirmation
/// makes the key's waiter retry; a disconnect makes every waiter retry.
fn on_push(hub: &WaitHub, names: &Names, origin: &str, push: PushInfo) {
    let channel_key = |v: Option<&Value>| -> Option<String> {
        let channel: String = redis::from_redis_value_ref(v?).ok()?;
        names.key_of_channel(&channel).map(str::to_owned)
    };
    match push.kind {
        PushKind::Message | PushKind::SMessage => {
            let from: Option<String> = push
                .data
                .get(1)
                .and_then(|v| redis::from_redis_value_ref(v).ok());
            if from.as_deref() == Some(origin) {
                return;
            }
            if let Some(key) = channel_key(push.data.first()) {
                hub.wake(&key);
            }
        }
        PushKind::Subscribe | PushKind::SSubscribe => {
            if let Some(key) = channel_key(push.data.first()) {
                hub.wake(&key);
            }
        }
        PushKind::Disconnection => hub.wake_all(),
        _ => {}
    }
}

impl RedisBackend {
    /// Runs `lua` with `fill` appending `numkeys`, the keys and the arguments.
    async fn run_script<T: redis::FromRedisValue>(
        &self,
        lua: &Lua,
        key: Option<&str>,
        what: &str,
        fill: impl Fn(&mut redis::Cmd),
    ) -> Result<T, LockError> {
        let mut conn = self.link.handle();
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&lua.sha);
        fill(&mut cmd);
        match tokio::time::timeout(self.timeout, cmd.query_async::<T>(&mut conn)).await {
            Ok(Err(err))
                if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(lua.src);
                fill(&mut cmd);
                self.call(key, what, cmd.query_async(&mut conn)).await
            }
            answer => self.settle(key, what, answer),
        }
    }

    /// Renews `items` (all in one hash slot on Cluster) with one script call.
    async fn renew_one_call(&self, items: &[Renewal]) -> Result<Vec<Option<bool>>, LockError> {
        let key = (items.len() == 1).then(|| items[0].key.as_str());
        let reply: Vec<i64> = self
            .run_script(&self.scripts.renew, key, "renewal failed", |cmd| {
                cmd.arg(items.len());
                for item in items {
                    cmd.arg(self.names.lock(&item.key));
                }
                for item in items {
                    cmd.arg(&item.owner).arg(millis_ceil(item.lease));
                }
            })
            .await?;
        Ok(reply.into_iter().map(|r| Some(r == 1)).collect())
    }
}

impl Backend for RedisBackend {
    fn try_acquire<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Attempt, LockError>> {
        Box::pin(async move {
            let reply: i64 = self
                .run_script(&self.scripts.acquire, Some(key), "acquire failed", |cmd| {
                    cmd.arg(2)
                        .arg(self.names.lock(key))
                        .arg(self.names.fence(key))
                        .arg(owner)
                        .arg(millis_ceil(lease))
                        .arg(millis_ceil(lease.saturating_add(FENCE_TTL)));
                })
                .await?;
            Ok(decode_acquire(reply))
        })
    }

    fn renew<'a>(
        &'a self,
        batch: &'a [Renewal],
    ) -> BoxFuture<'a, Result<Vec<Option<bool>>, LockError>> {
        // The watchdog groups batches by `renew_partition`: on Cluster one hash slot per call.
        Box::pin(self.renew_one_call(batch))
    }

    fn renew_partition(&self, key: &str) -> u16 {
        match self.link {
            Link::Single(_) => 0,
            Link::Cluster(_) => hash_slot(self.names.lock(key).as_bytes()),
        }
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<Released, LockError>> {
        Box::pin(async move {
            let reply: i64 = self
                .run_script(&self.scripts.release, Some(key), "release failed", |cmd| {
                    cmd.arg(1)
                        .arg(self.names.lock(key))
                        .arg(owner)
                        .arg(self.names.channel(key))
                        .arg(&self.origin)
                        .arg(self.link.publish_command());
                })
                .await?;
            Ok(match reply {
                1 => Released::Freed,
                2 => Released::StillHeld,
                _ => Released::NotOwner,
            })
        })
    }

    fn force_unlock<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(async move {
            let reply: i64 = self
                .run_script(
                    &self.scripts.force_unlock,
                    Some(key),
                    "force unlock failed",
                    |cmd| {
                        cmd.arg(1)
                            .arg(self.names.lock(key))
                            .arg(self.names.channel(key))
                            .arg(FORCED)
                            .arg(self.link.publish_command());
                    },
                )
                .await?;
            Ok(reply == 1)
        })
    }

    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(async move {
            let mut conn = self.link.handle();
            let cmd = redis::cmd("EXISTS").arg(self.names.lock(key)).clone();
            let n: i64 = self
                .call(Some(key), "lookup failed", cmd.query_async(&mut conn))
                .await?;
            Ok(n == 1)
        })
    }

    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            let channel = self.names.channel(key);
            match &self.link {
                Link::Single(c) => {
                    let mut c = c.clone();
                    self.call(Some(key), "subscribe failed", c.subscribe(channel))
                        .await
                }
                Link::Cluster(link) => {
                    let mut c = link.conn();
                    self.call(Some(key), "subscribe failed", c.ssubscribe(&channel))
                        .await?;
                    // Restored by the maintenance task after a disconnect or a rebuild.
                    link.channels().insert(channel);
                    Ok(())
                }
            }
        })
    }

    fn unwatch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            let channel = self.names.channel(key);
            match &self.link {
                Link::Single(c) => {
                    let mut c = c.clone();
                    self.call(Some(key), "unsubscribe failed", c.unsubscribe(channel))
                        .await
                }
                Link::Cluster(link) => {
                    link.channels().remove(&channel);
                    let mut c = link.conn();
                    self.call(Some(key), "unsubscribe failed", c.sunsubscribe(&channel))
                        .await
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_share_one_hash_tag_and_map_back() {
        let n = Names {
            prefix: "dlock:".into(),
        };
        assert_eq!(n.lock("stock:42"), "dlock:{stock:42}");
        assert_eq!(n.fence("stock:42"), "dlock:{stock:42}:fence");
        assert_eq!(n.channel("stock:42"), "dlock:{stock:42}:released");
        for key in ["stock:42", "a}b{c", "", "ключ {x}"] {
            assert_eq!(n.key_of_channel(&n.channel(key)), Some(key));
        }
        assert_eq!(n.key_of_channel("other:{x}:released"), None);
    }

    #[test]
    fn acquire_answers_decode() {
        assert_eq!(
            decode_acquire(1_795_246_357_831_253),
            Attempt::Acquired {
                fence: Some(1_795_246_357_831_253)
            }
        );
        assert_eq!(decode_acquire(-1), Attempt::Busy { ttl: None });
        assert_eq!(
            decode_acquire(-2),
            Attempt::Busy {
                ttl: Some(Duration::ZERO)
            }
        );
        assert_eq!(
            decode_acquire(-2 - 29_500),
            Attempt::Busy {
                ttl: Some(Duration::from_millis(29_500))
            }
        );
    }

    #[test]
    fn hash_slots_follow_the_cluster_rule() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(hash_slot(b"123456789"), 12739);
        assert_eq!(hash_slot(b"foo"), 12182);
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
        assert_eq!(hash_slot(b"foo{}{bar}"), hash_slot(b"foo{}{bar}"));
        let n = Names {
            prefix: "dlock:".into(),
        };
        let key = "stock:42";
        let slot = hash_slot(n.lock(key).as_bytes());
        assert_eq!(hash_slot(n.fence(key).as_bytes()), slot);
        assert_eq!(hash_slot(n.channel(key).as_bytes()), slot);
    }

    #[test]
    fn leases_round_up_to_whole_milliseconds() {
        assert_eq!(millis_ceil(Duration::from_micros(1)), 1);
        assert_eq!(millis_ceil(Duration::from_micros(1500)), 2);
        assert_eq!(millis_ceil(Duration::from_secs(30)), 30_000);
        assert_eq!(millis_ceil(Duration::MAX), u64::MAX);
    }
}
