//! The request layer of etcd: the client (its connection tasks on a thread of their own),
//! every request bounded by the timeout (one refused at connect sent again), the names of a
//! key's queue, and the deletes that must not be given up (retried in the background).

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, ConnectOptions, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
};
use tokio::time::Instant;

use crate::backend::Context;
use crate::backend::io_thread::IoThread;
use crate::backend::url::redact_each;
use crate::error::LockError;

/// The cluster's client, with what every request needs.
pub(super) struct Etcd {
    pub(super) client: Client,
    /// Where `client`'s connection tasks run; they stop when the backend drops.
    _io: IoThread,
    pub(super) prefix: String,
    pub(super) timeout: Duration,
    /// Held while the backend lives: background deletes stop once it is gone.
    alive: Arc<()>,
}

pub(super) fn etcd_error(key: Option<&str>, what: &str, err: etcd_client::Error) -> LockError {
    LockError::backend(key, what, Some(Arc::new(err)))
}

/// How often a request refused at connect is sent again.
pub(super) const CONNECT_RETRIES: u32 = 6;

/// A request that failed to connect (so it never reached a member).
pub(super) fn is_connect_error(err: &etcd_client::Error) -> bool {
    let text = err.to_string();
    text.contains("tcp connect error") || text.contains("Connection refused")
}

/// The lease's TTL in whole seconds, rounded up (etcd's resolution), at least 1.
pub(super) fn ttl_seconds(lease: Duration) -> i64 {
    let secs = lease.as_nanos().div_ceil(1_000_000_000);
    i64::try_from(secs).unwrap_or(i64::MAX).max(1)
}

