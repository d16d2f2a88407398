//! The connection a backend holds, and how a call's outcome becomes a `LockError`.

use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{FromRedisValue, RedisError, RedisResult, Value};

use super::RedisBackend;
use super::acl;
use super::cluster::ClusterLink;
use super::config::{NodeSettings, redact};
use super::errors::{connect_within, redis_error, timed_out};
use super::names::Names;
use super::push::push_handler;
use super::script::Lua;
use super::wire::{Caller, Packed, Wire};
use crate::backend::Context;
use crate::error::LockError;

/// One server (reconnecting, resubscribing), its command connection of the runtime's own
/// (plaintext TCP: see `wire.rs`), or a cluster (slot-routed, MOVED/ASK and failover handled
/// by the client).
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Wire(Caller),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Wire(c) => {
                let sent = c.send_one(Packed::Cmd(cmd));
                Box::pin(async move { sent.await?.extract_error() })
            }
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
            Self::Wire(c) => {
                let sent = c.send(Packed::Pipeline(cmd), offset + count, count);
                Box::pin(sent)
            }
            Self::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Wire(c) => c.db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

impl Conn {
    /// Sends `cmd` and converts its answer, as `Cmd::query_async` does, but without boxing the
    /// request's future on a single server (its `ConnectionLike` impl allocates one a call).
    pub(super) async fn query<T: FromRedisValue>(&mut self, cmd: &redis::Cmd) -> RedisResult<T> {
        let value = match self {
            Self::Single(c) => c.send_packed_command(cmd).await?,
            Self::Wire(c) => c.send_one(Packed::Cmd(cmd)).await?,
            Self::Cluster(c) => c.req_packed_command(cmd).await?,
        };
        Ok(redis::from_redis_value(value.extract_error()?)?)
    }

    /// Sends the `count` commands of `pipe` and answers their replies, unconverted (likewise
    /// without a boxed future on a single server). A server error in any reply, even one of a
    /// command the pipeline ignores, is the error.
    pub(super) async fn replies(
        &mut self,
        pipe: &redis::Pipeline,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let replies = match self {
            Self::Single(c) => c.send_packed_commands(pipe, 0, count).await?,
            Self::Wire(c) => c.send(Packed::Pipeline(pipe), count, count).await?,
            Self::Cluster(c) => c.req_packed_commands(pipe, 0, count).await?,
        };
        replies.into_iter().map(Value::extract_error).collect()
    }
}

/// The connection a backend holds: on one server, the client library's connection manager
/// (subscriptions and their pushes; every command when the server is not plaintext TCP) and
/// the command connection of the runtime's own.
pub(super) enum Link {
    Single(ConnectionManager, Option<Wire>),
    Cluster(Arc<ClusterLink>),
}

impl Link {
    /// Connects to one server (`redis://` or `rediss://`), switched to RESP3 for pushes.
    pub(super) async fn single(url: &str, names: &Names, ctx: &Context) -> Result<Self, LockError> {
        let (client, config) = open(url, names, ctx)?;
        let wire = Wire::for_server(
            client.get_connection_info(),
            ctx.timeout,
            RETRIES,
            MAX_DELAY,
            ctx.wakeups.clone(),
        );
        let what = format!("cannot connect to {}", redact(url));
        let plaintext = url.starts_with("redis://");
        let conn = connect_within(
            ctx.timeout,
            &what,
            plaintext,
            ConnectionManager::new_with_config(client, config),
        )
        .await?;
        if let Some(wire) = &wire {
            connect_within(ctx.timeout, &what, plaintext, wire.ping()).await?;
        }
        Ok(Self::Single(conn, wire))
    }

    /// Like [`Link::single`], but connects on first use: a node that is down now answers each
    /// call with an error (Redlock tolerates a minority of those).
    pub(super) fn single_lazy(url: &str, names: &Names, ctx: &Context) -> Result<Self, LockError> {
        let (client, config) = open(url, names, ctx)?;
        // No retries inside a call: a node that is down fails fast (connection refused) and
        // the next call tries again.
        let config = config.set_number_of_retries(0);
        let wire = Wire::for_server(
            client.get_connection_info(),
            ctx.timeout,
            0,
            MAX_DELAY,
            ctx.wakeups.clone(),
        );
        let conn = ConnectionManager::new_lazy_with_config(client, config).map_err(|e| {
            let what = format!("cannot set up a connection to {}", redact(url));
            redis_error(None, &what, e)
        })?;
        Ok(Self::Single(conn, wire))
    }

    /// The connection commands go through.
    pub(super) fn handle(&self) -> Conn {
        match self {
            Self::Single(_, Some(wire)) => Conn::Wire(wire.caller()),
            Self::Single(c, None) => Conn::Single(c.clone()),
            Self::Cluster(link) => Conn::Cluster(link.conn()),
        }
    }

