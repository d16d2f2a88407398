//! etcd (`etcd://h1:2379,h2:2379`): a consensus store (Raft, CP), for locks that must stay
//! correct through a failover.
//!
//! The recipe of etcd's own concurrency package, implemented here on plain KV operations (not
//! the Lock RPC, so that a cancelled or timed-out waiter removes its own place in the queue):
//! - a contender's key `<prefix><key>/<owner token>` is attached to a **lease**: for a renewed
//!   lock the runtime's **shared lease** of that TTL (the lock's lease rounded up to whole
//!   seconds; the server may raise it to its minimum), kept alive by the runtime every quarter
//!   of its TTL (`lease.rs`), as etcd's sessions do; for a hard-capped lock
//!   (`watchdog(false)`) a lease of its own, kept alive only while it waits, so that the server
//!   ends it at the lease whatever the runtime does;
//! - joining is one transaction: put the key unless it exists (a retried request of the same
//!   owner) and read the head of the queue; the holder is the lowest **create revision** under
//!   the prefix (FIFO), which is also the fencing token (strictly increasing cluster-wide), so
//!   an uncontended acquisition is this one request;
//! - a waiter watches only its predecessor's key (no herd); when the predecessor headed the
//!   queue, its deletion makes the waiter first without a second lookup;
//! - after waiting, it checks that its key still exists before reporting the lock acquired,
//!   and renews its lease in the same round trip unless the runtime confirmed it lately (etcd
//!   3.4 was seen granting a queued waiter whose lease had expired);
//! - release deletes the key (one request: a delete that finds nothing means the lock was
//!   lost); a deadline or a cancellation does the same (the runtime's compensating release);
//! - **hand-over within the runtime**: when an exclusive holder releases and the waiter
//!   watching its key (right behind the head) is of this runtime, that waiter is told before
//!   the delete is sent and holds at once, without waiting for the delete to commit, its event,
//!   or a confirmation read (`../successor.rs`): the holder's body has ended, the only key
//!   ahead of the waiter's is ours and is being deleted, and to every other process the head
//!   of the queue is ours throughout, so the queue stays FIFO across processes. Its fence is
//!   its own create revision as always. It takes the hand-over only when its shared lease was
//!   confirmed within the last half of its TTL (its key lives, unless deleted from outside,
//!   which its first renewal finds as for any holder), counting from that confirmation; else
//!   it confirms as after the event. A delete that fails or times out leaves the holder's key
//!   (still ours, ahead of everyone) to the background removal; the release's answer is the
//!   delete's, as without the hand-over.
//!
//! Renewal is one keep-alive per lease in the batch plus one read of every key of the batch,
//! both at once: a lease expired or revoked, or a key deleted from outside, is a loss. A lock
//! counts as valid from its lease's last confirmed keep-alive, not from its acquisition.

pub(crate) mod config;
mod inspect;
mod lease;
mod queue;
mod shared;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse,
};
use tokio::time::Instant;

use self::lease::{SharedLease, SharedLeases};
use super::io_thread::IoThread;
use super::successor::Successors;
use super::{Attempt, Backend, Context, EngineResult, Queued, Queueing, Released, Renewal};
use crate::backend::mode::{Mode, holding_now};
use crate::error::LockError;
use crate::inspect::LockInfo;

/// One contender: its lease and its key.
#[derive(Debug, Clone)]
struct Contender {
    lease: i64,
    key: String,
    /// The runtime's shared lease it is attached to; `None`: a lease of its own (hard cap).
    shared: Option<Arc<SharedLease>>,
    /// An exclusive contender that acquired (its key heads the queue) and has not yet handed
    /// its key to the waiter of this runtime behind it (see [`Successors`]).
    holding: bool,
}

