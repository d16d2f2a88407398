//! The FIFO queue of one key in etcd: join (one transaction), wait for the predecessor's key to
//! go (or for a holder of this runtime ahead to hand the key over, `../successor.rs`), confirm
//! that the key and lease are still there, leave (delete).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, WatchOptions,
};
use tokio::time::Instant;

use super::client::{CONNECT_RETRIES, Etcd, in_line, is_connect_error, ttl_seconds};
use super::lease::{self, SharedLease, SharedLeases};
use crate::backend::io_thread::AbortOnDrop;
use crate::backend::successor::Successors;
use crate::backend::{Attempt, Queued, Queueing};
use crate::error::LockError;

/// One contender: its lease and its key.
#[derive(Debug, Clone)]
pub(super) struct Contender {
    pub(super) lease: i64,
    pub(super) key: String,
    /// The runtime's shared lease it is attached to; `None`: a lease of its own (hard cap).
    pub(super) shared: Option<Arc<SharedLease>>,
    /// An exclusive contender that acquired (its key heads the queue) and has not yet handed
    /// its key to the waiter of this runtime behind it (see [`Successors`]).
    pub(super) holding: bool,
}

/// The queues of this runtime's contenders, on `etcd`.
pub(super) struct Queue {
    pub(super) etcd: Arc<Etcd>,
    /// Owner token -> its contender (the runtime chooses owners before any request).
    contenders: Arc<Mutex<HashMap<String, Contender>>>,
    /// The leases renewed locks share, by TTL.
    leases: SharedLeases,
    /// This runtime's waiters by the key they watch, for hand-overs within the process.
    successors: Successors,
}

impl Queue {
    pub(super) fn new(etcd: Arc<Etcd>) -> Self {
        Self {
            etcd,
            contenders: Arc::default(),
            leases: SharedLeases::default(),
            successors: Successors::default(),
        }
    }

    pub(super) fn contenders(&self) -> MutexGuard<'_, HashMap<String, Contender>> {
        // Map operations cannot be interrupted half-way: a poisoned lock is consistent.
        self.contenders
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Records `owner`'s contender (its key `contender_key` on `lease`) before the key is
    /// written: a cancelled attempt's compensating release finds it.
    pub(super) fn record(
        &self,
        owner: &str,
        contender_key: &str,
        lease: i64,
        shared: Option<Arc<SharedLease>>,
    ) {
        self.contenders().insert(
            owner.to_owned(),
            Contender {
                lease,
                key: contender_key.to_owned(),
                shared,
                holding: false,
            },
        );
    }

    /// The lease a new contender's key is attached to: the runtime's shared lease for a
    /// renewed lock, a lease of its own for a hard-capped one (granted now: `confirmed` is the
    /// grant's send time).
    pub(super) async fn contender_lease(
        &self,
        key: &str,
        ask: Queueing,
    ) -> Result<(i64, Option<Arc<SharedLease>>, Option<Instant>), LockError> {
        let ttl = ttl_seconds(ask.lease);
        if ask.renew {
            let shared = self
                .leases
                .get(&self.etcd.client, ttl, self.etcd.timeout)
                .await;
            let shared = shared.map_err(|e| e.for_key(key))?;
            return Ok((shared.id, Some(shared), None));
        }
        let sent_at = Instant::now();
        let granted = self
            .etcd
            .bounded(Some(key), "lease grant failed", |mut c| async move {
                c.lease_grant(ttl, None).await
            })
            .await?;
        Ok((granted.id(), None, Some(sent_at)))
    }