    pub(super) fn publish_command(&self) -> &'static str {
        match self {
            Self::Single(..) => "PUBLISH",
            Self::Cluster(_) => "SPUBLISH",
        }
    }

    /// A call timed out: on Cluster the slot map may be stale (a frozen master failed over).
    fn note_timeout(&self) {
        if let Self::Cluster(link) = self {
            link.note_timeout();
        }
    }
}

/// Reconnection attempts after a failed one, and the longest pause between two, on one server
/// (a Redlock node makes none: see [`Link::single_lazy`]).
const RETRIES: usize = 2;
const MAX_DELAY: Duration = Duration::from_millis(500);

/// The client and connection settings of one server: RESP3, the push handler, reconnection.
fn open(
    url: &str,
    names: &Names,
    ctx: &Context,
) -> Result<(redis::Client, ConnectionManagerConfig), LockError> {
    let client = NodeSettings::parse(url)?.client()?;
    let on_push = push_handler(ctx.wakeups.clone(), names.clone(), ctx.origin.clone(), None);
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(ctx.timeout))
        // Each call is bounded by `timeout` in `RedisBackend::call` (one timer per call).
        .set_response_timeout(None)
        .set_number_of_retries(RETRIES)
        .set_max_delay(MAX_DELAY)
        .set_push_sender(on_push)
        .set_automatic_resubscription();
    Ok((client, config))
}

impl RedisBackend {
    /// Runs one call with the response bound, mapping errors to `Backend` naming the key.
    pub(super) async fn call<T>(
        &self,
        key: Option<&str>,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, RedisError>>,
    ) -> Result<T, LockError> {
        let answer = self.bounded(std::pin::pin!(fut)).await;
        self.settle(key, what, answer)
    }

    /// Awaits `request` for at most the response bound; `None` when it ran out. The request is
    /// pinned where the caller made it: a request future is large (over a kilobyte on one
    /// server), and each move into a wrapper such as `tokio::time::timeout` copies all of it.
    pub(super) async fn bounded<F: std::future::Future>(
        &self,
        request: Pin<&mut F>,
    ) -> Option<F::Output> {
        if !self.bounds_requests {
            // A Redlock node: the fan-out bounds the node's call.
            return Some(request.await);
        }
        self.bounded_by(request, std::pin::pin!(tokio::time::sleep(self.timeout)))
            .await
    }

    /// The response bound of a request sent at `sent_at` (a clock reading the caller has
    /// anyway: the bound reads no clock of its own).
    pub(super) fn bound_from(&self, sent_at: tokio::time::Instant) -> tokio::time::Sleep {
        match sent_at.checked_add(self.timeout) {
            Some(deadline) => tokio::time::sleep_until(deadline),
            None => tokio::time::sleep(self.timeout),
        }
    }

    /// [`bounded`](RedisBackend::bounded) by `bound` (see [`bound_from`](RedisBackend::bound_from)).
    pub(super) async fn bounded_by<F: std::future::Future>(
        &self,
        mut request: Pin<&mut F>,
        mut bound: Pin<&mut tokio::time::Sleep>,
    ) -> Option<F::Output> {
        std::future::poll_fn(|cx| {
            if let Poll::Ready(answer) = request.as_mut().poll(cx) {
                return Poll::Ready(Some(answer));
            }
            bound.as_mut().poll(cx).map(|()| None)
        })
        .await
    }

    /// Maps one bounded call's outcome: errors become `Backend` naming the key, and a timeout
    /// (ours or the client's) is reported to the link (a stale cluster slot map).
    pub(super) fn settle<T>(
        &self,
        key: Option<&str>,
        what: &str,
        answer: Option<Result<T, RedisError>>,
    ) -> Result<T, LockError> {
        self.settle_script(key, what, answer, None)
    }

    /// [`settle`](RedisBackend::settle) for a call that ran `script`: a refusal of the
    /// server's ACL names the permission the user lacks (a command the script runs, the key or
    /// channel pattern).
    pub(super) fn settle_script<T>(
        &self,
        key: Option<&str>,
        what: &str,
        answer: Option<Result<T, RedisError>>,
        script: Option<&Lua>,
    ) -> Result<T, LockError> {
        match answer {
            Some(Ok(v)) => Ok(v),
            Some(Err(e)) => {
                if e.is_timeout() {
                    self.link.note_timeout();
                }
                let publish = self.link.publish_command();
                match acl::denial(&e.to_string(), script, &self.names, publish) {
                    Some(denial) => Err(redis_error(key, &format!("{what}: {denial}"), e)),
                    None => Err(redis_error(key, what, e)),
                }
            }
            None => {
                self.link.note_timeout();
                let elapsed = timed_out(format!("no reply within {:?}", self.timeout));
                Err(LockError::backend(key, what, Some(elapsed)))
            }
        }
    }
}
