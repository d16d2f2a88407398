//! Fenced writes: storage that rejects a stale lock holder, on Redis.
//!
//! A lease-based lock cannot stop a holder that was paused (a GC pause, SIGSTOP, a slow
//! network) past its lease from waking up and writing after another holder took the lock.
//! The lock's **fencing token** can: every fresh acquisition gets a token greater than all
//! earlier ones for that key ([`LockGuard::fence`](crate::LockGuard::fence), or
//! [`current_fence`](crate::current_fence) inside an annotated function or
//! [`with_lock`](crate::with_lock)), and the storage remembers the highest token it has seen
//! for each resource and refuses writes that carry a lower one.
//!
//! [`FencedRedis`] is that storage on one Redis server (which should not be the lock engine's:
//! keep the data where it lives). Per resource it keeps one hash, `<prefix><resource>`
//! (default prefix `fenced:`), with the value, the fence it was written with, and the highest
//! fence seen. Each operation is one atomic step on the server:
//!
//! | method | effect | answer |
//! |---|---|---|
//! | [`claim(r, f)`](FencedRedis::claim) | raises the highest fence seen to `f` | `false` if a higher fence was seen (a newer holder exists) |
//! | [`read(r)`](FencedRedis::read) | — | the value and the fence it was written with, or `None` |
//! | [`write(r, v, f)`](FencedRedis::write) | stores `v` with fence `f`, raises the highest seen to `f` | `false`, storing nothing, if a higher fence was seen |
//!
//! An equal fence is accepted, so one holder may claim and write many times.
//!
//! # Read-modify-write: claim, read, write
//!
//! A fenced `write` alone protects blind writes. A read-modify-write (a counter, a stock level)
//! also needs the new holder to **claim** its fence before it reads. Otherwise a stale holder
//! A and a new holder B can interleave as: A reads 5, B reads 5, A writes 6 (accepted: B has not
//! written yet, so no higher fence was seen), B writes 6 (accepted): every write passed the
//! fence check and an update is lost. With the claim, B's fence is recorded before B reads, so
//! A's late write is rejected and B's read-modify-write is the only one that counts.
//!
//! ```no_run
//! use dlock_runtime::fenced::FencedRedis;
//! use dlock_runtime::{LockError, current_fence, lock, with_lock};
//!
//! /// Takes one item from the stock; `Ok(false)` when this holder turned out to be stale.
//! async fn take_one(store: &FencedRedis, item: &str) -> Result<bool, LockError> {
//!     with_lock(lock(format!("stock:{item}")), async {
//!         // The lock's token (`guard.fence()` when holding a guard).
//!         let Some(fence) = current_fence() else {
//!             return Err(LockError::InvalidConfig("this engine gives no fences".into()));
//!         };
//!         let resource = format!("stock:{item}");
//!         if !store.claim(&resource, fence).await? {
//!             return Ok(false); // a newer holder exists: do nothing
//!         }
//!         let stock: u64 = match store.read(&resource).await? {
//!             Some(current) => current.value.parse().unwrap_or(0),
//!             None => 0,
//!         };
//!         // `false` if a newer holder claimed meanwhile: the write did not happen.
//!         store.write(&resource, &stock.saturating_sub(1).to_string(), fence).await
//!     })
//!     .await?
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), LockError> {
//! dlock_runtime::Runtime::from_url("redis://127.0.0.1:6379").await?.install()?;
//! let store = FencedRedis::connect("redis://127.0.0.1:6380").await?;
//! take_one(&store, "apple").await?;
//! # Ok(())
//! # }
//! ```
//!
//! # The same in SQL
//!
//! Any store with a conditional write can check fences. With a `fence` column on the row
//! (start it at 0):
//!
//! ```sql
//! -- claim: raise the fence before reading (0 rows updated: a newer holder exists)
//! UPDATE stock SET fence = $1 WHERE id = $2 AND fence <= $1;
//! SELECT v FROM stock WHERE id = $2;
//! -- write: 0 rows updated means the write was rejected
//! UPDATE stock SET v = $1, fence = $2 WHERE id = $3 AND fence <= $2;
//! ```
//!
//! # What it protects, and what not
//!
//! Fences are only as good as the engine's tokens: strictly increasing per key on one Redis
//! (also across a restart with no data), etcd, ZooKeeper and the memory engine; **not** across
//! a Redis Cluster failover that lost the last writes, and not at all on Redlock
//! ([`fence`](crate::LockGuard::fence) is `None` there). Fences of different keys are not
//! comparable: fence a resource with the token of the lock that guards it.
//!
//! The store is one Redis server (`redis://`, or `rediss://` with the `tls` feature), not a
//! cluster. Its URL takes the redis client's query options (`db`, `user`, `pass`,
//! `protocol`), `ca`, `cert`, `key` (as for the lock engine), `prefix` (default `fenced:`) and `timeout`
//! (each call's bound, default 3 s). A bad URL is [`LockError::InvalidConfig`]; a server that
//! is down or does not answer within the timeout is [`LockError::Backend`]. Passwords never
//! appear in errors or `Debug` output.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Script};

use crate::backend::redis::config::{CLIENT_OPTIONS, NodeSettings, check_tls, node_urls};
use crate::backend::url::{EngineUrl, redact, split_pair};
use crate::error::LockError;

/// The default prefix of the store's keys.
pub const DEFAULT_STORE_PREFIX: &str = "fenced:";

/// `write.lua`: stores a value unless a higher fence was seen. Both scripts start with
/// `stale.lua`, the one copy of the fence comparison.
const WRITE_LUA: &str = concat!(
    include_str!("fenced/stale.lua"),
    include_str!("fenced/write.lua")
);

/// `claim.lua`: raises the highest fence seen.
const CLAIM_LUA: &str = concat!(
    include_str!("fenced/stale.lua"),
    include_str!("fenced/claim.lua")
);

/// The options a store URL takes besides the redis client's.
const STORE_OPTIONS: [&str; 2] = ["prefix", "timeout"];

/// A resource's value and the fence it was written with: what [`FencedRedis::read`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FencedValue {
    /// The value of the last accepted write.
    pub value: String,
    /// The fence that write carried.
    pub fence: u64,
}

