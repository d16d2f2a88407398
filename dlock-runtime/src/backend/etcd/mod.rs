//! etcd (`etcd://h1:2379,h2:2379`): a consensus store (Raft, CP). Each key is a FIFO queue of
//! contender keys `<prefix><key>/<owner token>` on leases ([`queue`], [`lease`]), over one
//! client ([`client`]).
//!
//! Invariant: the holder is the lowest create revision under the key's prefix, which is also
//! the fence (strictly increasing cluster-wide); a lock counts as valid from its lease's last
//! confirmed keep-alive, never from its acquisition.

mod client;
pub(crate) mod config;
mod inspect;
mod lease;
mod queue;
mod shared;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::time::Instant;

use self::client::{Etcd, ttl_seconds};
use self::lease::SharedLease;
use self::queue::{Contender, Queue};
use super::{
    Attempt, Backend, Capabilities, Context, EngineResult, Queued, Queueing, Released, Renewal,
};
use crate::backend::mode::{Mode, holding_now};
use crate::error::LockError;
use crate::inspect::LockInfo;

pub(crate) struct EtcdBackend {
    etcd: Arc<Etcd>,
    queue: Queue,
}

impl EtcdBackend {
    /// Connects to the cluster through `endpoints` (`http://host:port`).
    pub(crate) async fn connect(endpoints: &[String], ctx: &Context) -> Result<Self, LockError> {
        let etcd = Arc::new(Etcd::connect(endpoints, ctx).await?);
        Ok(Self {
            queue: Queue::new(etcd.clone()),
            etcd,
        })
    }

    /// Queues for `key` until first in line or `ask.deadline`: readers and permits as
    /// `shared.rs` says, an exclusive contender as `queue.rs` does.
    async fn queue(&self, key: &str, owner: &str, ask: Queueing) -> Result<Queued, LockError> {
        let mode = Mode::of(owner);
        if mode.is_shared() {
            return shared::queue(&self.queue, key, owner, ask, mode).await;
        }
        self.queue.exclusive(key, owner, ask).await
    }
}

