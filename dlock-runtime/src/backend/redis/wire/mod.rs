//! The command connection to one plaintext server: a TCP connection of the runtime's own,
//! through which every command of a single-server backend goes (the client library's
//! connection manager keeps the subscriptions and their pushes).
//!
//! The one rule: **a request is queued when it is made**, before its future is first polled
//! (its bytes written or appended to the connection's buffer, its reply slot in line, under
//! one lock), so requests reach the server in the order they were made, also across a
//! reconnection; one whose caller has gone before the connection is back is not sent.

use std::sync::Arc;
use std::time::Duration;

use redis::{ConnectionInfo, RedisResult, Value};

use self::dial::Target;
use self::reply::protocol_error;
pub(super) use self::request::Packed;
use self::request::{Got, Slot};
use self::state::{Shared, dropped};
use crate::backend::Wakeups;

mod dial;
mod frame;
mod reply;
mod request;
mod state;

/// The command connection to one server (see the module documentation). Dropping the last
/// handle closes it: requests in flight then fail.
pub(super) struct Wire {
    shared: Arc<Shared>,
}

impl Wire {
    /// A connection to the server of `info` if it is a plaintext TCP one (none for TLS or a
    /// Unix socket: those go through the client library). Connects on first use.
    pub(super) fn for_server(
        info: &ConnectionInfo,
        connect_timeout: Duration,
        retries: usize,
        max_delay: Duration,
        on_lost: Arc<dyn Wakeups>,
    ) -> Option<Self> {
        let target = Target::for_server(info, connect_timeout, retries, max_delay)?;
        let shared = Shared::new(target, on_lost);
        Some(Self { shared })
    }

    /// A handle for calls.
    pub(super) fn caller(&self) -> Caller {
        Caller {
            shared: self.shared.clone(),
        }
    }

    /// A request timed out after `timeout`: a connection silent for as long is replaced.
    pub(super) fn note_timeout(&self, timeout: Duration) {
        self.shared.note_timeout(timeout);
    }

    /// Connects now, failing like a request would (for a backend that connects eagerly).
    pub(super) async fn ping(&self) -> RedisResult<()> {
        let ping = redis::cmd("PING");
        let reply = self.caller().send_one(Packed::Cmd(&ping)).await?;
        reply.extract_error().map(drop)
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.shared.close();
    }
}

/// A cheap handle through which requests are made.
#[derive(Clone)]
pub(super) struct Caller {
    shared: Arc<Shared>,
}

impl Caller {
    /// The database the connection uses (the URL's).
    pub(super) fn db(&self) -> i64 {
        self.shared.target.db
    }

    /// Queues `request` (one command) now, and answers its reply (a server error as a value).
    pub(super) fn send_one(
        &self,
        request: Packed<'_>,
    ) -> impl Future<Output = RedisResult<Value>> + Send + use<> {
        let answer = self.send_packed(request, 1, 1);
        async move {
            match answer.await? {
                Got::One(Some(value)) => Ok(value),
                Got::Many(mut many) if many.len() == 1 => Ok(many.remove(0)),
                _ => Err(protocol_error("no reply to a command")),
            }
        }
    }

    /// Queues `request` (expecting `count` replies) now, and answers the last `keep` replies
    /// (server errors among them as values).
    pub(super) fn send(
        &self,
        request: Packed<'_>,
        count: usize,
        keep: usize,
    ) -> impl Future<Output = RedisResult<Vec<Value>>> + Send + use<> {
        let answer = self.send_packed(request, count, keep);
        async move {
            Ok(match answer.await? {
                Got::One(one) => one.into_iter().collect(),
                Got::Many(many) => many,
            })
        }
    }

    fn send_packed(
        &self,
        request: Packed<'_>,
        count: usize,
        keep: usize,
    ) -> impl Future<Output = RedisResult<Got>> + Send + use<> {
        let (slot, rx) = Slot::new(count, keep);
        let queued = self.shared.queue(request, slot);
        async move {
            queued?;
            match rx.await {
                Ok(answer) => answer,
                Err(_) => Err(dropped("the connection closed before the reply")),
            }
        }
    }
}

#[cfg(test)]
mod tests;