pub(crate) struct EtcdBackend {
    client: Client,
    /// Where `client`'s connection tasks run; they stop when the backend drops.
    _io: IoThread,
    prefix: String,
    timeout: Duration,
    /// Owner token -> its contender (the runtime chooses owners before any request).
    contenders: Arc<Mutex<HashMap<String, Contender>>>,
    /// The leases renewed locks share, by TTL.
    leases: SharedLeases,
    /// This runtime's waiters by the key they watch, for hand-overs within the process.
    successors: Successors,
    /// Held while the backend lives: background deletes stop once it is gone.
    alive: Arc<()>,
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
        let backend = Self {
            client,
            _io: io,
            prefix,
            timeout,
            contenders: Arc::default(),
            leases: SharedLeases::default(),
            successors: Successors::default(),
            alive: Arc::new(()),
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
    fn remove_later(&self, contender_key: String) {
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
    fn remove_after(&self, contender_key: String, hold: Duration) {
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
    fn revoke_later(&self, lease: i64) {
        let (mut c, timeout) = (self.client.clone(), self.timeout);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(timeout, c.lease_revoke(lease)).await;
        });
    }

    /// The tombstone of `owner`: written by a release that found no key of `owner`'s, so
    /// that its acquire request, should it land later, writes nothing (the joining
    /// transaction requires it absent). `<prefix>/<owner>` is under no queue: a queue is
    /// `<prefix><key>/` with a non-empty key, and the owner token has no `/`.
    fn tombstone_key(&self, owner: &str) -> String {
        format!("{}/{owner}", self.prefix)
    }

    /// After a release found no key of `owner`'s: writes its tombstone (on a lease of its own
    /// that outlives any request of that owner still on its way) and deletes its key again,
    /// in one transaction. An acquire request that reaches the server after its compensating
    /// release (a reordered or late request) then leaves no key behind, instead of holding the
    /// key on the runtime's shared lease.
    async fn bury(&self, key: &str, owner: &str, contender_key: &str) -> Result<(), LockError> {
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
            let known = self.contenders();
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
        let read_keys = self.bounded(None, "renewal failed", |mut c| {
            let txn = Txn::new().and_then(reads.clone());
            async move { c.txn(txn).await }
        });
        let keep_leases = async {
            let mut alive = HashMap::new();
            for (id, shared) in &leases {
                let outcome = match shared {
                    Some(shared) => shared.refresh(&self.client, self.timeout).await,
                    None => lease::keep_alive(&self.client, *id, self.timeout).await,
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
        let contender_key = self.contender_key(key, owner);
        // Before the delete is sent: the waiter of this runtime right behind the holder takes
        // over now (see `queue.rs`); the delete's answer is still this release's.
        self.hand_over(owner, &contender_key);
        let ours = contender_key.as_str();
        let deleted = match self
            .bounded(Some(key), "release failed", |mut c| async move {
                c.delete(ours, None).await
            })
            .await
        {
            Ok(answer) => answer.deleted(),
            Err(err) => {
                self.remove_later(contender_key);
                return Err(err);
            }
        };
        if let Some(contender) = self.contenders().remove(owner)
            && contender.shared.is_none()
        {
            // A lease of its own: no longer needed (it would expire at its TTL anyway).
            let backend_client = self.client.clone();
            let timeout = self.timeout;
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
        self.bury(key, owner, &contender_key).await?;
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
        let contender_key = self.contender_key(key, owner);
        let ttl = ttl_seconds(hold);
        let lease = match self
            .bounded(Some(key), "release failed", |mut c| async move {
                c.lease_grant(ttl, None).await
            })
            .await
        {
            Ok(granted) => granted.id(),
            Err(err) => {
                self.remove_after(contender_key, hold);
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
            .bounded(Some(key), "release failed", |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
        {
            Ok(answer) => answer.succeeded(),
            Err(err) => {
                self.remove_after(contender_key, hold);
                return Err(err);
            }
        };
        if let Some(contender) = self.contenders().remove(owner)
            && contender.shared.is_none()
        {
            // The key left that lease: revoking it deletes nothing.
            self.revoke_later(contender.lease);
        }
        if kept {
            return Ok(Released::Kept);
        }
        self.revoke_later(lease);
        Ok(Released::NotOwner)
    }

    async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        // Only the holders are removed (the first contender, or every reader or permit holding
        // now: see `mode::holding_now`); waiters keep their places.
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let queue = self.read_queue(key, "force unlock failed", options).await?;
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
        let found = self.read_queue(key, "lookup failed", options).await?;
        Ok(found.count() > 0)
    }

    async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        Ok(self.holders(key, true).await?.into_iter().next())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>, LockError> {
        self.holders(prefix, false).await
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