impl Etcd {
    /// Connects to the cluster through `endpoints` (`http://host:port`).
    pub(super) async fn connect(endpoints: &[String], ctx: &Context) -> Result<Self, LockError> {
        let (prefix, timeout) = (ctx.prefix.clone(), ctx.timeout);
        // HTTP/2 pings every `timeout`, answered within `timeout`, also while idle: a
        // connection that went silent (a black hole, a frozen member) is closed and made again
        // instead of failing every request until the kernel gives up on it.
        let options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout)
            .with_keep_alive(timeout, timeout)
            .with_keep_alive_while_idle(true);
        // Messages show the endpoints with their credentials hidden.
        let joined = redact_each(endpoints).join(",");
        // The client's connection tasks live on a thread of the backend's own (see
        // `io_thread.rs`): a holder blocking its thread must not hold them up.
        let io = IoThread::start("dlock-etcd")?;
        let owned = endpoints.to_vec();
        let connecting = io.run(async move { Client::connect(owned, Some(options)).await });
        let client = match tokio::time::timeout(timeout, connecting).await {
            Ok(Err(stopped)) => return Err(stopped),
            Ok(Ok(Ok(client))) => client,
            Ok(Ok(Err(
                e @ (etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_)),
            ))) => {
                return Err(LockError::config(format!(
                    "bad etcd endpoints `{joined}`: {e}"
                )));
            }
            Ok(Ok(Err(e))) => {
                return Err(etcd_error(
                    None,
                    &format!("cannot connect to etcd {joined}"),
                    e,
                ));
            }
            Err(_) => {
                return Err(LockError::backend(
                    None,
                    format!("cannot connect to etcd {joined} within {timeout:?}"),
                    None,
                ));
            }
        };
        let etcd = Self {
            client,
            _io: io,
            prefix,
            timeout,
            alive: Arc::new(()),
        };
        // Prove the cluster answers (the client connects lazily).
        etcd.bounded(None, "etcd does not answer", |mut c| async move {
            c.get("dlock-ping", Some(GetOptions::new().with_count_only()))
                .await
        })
        .await?;
        Ok(etcd)
    }

    /// One read of `key`'s queue (every contender's key under its prefix) with `options`.
    pub(super) async fn read_queue(
        &self,
        key: &str,
        what: &str,
        options: GetOptions,
    ) -> Result<etcd_client::GetResponse, LockError> {
        self.bounded(Some(key), what, |mut c| {
            let options = options.clone();
            async move { c.get(self.queue_prefix(key), Some(options)).await }
        })
        .await
    }

    /// Every entry of `key`'s queue, in line (see [`in_line`]).
    pub(super) async fn read_in_line(
        &self,
        key: &str,
        what: &str,
    ) -> Result<etcd_client::GetResponse, LockError> {
        self.read_queue(key, what, in_line()).await
    }

    pub(super) fn queue_prefix(&self, key: &str) -> String {
        format!("{}{key}/", self.prefix)
    }

    /// The key of `owner` in `key`'s queue.
    pub(super) fn contender_key(&self, key: &str, owner: &str) -> String {
        format!("{}{owner}", self.queue_prefix(key))
    }

    /// Deletes `contender_key` in the background, again and again until the server answers
    /// (while this backend lives): a key on the runtime's shared lease does not expire while
    /// the runtime lives, so a release that got no answer (the server down or unreachable)
    /// must not be given up. Tried at least every quarter second, so the key goes within
    /// about that of the server's return. Deleting a key named by its owner token removes
    /// nothing of anybody else's.
    pub(super) fn remove_later(&self, contender_key: String) {
        let alive = Arc::downgrade(&self.alive);
        let (client, timeout) = (self.client.clone(), self.timeout);
        tokio::spawn(async move {
            let mut pause = Duration::from_millis(50);
            loop {
                tokio::time::sleep(pause).await;
                if alive.upgrade().is_none() {
                    return;
                }
                let mut c = client.clone();
                let ours = contender_key.as_str();
                if let Ok(Ok(_)) = tokio::time::timeout(timeout, c.delete(ours, None)).await {
                    tracing::debug!(key = %contender_key, "a release that got no answer is done");
                    return;
                }
                pause = (pause * 2).min(Duration::from_millis(250));
            }
        });
    }

    /// Deletes `contender_key` in the background once `hold` has passed: the end of a hold
    /// that keeps its key, when moving the key to a lease of that TTL got no answer.
    pub(super) fn remove_after(&self, contender_key: String, hold: Duration) {
        let alive = Arc::downgrade(&self.alive);
        let backend = (self.client.clone(), self.timeout);
        tokio::spawn(async move {
            tokio::time::sleep(hold).await;
            if alive.upgrade().is_none() {
                return;
            }
            let (mut c, timeout) = backend;
            if let Ok(Ok(_)) =
                tokio::time::timeout(timeout, c.delete(contender_key.as_str(), None)).await
            {
                return;
            }
            tracing::debug!(key = %contender_key, "a kept key was not deleted at the end of its hold; it expires with its lease");
        });
    }

    /// Revokes `lease` in the background (it would expire at its TTL anyway).
    pub(super) fn revoke_later(&self, lease: i64) {
        let (mut c, timeout) = (self.client.clone(), self.timeout);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(timeout, c.lease_revoke(lease)).await;
        });
    }

    /// The tombstone of `owner`: written by a release that found no key of `owner`'s, so
    /// that its acquire request, should it land later, writes nothing (the joining
    /// transaction requires it absent). `<prefix>/<owner>` is under no queue: a queue is
    /// `<prefix><key>/` with a non-empty key, and the owner token has no `/`.
    pub(super) fn tombstone_key(&self, owner: &str) -> String {
        format!("{}/{owner}", self.prefix)
    }

    /// After a release found no key of `owner`'s: writes its tombstone (on a lease of its own
    /// that outlives any request of that owner still on its way) and deletes its key again,
    /// in one transaction. An acquire request that reaches the server after its compensating
    /// release (a reordered or late request) then leaves no key behind, instead of holding the
    /// key on the runtime's shared lease.
    pub(super) async fn bury(
        &self,
        key: &str,
        owner: &str,
        contender_key: &str,
    ) -> Result<(), LockError> {
        let ttl = ttl_seconds((self.timeout * 4).max(Duration::from_secs(5)));
        let lease = self
            .bounded(Some(key), "release failed", |mut c| async move {
                c.lease_grant(ttl, None).await
            })
            .await?
            .id();
        let tombstone = self.tombstone_key(owner);
        let txn = Txn::new().and_then([
            TxnOp::put(
                tombstone.as_str(),
                "released",
                Some(PutOptions::new().with_lease(lease)),
            ),
            TxnOp::delete(contender_key, None),
        ]);
        self.bounded(Some(key), "release failed", |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await?;
        Ok(())
    }

    /// Runs `op` on a client, bounded by the timeout. A request refused at connect never
    /// reached a member, so it is sent again (the client's balanced channel may still route to
    /// a member that is down).
    pub(super) async fn bounded<T, Fut>(
        &self,
        key: Option<&str>,
        what: &str,
        mut op: impl FnMut(Client) -> Fut,
    ) -> Result<T, LockError>
    where
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + self.timeout;
        let mut retries = 0;
        loop {
            match tokio::time::timeout_at(deadline, op(self.client.clone())).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if retries < CONNECT_RETRIES && is_connect_error(&e) => {
                    retries += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(Err(e)) => return Err(etcd_error(key, what, e)),
                Err(_) => {
                    return Err(LockError::backend(
                        key,
                        format!("{what}: no reply within {:?}", self.timeout),
                        None,
                    ));
                }
            }
        }
    }
}

/// The options that read a queue's prefix in line: oldest (first created, the head) first.
pub(super) fn in_line() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(ttl_seconds(Duration::from_millis(1)), 1);
        assert_eq!(ttl_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(ttl_seconds(Duration::from_secs(30)), 30);
        assert_eq!(ttl_seconds(Duration::MAX), i64::MAX);
    }
}