/// A Redis server used as fenced storage: writes carrying a fence below the highest one seen
/// for their resource are rejected. See the [module docs](self) for the pattern.
///
/// Cheap to clone (one multiplexed connection that reconnects by itself).
#[derive(Clone)]
pub struct FencedRedis {
    conn: ConnectionManager,
    prefix: String,
    timeout: Duration,
    /// The URL with any password replaced, for `Debug`.
    redacted: Arc<str>,
    write: Arc<Script>,
    claim: Arc<Script>,
}

impl fmt::Debug for FencedRedis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencedRedis")
            .field("url", &self.redacted)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl FencedRedis {
    /// Connects to the store: `redis://[user:password@]host:port[/db][?prefix=..&timeout=..]`,
    /// or `rediss://` (feature `tls`).
    ///
    /// Errors: [`LockError::InvalidConfig`] for a bad URL or an unknown option (naming the
    /// valid ones), [`LockError::Backend`] when the server cannot be reached within the
    /// timeout (default 3 s).
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), dlock_runtime::LockError> {
    /// use dlock_runtime::fenced::FencedRedis;
    /// let store = FencedRedis::connect("redis://127.0.0.1:6380/0?prefix=shop:&timeout=1s").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<FencedRedis, LockError> {
        let (node, prefix, timeout) = parse_url(url)?;
        let client = client(&node)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let what = format!("cannot connect to the fenced store {}", redact(url));
        let conn =
            match tokio::time::timeout(timeout, ConnectionManager::new_with_config(client, config))
                .await
            {
                Ok(Ok(conn)) => conn,
                Ok(Err(e)) => return Err(LockError::backend(None, what, Some(Arc::new(e)))),
                Err(_) => return Err(LockError::backend(None, what, Some(timed_out(timeout)))),
            };
        Ok(FencedRedis {
            conn,
            prefix,
            timeout,
            redacted: redact(url).into(),
            write: Arc::new(Script::new(WRITE_LUA)),
            claim: Arc::new(Script::new(CLAIM_LUA)),
        })
    }

    /// Writes `value` for `resource` with `fence`, unless a higher fence was already seen for
    /// it (by a write or a [`claim`](FencedRedis::claim)). One script, atomic on the server.
    ///
    /// `Ok(true)`: written; the highest fence seen is now `fence`. `Ok(false)`: rejected,
    /// nothing changed: a newer holder exists. An equal fence is accepted.
    ///
    /// ```no_run
    /// # async fn f(store: dlock_runtime::fenced::FencedRedis) -> Result<(), dlock_runtime::LockError> {
    /// assert!(store.write("doc:1", "v2", 20).await?);
    /// assert!(!store.write("doc:1", "v1", 10).await?); // stale: rejected
    /// assert!(store.write("doc:1", "v3", 20).await?); // same holder again: accepted
    /// # Ok(()) }
    /// ```
    pub async fn write(&self, resource: &str, value: &str, fence: u64) -> Result<bool, LockError> {
        let fence = fence.to_string();
        self.accepted(
            &self.write,
            resource,
            &[value, &fence],
            "fenced write failed",
        )
        .await
    }

    /// Raises the highest fence seen for `resource` to `fence`, so that every write with a
    /// lower fence is rejected from now on. A holder that reads, then writes, claims first
    /// (see the [module docs](self)).
    ///
    /// `Ok(true)`: claimed (an equal fence is accepted). `Ok(false)`: a higher fence was
    /// already seen, nothing changed: a newer holder exists, and this one should not go on.
    ///
    /// ```no_run
    /// # async fn f(store: dlock_runtime::fenced::FencedRedis) -> Result<(), dlock_runtime::LockError> {
    /// assert!(store.claim("doc:1", 30).await?);
    /// assert!(!store.write("doc:1", "late", 20).await?); // an older holder is shut out
    /// # Ok(()) }
    /// ```
    pub async fn claim(&self, resource: &str, fence: u64) -> Result<bool, LockError> {
        let fence = fence.to_string();
        self.accepted(&self.claim, resource, &[&fence], "fenced claim failed")
            .await
    }

    /// The value of `resource` and the fence it was written with; `None` if it was never
    /// written (a claim alone stores no value).
    ///
    /// ```no_run
    /// # async fn f(store: dlock_runtime::fenced::FencedRedis) -> Result<(), dlock_runtime::LockError> {
    /// if let Some(current) = store.read("doc:1").await? {
    ///     println!("{} (written with fence {})", current.value, current.fence);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn read(&self, resource: &str) -> Result<Option<FencedValue>, LockError> {
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(self.key(resource)).arg("value").arg("fence");
        let (value, fence): (Option<String>, Option<String>) = self
            .call(resource, "fenced read failed", cmd.query_async(&mut conn))
            .await?;
        match (value, fence) {
            (Some(value), Some(fence)) => match fence.parse() {
                Ok(fence) => Ok(Some(FencedValue { value, fence })),
                Err(_) => Err(LockError::backend(
                    Some(resource),
                    format!("fenced read: the stored fence `{fence}` is not a u64"),
                    None,
                )),
            },
            _ => Ok(None),
        }
    }

    /// The key prefix of this store's hashes.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn key(&self, resource: &str) -> String {
        format!("{}{resource}", self.prefix)
    }

    /// Runs `script` on `resource`'s hash with `args`: whether it answered 1 (accepted, where
    /// 0 is rejected). Failures are `Backend` naming the resource, with `what` as the message.
    async fn accepted(
        &self,
        script: &Script,
        resource: &str,
        args: &[&str],
        what: &str,
    ) -> Result<bool, LockError> {
        let mut invocation = script.key(self.key(resource));
        for arg in args {
            invocation.arg(*arg);
        }
        let mut conn = self.conn.clone();
        let answer: i64 = self
            .call(resource, what, invocation.invoke_async(&mut conn))
            .await?;
        Ok(answer == 1)
    }

    /// Awaits one call within the timeout; failures are `Backend` naming the resource.
    async fn call<T>(
        &self,
        resource: &str,
        what: &str,
        fut: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, LockError> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(LockError::backend(Some(resource), what, Some(Arc::new(e)))),
            Err(_) => Err(LockError::backend(
                Some(resource),
                what,
                Some(timed_out(self.timeout)),
            )),
        }
    }
}