    /// Joins the queue of `key` in one transaction: puts the contender's key unless it exists
    /// (a retried request of the same owner) or the owner's tombstone does (a release already
    /// undid this request: see [`Etcd::bury`]), and reads the head of the queue.
    /// Returns the contender's create revision (0: no key, buried) and whether it heads the
    /// queue.
    pub(super) async fn join(
        &self,
        key: &str,
        contender_key: &str,
        owner: &str,
        lease: i64,
    ) -> Result<(i64, bool), etcd_client::Error> {
        let head = in_line().with_limit(1);
        let prefix = self.etcd.queue_prefix(key);
        let tombstone = self.etcd.tombstone_key(owner);
        let txn = Txn::new()
            .when([
                Compare::create_revision(contender_key, CompareOp::Equal, 0),
                Compare::create_revision(tombstone.as_str(), CompareOp::Equal, 0),
            ])
            .and_then([
                TxnOp::put(
                    contender_key,
                    owner,
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::get(prefix.as_str(), Some(head.clone())),
            ])
            .or_else([
                TxnOp::get(contender_key, None),
                TxnOp::get(prefix.as_str(), Some(head)),
            ]);
        let mut client = self.etcd.client.clone();
        let joined = client.txn(txn).await?;
        let ops = joined.op_responses();
        let revision = if joined.succeeded() {
            joined.header().map_or(0, |h| h.revision())
        } else {
            match ops.first() {
                Some(TxnOpResponse::Get(mine)) => {
                    mine.kvs().first().map_or(0, |kv| kv.create_revision())
                }
                _ => 0,
            }
        };
        let first = match ops.get(1) {
            Some(TxnOpResponse::Get(head)) => head
                .kvs()
                .first()
                .is_some_and(|kv| kv.key() == contender_key.as_bytes()),
            _ => false,
        };
        Ok((revision, first))
    }

    /// Waits in the queue of `key` until first in line (`Acquired`) or the deadline (`Busy`),
    /// an exclusive contender.
    pub(super) async fn exclusive(
        &self,
        key: &str,
        owner: &str,
        ask: Queueing,
    ) -> Result<Queued, LockError> {
        let queued = self.queue_exclusive(key, owner, ask).await?;
        if matches!(queued.attempt, Attempt::Acquired { .. })
            && let Some(contender) = self.contenders().get_mut(owner)
        {
            // Its key heads the queue: its release may hand it to the waiter behind.
            contender.holding = true;
        }
        Ok(queued)
    }

    /// The release of `owner`'s hold (its key `contender_key`) is about to be sent: if it was
    /// an exclusive hold that had not handed its key over yet, tells the waiter of this runtime
    /// watching that key (right behind the head), if there is one.
    pub(super) fn hand_over(&self, owner: &str, contender_key: &str) {
        let holding = self
            .contenders()
            .get_mut(owner)
            .is_some_and(|c| std::mem::take(&mut c.holding));
        if holding && self.successors.hand_over(contender_key.as_bytes()) {
            tracing::trace!(key = %contender_key, "handed over to the next waiter of this runtime");
        }
    }

    /// The queueing of [`exclusive`](Self::exclusive): join, wait, confirm.
    async fn queue_exclusive(
        &self,
        key: &str,
        owner: &str,
        ask: Queueing,
    ) -> Result<Queued, LockError> {
        let deadline = ask.deadline;
        let contender_key = self.etcd.contender_key(key, owner);
        let mut retried = false;
        let (lease_id, shared, granted_at, my_revision, first) = loop {
            let (lease_id, shared, granted_at) = self.contender_lease(key, ask).await?;
            self.record(owner, &contender_key, lease_id, shared.clone());
            let contender = contender_key.as_str();
            match self
                .etcd
                .bounded(Some(key), "queueing failed", |_| async move {
                    self.join(key, contender, owner, lease_id).await
                })
                .await
            {
                Ok((0, _)) => {
                    return Err(LockError::backend(
                        Some(key),
                        "acquisition already released (its owner token is buried)",
                        None,
                    ));
                }
                Ok((revision, first)) => break (lease_id, shared, granted_at, revision, first),
                // The shared lease ended on the server since it was last confirmed (the
                // process was stopped, or the server unreachable, for longer than its TTL):
                // take a new one, once.
                Err(err)
                    if !retried
                        && shared.is_some()
                        && err.to_string().contains("lease not found") =>
                {
                    if let Some(shared) = &shared {
                        shared.kill();
                    }
                    retried = true;
                }
                Err(err) => return Err(err),
            }
        };
        if first {
            // First in line at once: the lease was just confirmed or granted, the key just
            // written, nothing to confirm.
            return Ok(acquired(my_revision, confirmed_at(&shared, granted_at)));
        }
        // Started when the contender first has to wait, for a lease of its own (the shared
        // lease has its keeper).
        let mut keeper: Option<AbortOnDrop<()>> = None;
        let mut waited = false;
        // The TTL of a lease of its own (the server may raise it, never lower it).
        let own_ttl = Duration::from_secs(u64::try_from(ttl_seconds(ask.lease)).unwrap_or(1));
        loop {
            // The predecessor: the newest key created before ours (and whether another is
            // ahead of it).
            let options = GetOptions::new()
                .with_prefix()
                .with_max_create_revision(my_revision - 1)
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(2);
            let before = self
                .etcd
                .read_queue(key, "queue lookup failed", options)
                .await?;
            // The predecessor heads the queue: once it is deleted nobody is ahead (keys created
            // later have higher revisions).
            let behind_the_head = before.kvs().len() == 1;
            let Some(predecessor) = before.kvs().first() else {
                // Nobody ahead at the first look: the key was written by the join just before,
                // under a lease alive for sure, unless this process was stopped in between for
                // longer than that (the key may be gone, and a contender queued since may hold
                // the lock): then the key and the lease are confirmed as after a wait.
                let now = Instant::now();
                let alive = match &shared {
                    Some(shared) => shared.is_fresh(now),
                    None => granted_at.is_some_and(|at| now < at + own_ttl / 2),
                };
                if !waited && alive {
                    return Ok(acquired(my_revision, confirmed_at(&shared, granted_at)));
                }
                return self
                    .confirm_first(key, &contender_key, lease_id, &shared, my_revision)
                    .await;
            };
            let predecessor_key = predecessor.key().to_vec();
            let from = before.header().map_or(0, |h| h.revision()) + 1;
            if Instant::now() >= deadline {
                self.leave(owner).await;
                return Ok(Queued::kept_alive(Attempt::Busy { ttl: None }));
            }
            waited = true;
            if keeper.is_none() && shared.is_none() {
                keeper = Some(AbortOnDrop(lease::keep_alive_while_queued(
                    &self.etcd.client,
                    lease_id,
                    own_ttl,
                )));
            }
            // Known to the holders of this runtime from now until this iteration ends: the
            // predecessor's release, if it is ours, hands the key over (see `Successors`).
            let mut handed = self.successors.watch(&predecessor_key);
            let predecessor_key = &predecessor_key;
            // `true` when the predecessor was deleted; `false` when the watch ended otherwise.
            let deleted = async {
                let mut watch = self
                    .etcd
                    .bounded(Some(key), "watch failed", |mut c| async move {
                        c.watch(
                            predecessor_key.clone(),
                            Some(WatchOptions::new().with_start_revision(from)),
                        )
                        .await
                    })
                    .await?;
                loop {
                    match watch.message().await {
                        Ok(Some(resp)) => {
                            if resp
                                .events()
                                .iter()
                                .any(|e| e.event_type() == EventType::Delete)
                            {
                                return Ok(true);
                            }
                            if resp.canceled() {
                                return Ok(false);
                            }
                        }
                        // The stream ended or failed: look again (bounded by the loop).
                        _ => return Ok::<_, LockError>(false),
                    }
                }
            };
            let woken = async {
                tokio::select! {
                    biased;
                    () = handed.handed() => Ok(None),
                    deleted = deleted => deleted.map(Some),
                }
            };
            let Ok(woken) = tokio::time::timeout_at(deadline, woken).await else {
                drop(handed);
                self.leave(owner).await;
                return Ok(Queued::kept_alive(Attempt::Busy { ttl: None }));
            };
            let Some(deleted) = woken? else {
                // The holder ahead is ours and released: first in line. With the shared lease
                // confirmed lately, the key lives for sure (counted from that confirmation),
                // nothing to ask the server; else the confirmation as after the event.
                if let Some(acquired) = acquired_under_fresh(&shared, Instant::now(), my_revision) {
                    return Ok(acquired);
                }
                return self
                    .confirm_first(key, &contender_key, lease_id, &shared, my_revision)
                    .await;
            };
            if deleted && behind_the_head {
                // The holder released (or its lease ended): first in line, without looking up
                // the queue again.
                return self
                    .confirm_first(key, &contender_key, lease_id, &shared, my_revision)
                    .await;
            }
        }
    }

    /// First in line after waiting: the key must still exist and the lease still be alive.
    /// A shared lease the keeper confirmed lately is alive for sure: one read of the key, and
    /// the lock counts from that confirmation. Otherwise the lease is renewed in the same round
    /// trip as the read, and the lock counts from that renewal.
    pub(super) async fn confirm_first(
        &self,
        key: &str,
        contender_key: &str,
        lease: i64,
        shared: &Option<Arc<SharedLease>>,
        revision: i64,
    ) -> Result<Queued, LockError> {
        let sent_at = Instant::now();
        if let Some(acquired) = acquired_under_fresh(shared, sent_at, revision) {
            let mine = self
                .etcd
                .bounded(Some(key), "confirmation failed", |mut c| async move {
                    c.get(contender_key, Some(GetOptions::new().with_count_only()))
                        .await
                })
                .await?;
            if mine.count() == 0 {
                return Err(LockError::backend(
                    Some(key),
                    "the key was deleted while queued",
                    None,
                ));
            }
            return Ok(acquired);
        }
        // Both at once: one round trip.
        let (mine, alive) = tokio::join!(
            self.etcd
                .bounded(Some(key), "confirmation failed", |mut c| async move {
                    c.get(contender_key, None).await
                }),
            async {
                match shared {
                    Some(shared) => shared.refresh(&self.etcd.client, self.etcd.timeout).await,
                    None => lease::keep_alive(&self.etcd.client, lease, self.etcd.timeout).await,
                }
            }
        );
        let (mine, alive) = (mine?, alive.map_err(|e| e.for_key(key))?);
        if mine.kvs().is_empty() || !alive {
            return Err(LockError::backend(
                Some(key),
                "the lease expired while queued",
                None,
            ));
        }
        Ok(acquired(revision, Some(sent_at)))
    }

    /// Revokes `lease`, sending again what was refused at connect (see [`Etcd::bounded`]).
    pub(super) async fn revoke(
        &self,
        lease: i64,
    ) -> Result<
        Result<etcd_client::LeaseRevokeResponse, etcd_client::Error>,
        tokio::time::error::Elapsed,
    > {
        let deadline = Instant::now() + self.etcd.timeout;
        let mut retries = 0;
        loop {
            let mut client = self.etcd.client.clone();
            match tokio::time::timeout_at(deadline, client.lease_revoke(lease)).await {
                Ok(Err(e)) if retries < CONNECT_RETRIES && is_connect_error(&e) => {
                    retries += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => return other,
            }
        }
    }

    /// Removes `owner`'s place: deletes its key (and revokes a lease of its own).
    pub(super) async fn leave(&self, owner: &str) -> bool {
        let Some(contender) = self.contenders().remove(owner) else {
            return false;
        };
        if contender.shared.is_none() {
            // Revoking the lease deletes the key with it.
            let _ = self.revoke(contender.lease).await;
            return true;
        }
        let ours = contender.key.as_str();
        if self
            .etcd
            .bounded(None, "leaving the queue failed", |mut c| async move {
                c.delete(ours, None).await
            })
            .await
            .is_err()
        {
            self.etcd.remove_later(contender.key);
        }
        true
    }
}

/// From when the key lives for sure: the shared lease's last confirmed keep-alive, or the
/// grant of a lease of its own (`granted_at`).
pub(super) fn confirmed_at(
    shared: &Option<Arc<SharedLease>>,
    granted_at: Option<Instant>,
) -> Option<Instant> {
    match shared {
        Some(shared) => Some(shared.confirmed()),
        None => granted_at,
    }
}

/// Acquired with the key created at `revision` (its fence), counted from `confirmed`.
pub(super) fn acquired(revision: i64, confirmed: Option<Instant>) -> Queued {
    Queued {
        attempt: Attempt::Acquired {
            fence: u64::try_from(revision).ok(),
        },
        confirmed,
    }
}

/// First in line under a shared lease its keeper confirmed lately (fresh at `at`): the key
/// lives for sure, and the lock counts from that confirmation. `None` without a shared lease or
/// when its last confirmation is not recent enough (the caller then renews it).
fn acquired_under_fresh(
    shared: &Option<Arc<SharedLease>>,
    at: Instant,
    revision: i64,
) -> Option<Queued> {
    let shared = shared.as_ref().filter(|l| l.is_fresh(at))?;
    Some(acquired(revision, Some(shared.confirmed())))
}
