//! The connection a backend holds: one server (the client library's connection manager and the
//! runtime's own command connection) or a cluster, and the request path through either.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{FromRedisValue, RedisResult, Value};

use super::cluster::ClusterLink;
use super::config::{NodeSettings, redact};
use super::errors::{connect_within, redis_error};
use super::names::Names;
use super::push::push_handler;
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

    /// A call timed out after `timeout`: on Cluster the slot map may be stale (a frozen master
    /// failed over); on one server a connection silent for as long is replaced.
    pub(super) fn note_timeout(&self, timeout: Duration) {
        match self {
            Self::Cluster(link) => link.note_timeout(),
            Self::Single(_, Some(wire)) => wire.note_timeout(timeout),
            Self::Single(_, None) => {}
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
        // Each call is bounded by `timeout` in `Client::call` (one timer per call).
        .set_response_timeout(None)
        .set_number_of_retries(RETRIES)
        .set_max_delay(MAX_DELAY)
        .set_push_sender(on_push)
        .set_automatic_resubscription();
    Ok((client, config))
}
