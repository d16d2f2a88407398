//! The request layer every job file calls: one connection ([`Link`]), the key layout, the
//! scripts, and how a request is bounded by the timeout and its outcome mapped to a
//! `LockError` (an ACL refusal named as the missing grant, a timeout reported to the link).

use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use redis::RedisError;

use super::acl;
use super::errors::{redis_error, timed_out};
use super::link::{Conn, Link};
use super::names::Names;
use super::script::{Lua, Scripts, keep_command, spare_command};
use crate::backend::Context;
use crate::error::LockError;

/// One server's or one cluster's connection, with what every request needs.
pub(super) struct Client {
    pub(super) link: Link,
    pub(super) names: Names,
    /// This runtime's id (names its own release messages and its place in a key's line).
    pub(super) origin: String,
    pub(super) timeout: Duration,
    /// Whether each request is bounded by `timeout` here. Not on a Redlock node: the fan-out
    /// bounds each node's call as a whole by the same timeout (`redlock::each_node`,
    /// `on_all`, the background releases), and a second timer a request would be work for
    /// nothing.
    pub(super) bounds_requests: bool,
    pub(super) scripts: Scripts,
}

impl Client {
    pub(super) fn new(link: Link, names: Names, ctx: &Context) -> Self {
        Self {
            link,
            names,
            origin: ctx.origin.clone(),
            timeout: ctx.timeout,
            bounds_requests: true,
            scripts: Scripts::new(),
        }
    }

    /// The connection commands go through.
    pub(super) fn handle(&self) -> Conn {
        self.link.handle()
    }

    /// `PUBLISH`, or `SPUBLISH` on Cluster (scripts take it as an argument).
    pub(super) fn publish_command(&self) -> &'static str {
        self.link.publish_command()
    }

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

    /// [`bounded`](Client::bounded) by `bound` (see [`bound_from`](Client::bound_from)).
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

    /// [`settle`](Client::settle) for a call that ran `script`: a refusal of the
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
                    self.link.note_timeout(self.timeout);
                }
                let publish = self.publish_command();
                match acl::denial(&e.to_string(), script, &self.names, publish) {
                    Some(denial) => Err(redis_error(key, &format!("{what}: {denial}"), e)),
                    None => Err(redis_error(key, what, e)),
                }
            }
            None => {
                self.link.note_timeout(self.timeout);
                let elapsed = timed_out(format!("no reply within {:?}", self.timeout));
                Err(LockError::backend(key, what, Some(elapsed)))
            }
        }
    }

    /// Runs `lua` with `fill` appending `numkeys`, the keys and the arguments.
    pub(super) async fn run_script<T: redis::FromRedisValue>(
        &self,
        lua: &Lua,
        key: Option<&str>,
        what: &str,
        fill: impl Fn(&mut redis::Cmd),
    ) -> Result<T, LockError> {
        let mut conn = self.handle();
        let mut cmd = spare_command();
        cmd.arg("EVALSHA").arg(&lua.sha);
        fill(&mut cmd);
        let answer = self.bounded(std::pin::pin!(conn.query::<T>(&cmd))).await;
        let answer = match answer {
            Some(Err(err))
                if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(lua.src);
                fill(&mut cmd);
                self.bounded(std::pin::pin!(conn.query(&cmd))).await
            }
            answer => answer,
        };
        keep_command(cmd);
        self.settle_script(key, what, answer, Some(lua))
    }
}