impl Backend for EtcdBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            queue: true,
            renew_batch_limit: 64,
            ..Capabilities::DEFAULT
        }
    }

    async fn try_acquire(&self, key: &str, owner: &str, lease: Duration) -> EngineResult<Attempt> {
        // One attempt: queue and leave at once unless first in line. A lease of its own,
        // granted after the request started, so that the runtime may count from that start.
        let ask = Queueing {
            lease,
            renew: false,
            deadline: Instant::now(),
        };
        Ok(self.queue(key, owner, ask).await?.attempt)
    }

    async fn acquire_queued(
        &self,
        key: &str,
        owner: &str,
        ask: Queueing,
    ) -> Result<Queued, LockError> {
        self.queue(key, owner, ask).await
    }

    async fn renew(&self, batch: &[Renewal]) -> Result<Vec<Option<bool>>, LockError> {
        let contenders: Vec<Option<Contender>> = {
            let known = self.queue.contenders();
            batch.iter().map(|i| known.get(&i.owner).cloned()).collect()
        };
        // Every key of the batch read at once (a key deleted from outside is a loss even if
        // its lease lives), and one keep-alive per lease, concurrently: one round trip.
        let reads: Vec<TxnOp> = contenders
            .iter()
            .flatten()
            .map(|c| TxnOp::get(c.key.as_str(), Some(GetOptions::new().with_count_only())))
            .collect();
        let mut leases: Vec<(i64, Option<Arc<SharedLease>>)> = Vec::new();
        for c in contenders.iter().flatten() {
            if !leases.iter().any(|(id, _)| *id == c.lease) {
                leases.push((c.lease, c.shared.clone()));
            }
        }
        let read_keys = self.etcd.bounded(None, "renewal failed", |mut c| {
            let txn = Txn::new().and_then(reads.clone());
            async move { c.txn(txn).await }
        });
        let keep_leases = async {
            let mut alive = HashMap::new();
            for (id, shared) in &leases {
                let outcome = match shared {
                    Some(shared) => shared.refresh(&self.etcd.client, self.etcd.timeout).await,
                    None => lease::keep_alive(&self.etcd.client, *id, self.etcd.timeout).await,
                };
                alive.insert(*id, outcome.ok());
            }
            alive
        };
        let (read, alive) = tokio::join!(read_keys, keep_leases);
        let counts: Option<Vec<i64>> = read.ok().map(|r| {
            r.op_responses()
                .into_iter()
                .map(|op| match op {
                    TxnOpResponse::Get(get) => get.count(),
                    _ => 0,
                })
                .collect()
        });
        let mut at = 0;
        let out = contenders
            .iter()
            .map(|c| {
                // Not known: released or left meanwhile.
                let Some(c) = c else { return Some(false) };
                let exists = counts
                    .as_ref()
                    .map(|counts| counts.get(at).is_some_and(|&n| n > 0));
                at += 1;
                match (exists, alive.get(&c.lease).copied().flatten()) {
                    (Some(false), _) | (_, Some(false)) => Some(false),
                    (Some(true), Some(true)) => Some(true),
                    // Not determined (no answer): retried by the watchdog.
                    _ => None,
                }
            })
            .collect::<Vec<_>>();
        Ok(out)
    }

    async fn release(&self, key: &str, owner: &str) -> Result<Released, LockError> {
        // Named by the owner token: known also to a release from a new connection (once the
        // runtime's own is gone), which did not queue it.
        let contender_key = self.etcd.contender_key(key, owner);
        // Before the delete is sent: the waiter of this runtime right behind the holder takes
        // over now (see `queue.rs`); the delete's answer is still this release's.
        self.queue.hand_over(owner, &contender_key);
        let ours = contender_key.as_str();
        let deleted = match self
            .etcd
            .bounded(Some(key), "release failed", |mut c| async move {
                c.delete(ours, None).await
            })
            .await
        {
            Ok(answer) => answer.deleted(),
            Err(err) => {
                self.etcd.remove_later(contender_key);
                return Err(err);
            }
        };
        if let Some(contender) = self.queue.contenders().remove(owner)
            && contender.shared.is_none()
        {
            // A lease of its own: no longer needed (it would expire at its TTL anyway).
            let backend_client = self.etcd.client.clone();
            let timeout = self.etcd.timeout;
            tokio::spawn(async move {
                let mut c = backend_client;
                let _ = tokio::time::timeout(timeout, c.lease_revoke(contender.lease)).await;
            });
        }
        if deleted > 0 {
            return Ok(Released::Freed);
        }
        // Nothing deleted: the key had gone (lease expired or revoked, deleted from outside),
        // or the acquire request this release compensates has not landed (yet).
        self.etcd.bury(key, owner, &contender_key).await?;
        Ok(Released::NotOwner)
    }

    async fn release_after(
        &self,
        key: &str,
        owner: &str,
        hold: Duration,
    ) -> Result<Released, LockError> {
        // The key moves to a lease of its own with the hold's TTL (rounded up to whole
        // seconds; the server may raise it to its minimum), owner-checked: it keeps its create
        // revision (its place at the head of the queue) and the server deletes it when that
        // lease ends, which is the event the next waiter watches for.
        let contender_key = self.etcd.contender_key(key, owner);
        let ttl = ttl_seconds(hold);
        let lease = match self
            .etcd
            .bounded(Some(key), "release failed", |mut c| async move {
                c.lease_grant(ttl, None).await
            })
            .await
        {
            Ok(granted) => granted.id(),
            Err(err) => {
                self.etcd.remove_after(contender_key, hold);
                return Err(err);
            }
        };
        let ours = contender_key.as_str();
        let txn = Txn::new()
            .when([Compare::create_revision(ours, CompareOp::Greater, 0)])
            .and_then([TxnOp::put(
                ours,
                owner,
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let kept = match self
            .etcd
            .bounded(Some(key), "release failed", |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
        {
            Ok(answer) => answer.succeeded(),
            Err(err) => {
                self.etcd.remove_after(contender_key, hold);
                return Err(err);
            }
        };
        if let Some(contender) = self.queue.contenders().remove(owner)
            && contender.shared.is_none()
        {
            // The key left that lease: revoking it deletes nothing.
            self.etcd.revoke_later(contender.lease);
        }
        if kept {
            return Ok(Released::Kept);
        }
        self.etcd.revoke_later(lease);
        Ok(Released::NotOwner)
    }

    async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        // Only the holders are removed (the first contender, or every reader or permit holding
        // now: see `mode::holding_now`); waiters keep their places.
        let queue = self.etcd.read_in_line(key, "force unlock failed").await?;
        let modes: Vec<Mode> = queue
            .kvs()
            .iter()
            .map(|kv| {
                let name = kv.key_str().unwrap_or_default();
                Mode::of(name.rsplit_once('/').map_or(name, |(_, owner)| owner))
            })
            .collect();
        let mut removed = false;
        for holder in queue.kvs().iter().take(holding_now(&modes)) {
            let holder_key = holder.key().to_vec();
            let deleted = self
                .etcd
                .bounded(Some(key), "force unlock failed", |mut c| {
                    let holder_key = holder_key.clone();
                    async move { c.delete(holder_key, None).await }
                })
                .await?;
            removed |= deleted.deleted() > 0;
        }
        Ok(removed)
    }

    async fn is_locked(&self, key: &str) -> Result<bool, LockError> {
        let options = GetOptions::new().with_prefix().with_count_only();
        let found = self.etcd.read_queue(key, "lookup failed", options).await?;
        Ok(found.count() > 0)
    }

    async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        Ok(inspect::holders(&self.etcd, key, true)
            .await?
            .into_iter()
            .next())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>, LockError> {
        inspect::holders(&self.etcd, prefix, false).await
    }
}
