//! etcd (`etcd://h1:2379,h2:2379`): a consensus store (Raft, CP), for locks that must stay
//! correct through a failover.
//!
//! The recipe of etcd's own concurrency package, implemented here on plain KV operations (not
//! the Lock RPC, so that a cancelled or timed-out waiter removes its own place in the queue):
//! - every contender grants a **lease** (TTL = the lock's lease rounded up to whole seconds;
//!   the server may raise it to its minimum) and keeps it alive from that moment, also while
//!   queued, so it cannot expire in the queue;
//! - it writes its key `<prefix><key>/<lease id>` attached to the lease; the holder is the
//!   lowest **create revision** under the prefix (FIFO), which is also the fencing token
//!   (strictly increasing cluster-wide);
//! - a waiter watches only its predecessor's key (no herd) and looks again when it is deleted;
//! - after it is first in line, it checks that its key still exists and its lease is still
//!   alive before reporting the lock acquired (etcd 3.4 was seen granting a queued waiter whose
//!   lease had expired);
//! - release revokes the lease, which deletes the key atomically; a deadline or a cancellation
//!   does the same (the runtime's compensating release);
//! - an uncontended acquisition is three calls (lease grant, put, predecessor lookup): the lease
//!   keep-alive and the confirmation reads start only when the contender has to wait.
//!
//! Renewal is one keep-alive per lease plus a check that the key still exists: a lease revoked
//! or expired, or a key deleted from outside, is a loss.

pub(crate) mod config;
mod queue;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions, SortOrder, SortTarget};
use tokio::time::Instant;

use super::{Attempt, Backend, Context, EngineResult, Released, Renewal};
use crate::LockError;

/// One contender: its lease, its key, and its create revision once written.
#[derive(Debug, Clone)]
struct Contender {
    lease: i64,
    key: String,
}

pub(crate) struct EtcdBackend {
    client: Client,
    prefix: String,
    timeout: Duration,
    /// Owner token -> its contender (the runtime chooses owners before any request).
    contenders: Arc<Mutex<HashMap<String, Contender>>>,
}

fn etcd_error(key: Option<&str>, what: &str, err: etcd_client::Error) -> LockError {
    LockError::backend(key, what, Some(Arc::new(err)))
}

/// How often a request refused at connect is sent again.
const CONNECT_RETRIES: u32 = 6;

/// A request that failed to connect (so it never reached a member).
fn is_connect_error(err: &etcd_client::Error) -> bool {
    let text = err.to_string();
    text.contains("tcp connect error") || text.contains("Connection refused")
}

/// The lease's TTL in whole seconds, rounded up (etcd's resolution), at least 1.
fn ttl_seconds(lease: Duration) -> i64 {
    let secs = lease.as_nanos().div_ceil(1_000_000_000);
    i64::try_from(secs).unwrap_or(i64::MAX).max(1)
}

impl EtcdBackend {
    /// Connects to the cluster through `endpoints` (`http://host:port`).
    pub(crate) async fn connect(endpoints: &[String], ctx: &Context) -> Result<Self, LockError> {
        let (prefix, timeout) = (ctx.prefix.clone(), ctx.timeout);
        let options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout);
        let joined = endpoints.join(",");
        let client =
            match tokio::time::timeout(timeout, Client::connect(endpoints, Some(options))).await {
                Ok(Ok(client)) => client,
                Ok(Err(
                    e @ (etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_)),
                )) => {
                    return Err(LockError::config(format!(
                        "bad etcd endpoints `{joined}`: {e}"
                    )));
                }
                Ok(Err(e)) => {
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
        let backend = Self {
            client,
            prefix,
            timeout,
            contenders: Arc::default(),
        };
        // Prove the cluster answers (the client connects lazily).
        backend
            .bounded(None, "etcd does not answer", |mut c| async move {
                c.get("dlock-ping", Some(GetOptions::new().with_count_only()))
                    .await
            })
            .await?;
        Ok(backend)
    }