/// The node URL for the redis client, the prefix and the timeout of a store URL.
fn parse_url(url: &str) -> Result<(String, String, Duration), LockError> {
    let expected = "expected redis://host:port or rediss://host:port (one server)";
    if !url.contains("://") {
        // Without a scheme there is no telling where a password ends: do not echo the URL.
        return Err(LockError::config(format!(
            "the fenced store URL has no scheme; {expected}"
        )));
    }
    let mut parsed = EngineUrl::parse(url)?;
    if !matches!(parsed.scheme, "redis" | "rediss") {
        return Err(LockError::config(format!(
            "`{}`: a fenced store is one Redis server; {expected}",
            redact(url)
        )));
    }
    let mut prefix = DEFAULT_STORE_PREFIX.to_owned();
    let mut timeout = crate::DEFAULT_TIMEOUT;
    for (name, value) in parsed.take_options(&STORE_OPTIONS) {
        match name {
            "prefix" => prefix = value.to_owned(),
            _ => {
                timeout = crate::duration::parse(value)
                    .filter(|t| !t.is_zero())
                    .ok_or_else(|| {
                        LockError::config(format!(
                            "fenced store option `timeout={value}`: expected a positive duration such as 500ms or 3s"
                        ))
                    })?;
            }
        }
    }
    if let Some(pair) = parsed
        .options
        .iter()
        .find(|pair| !CLIENT_OPTIONS.contains(&split_pair(pair).0))
    {
        let (name, _) = split_pair(pair);
        return Err(LockError::config(format!(
            "unknown option `{name}` in `{}`; expected prefix, timeout, {} or {}",
            redact(url),
            CLIENT_OPTIONS[..CLIENT_OPTIONS.len() - 1].join(", "),
            CLIENT_OPTIONS[CLIENT_OPTIONS.len() - 1],
        )));
    }
    let node = node_urls(&parsed, parsed.scheme, &[parsed.base]).remove(0);
    check_tls(&node)?;
    Ok((node, prefix, timeout))
}

