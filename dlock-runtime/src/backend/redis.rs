//! Standalone Redis (`redis://`, `rediss://`): Lua scripts on one RESP3 connection that carries
//! both the commands and the pub/sub pushes.
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

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
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

struct Scripts {
    acquire: Script,
    renew: Script,
    release: Script,
    force_unlock: Script,
}

pub(crate) struct RedisBackend {
    conn: ConnectionManager,
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
        let conn =
            tokio::time::timeout(timeout, ConnectionManager::new_with_config(client, config))
                .await
                .map_err(|_| {
                    let elapsed = std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no connection within {timeout:?}"),
                    );
                    LockError::backend(
                        None,
                        format!("cannot connect to {url}"),
                        Some(Arc::new(elapsed)),
                    )
                })?
                .map_err(|e| redis_error(None, &format!("cannot connect to {url}"), e))?;
        Ok(Self::with_connection(conn, names, origin, timeout))
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
        let conn = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| redis_error(None, &format!("cannot set up a connection to {url}"), e))?;
        Ok(Self::with_connection(conn, names, origin, timeout))
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
        let push_names = names.clone();
        let push_origin = origin.to_owned();
        let on_push = move |push: PushInfo| -> Result<(), std::convert::Infallible> {
            on_push(&hub, &push_names, &push_origin, push);
            Ok(())
        };
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

    fn with_connection(
        conn: ConnectionManager,
        names: Names,
        origin: String,
        timeout: Duration,
    ) -> Self {
        Self {
            conn,
            names,
            origin,
            timeout,
            scripts: Scripts {
                acquire: Script::new(include_str!("lua/acquire.lua")),
                renew: Script::new(include_str!("lua/renew.lua")),
                release: Script::new(include_str!("lua/release.lua")),
                force_unlock: Script::new(include_str!("lua/force_unlock.lua")),
            },
        }
    }

    /// Runs one call with the response bound, mapping errors to `Backend` naming the key.
    async fn call<T>(
        &self,
        key: Option<&str>,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, RedisError>>,
    ) -> Result<T, LockError> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(redis_error(key, what, e)),
            Err(_) => {
                let elapsed = std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no reply within {:?}", self.timeout),
                );
                Err(LockError::backend(key, what, Some(Arc::new(elapsed))))
            }
        }
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
        PushKind::Message => {
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
        PushKind::Subscribe => {
            if let Some(key) = channel_key(push.data.first()) {
                hub.wake(&key);
            }
        }
        PushKind::Disconnection => hub.wake_all(),
        _ => {}
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
            let mut conn = self.conn.clone();
            let mut invocation = self.scripts.acquire.prepare_invoke();
            invocation
                .key(self.names.lock(key))
                .key(self.names.fence(key))
                .arg(owner)
                .arg(millis_ceil(lease))
                .arg(millis_ceil(lease.saturating_add(FENCE_TTL)));
            let reply: i64 = self
                .call(
                    Some(key),
                    "acquire failed",
                    invocation.invoke_async(&mut conn),
                )
                .await?;
            Ok(decode_acquire(reply))
        })
    }

    fn renew<'a>(
        &'a self,
        batch: &'a [Renewal],
    ) -> BoxFuture<'a, Result<Vec<Option<bool>>, LockError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let mut invocation = self.scripts.renew.prepare_invoke();
            for item in batch {
                invocation
                    .key(self.names.lock(&item.key))
                    .arg(&item.owner)
                    .arg(millis_ceil(item.lease));
            }
            let key = (batch.len() == 1).then(|| batch[0].key.as_str());
            let reply: Vec<i64> = self
                .call(key, "renewal failed", invocation.invoke_async(&mut conn))
                .await?;
            Ok(reply.into_iter().map(|r| Some(r == 1)).collect())
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<Released, LockError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let mut invocation = self.scripts.release.prepare_invoke();
            invocation
                .key(self.names.lock(key))
                .arg(owner)
                .arg(self.names.channel(key))
                .arg(&self.origin);
            let reply: i64 = self
                .call(
                    Some(key),
                    "release failed",
                    invocation.invoke_async(&mut conn),
                )
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
            let mut conn = self.conn.clone();
            let mut invocation = self.scripts.force_unlock.prepare_invoke();
            invocation
                .key(self.names.lock(key))
                .arg(self.names.channel(key))
                .arg(FORCED);
            let reply: i64 = self
                .call(
                    Some(key),
                    "force unlock failed",
                    invocation.invoke_async(&mut conn),
                )
                .await?;
            Ok(reply == 1)
        })
    }

    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let cmd = redis::cmd("EXISTS").arg(self.names.lock(key)).clone();
            let n: i64 = self
                .call(Some(key), "lookup failed", cmd.query_async(&mut conn))
                .await?;
            Ok(n == 1)
        })
    }

    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let channel = self.names.channel(key);
            self.call(Some(key), "subscribe failed", conn.subscribe(channel))
                .await
        })
    }

    fn unwatch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let channel = self.names.channel(key);
            self.call(Some(key), "unsubscribe failed", conn.unsubscribe(channel))
                .await
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
    fn leases_round_up_to_whole_milliseconds() {
        assert_eq!(millis_ceil(Duration::from_micros(1)), 1);
        assert_eq!(millis_ceil(Duration::from_micros(1500)), 2);
        assert_eq!(millis_ceil(Duration::from_secs(30)), 30_000);
        assert_eq!(millis_ceil(Duration::MAX), u64::MAX);
    }
}