    fn contenders(&self) -> MutexGuard<'_, HashMap<String, Contender>> {
        // Map operations cannot be interrupted half-way: a poisoned lock is consistent.
        self.contenders
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// One read of `key`'s queue (every contender's key under its prefix) with `options`.
    async fn read_queue(
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

    fn queue_prefix(&self, key: &str) -> String {
        format!("{}{key}/", self.prefix)
    }

    /// The contender key of `owner` in `key`'s queue, looked up in the engine.
    async fn find_contender(&self, key: &str, owner: &str) -> Result<Option<Contender>, LockError> {
        let queue = self
            .read_queue(
                key,
                "release lookup failed",
                GetOptions::new().with_prefix(),
            )
            .await?;
        Ok(queue
            .kvs()
            .iter()
            .find(|kv| kv.value() == owner.as_bytes())
            .and_then(|kv| {
                Some(Contender {
                    lease: kv.lease(),
                    key: kv.key_str().ok()?.to_owned(),
                })
            }))
    }

    /// Runs `op` on a client, bounded by the timeout. A request refused at connect never
    /// reached a member, so it is sent again (the client's balanced channel may still route to
    /// a member that is down).
    async fn bounded<T, Fut>(
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

impl Backend for EtcdBackend {
    fn has_queue(&self) -> bool {
        // Waiting happens in etcd's own queue (`acquire_queued`), watching the predecessor.
        true
    }

    async fn try_acquire(&self, key: &str, owner: &str, lease: Duration) -> EngineResult<Attempt> {
        // One attempt: queue and leave at once unless first in line.
        self.queue(key, owner, lease, Instant::now()).await
    }

    async fn acquire_queued(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
        deadline: Instant,
    ) -> Result<Attempt, LockError> {
        self.queue(key, owner, lease, deadline).await
    }

    async fn renew(&self, batch: &[Renewal]) -> Result<Vec<Option<bool>>, LockError> {
        let mut out = Vec::with_capacity(batch.len());
        for item in batch {
            let Some(contender) = self.contenders().get(&item.owner).cloned() else {
                out.push(Some(false));
                continue;
            };
            let mut client = self.client.clone();
            let renewed = async {
                // The key first: deleted from outside is a loss even if the lease lives.
                let exists = client
                    .get(
                        contender.key.as_str(),
                        Some(GetOptions::new().with_count_only()),
                    )
                    .await?
                    .count()
                    > 0;
                if !exists {
                    return Ok(false);
                }
                let ttl = match client.lease_keep_alive(contender.lease).await {
                    Ok((mut keeper, mut stream)) => {
                        keeper.keep_alive().await?;
                        stream.message().await?.map_or(0, |r| r.ttl())
                    }
                    // The client reports a lease that is gone (revoked, expired) this way.
                    Err(etcd_client::Error::LeaseKeepAliveError(_)) => 0,
                    Err(e) => return Err(e),
                };
                Ok::<bool, etcd_client::Error>(ttl > 0)
            };
            out.push(match tokio::time::timeout(self.timeout, renewed).await {
                Ok(Ok(alive)) => Some(alive),
                _ => None,
            });
        }
        Ok(out)
    }

    async fn release(&self, key: &str, owner: &str) -> Result<Released, LockError> {
        let known = self.contenders().get(owner).cloned();
        let contender = match known {
            Some(contender) => contender,
            // Not queued through this connection (a release from a new connection once the
            // runtime's own is gone): the engine knows the owner by its key's value.
            None => match self.find_contender(key, owner).await? {
                Some(contender) => contender,
                None => return Ok(Released::NotOwner),
            },
        };
        // Still ours? A key deleted from outside (and maybe taken by another contender)
        // means the lease was lost, whatever the revoke below finds.
        let contender_key = contender.key.as_str();
        let present = self
            .bounded(Some(key), "release failed", |mut c| async move {
                c.get(contender_key, Some(GetOptions::new().with_count_only()))
                    .await
            })
            .await?
            .count()
            > 0;
        // Revoking the lease deletes its key atomically (one Raft write).
        match self.revoke(contender.lease).await {
            Ok(Ok(_)) => {
                self.contenders().remove(owner);
                Ok(if present {
                    Released::Freed
                } else {
                    Released::NotOwner
                })
            }
            // The lease is gone already (expired or revoked from outside): not ours.
            Ok(Err(etcd_client::Error::GRpcStatus(status)))
                if status.message().contains("lease not found") =>
            {
                self.contenders().remove(owner);
                Ok(Released::NotOwner)
            }
            Ok(Err(e)) => Err(etcd_error(Some(key), "release failed", e)),
            Err(_) => Err(LockError::backend(
                Some(key),
                format!("release failed: no reply within {:?}", self.timeout),
                None,
            )),
        }
    }

    async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        // Only the holder (the lowest create revision) is removed; waiters keep their places.
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let first = self.read_queue(key, "force unlock failed", options).await?;
        let Some(holder) = first.kvs().first() else {
            return Ok(false);
        };
        let holder_key = holder.key().to_vec();
        let deleted = self
            .bounded(Some(key), "force unlock failed", |mut c| {
                let holder_key = holder_key.clone();
                async move { c.delete(holder_key, None).await }
            })
            .await?;
        Ok(deleted.deleted() > 0)
    }

    async fn is_locked(&self, key: &str) -> Result<bool, LockError> {
        let options = GetOptions::new().with_prefix().with_count_only();
        let found = self.read_queue(key, "lookup failed", options).await?;
        Ok(found.count() > 0)
    }

    fn renew_batch_limit(&self) -> usize {
        64
    }
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