/// A redis client for `node` (its `db`, `user`, `pass` applied; `ca`, `cert`, `key` read).
fn client(node: &str) -> Result<redis::Client, LockError> {
    NodeSettings::parse(node)?.client()
}

/// An I/O "timed out" error as the source of a `Backend` error.
fn timed_out(timeout: Duration) -> Arc<dyn std::error::Error + Send + Sync> {
    Arc::new(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no answer within {timeout:?}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls_take_prefix_timeout_and_client_options() {
        let (node, prefix, timeout) =
            parse_url("redis://:pw@h:1/2?prefix=shop:&timeout=250ms&db=3").expect("valid");
        assert_eq!(node, "redis://:pw@h:1/2?db=3");
        assert_eq!(prefix, "shop:");
        assert_eq!(timeout, Duration::from_millis(250));
        let (node, prefix, timeout) = parse_url("redis://h:1").expect("valid");
        assert_eq!(
            (node.as_str(), prefix.as_str(), timeout),
            ("redis://h:1", DEFAULT_STORE_PREFIX, crate::DEFAULT_TIMEOUT)
        );
    }

    #[test]
    fn bad_store_urls_are_invalid_config_without_the_password() {
        for url in [
            "redis://:s3cret@h:1?lease=1s",
            "redis://:s3cret@h:1?timeout=0s",
            "redis://:s3cret@h:1?timeout=soon",
            "redis+cluster://:s3cret@h:1,h:2",
            "etcd://h:1",
            ":s3cret@h:1",
        ] {
            let err = parse_url(url).expect_err(url);
            assert!(err.is_invalid_config(), "{url}: {err}");
            assert!(!err.to_string().contains("s3cret"), "{url}: {err}");
        }
        let err = parse_url("redis://h:1?lease=1s").expect_err("unknown option");
        assert!(
            err.to_string()
                .contains("expected prefix, timeout, protocol, db, user, pass, ca, cert or key"),
            "{err}"
        );
    }
}
