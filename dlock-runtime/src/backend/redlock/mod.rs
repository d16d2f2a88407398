//! Redlock: a majority of N independent Redis masters (`redlock://h1:p1,h2:p2,h3:p3`).
//!
//! The algorithm as published: one owner token for all nodes; each attempt goes to every node
//! **concurrently**, each call bounded by a per-node timeout far below the lease; the lock is
//! ours when at least the quorum (`N/2 + 1` unless configured higher) of nodes granted it and
//! the validity `lease - elapsed - drift` (drift = 1 % of the lease + 2 ms) is still at least
//! `min_validity` of the lease. A grant from a node seen restarting within `rejoin_after`
//! does not count ([`restarts`]). Otherwise the
//! attempt is undone on every node (owner-checked) and the runtime retries until its deadline:
//! after the holder's TTL or a release notification when another owner holds a majority,
//! after a short random delay on a split vote.
//!
//! Each node runs the same scripts as standalone Redis. Renewal must be confirmed by a
//! majority within the validity, or the lease counts as lost; a majority that says "not ours"
//! is a loss at once. A release message from any node is a hint that wakes local waiters.
//!
//! No fencing: the nodes' counters are independent, and no majority vote can turn them into
//! one strictly increasing sequence, so `fence()` is `None`.

pub(crate) mod config;
mod inspect;
mod restarts;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use self::config::Tuning;
use self::restarts::{NodeIdentity, NodeWakeups};
use super::redis::RedisBackend;
use super::redis::config::redact;
use super::{Attempt, Backend, Context, EngineResult, Released, Renewal};
use crate::{LockError, LockInfo};

/// Background attempts at a release (or an undo) a node did not answer.
const RELEASE_RETRIES: u32 = 5;

pub(crate) struct RedlockBackend {
    nodes: Vec<Arc<RedisBackend>>,
    urls: Vec<String>,
    /// What is known of each node's server process (its restarts), by node.
    identities: Vec<Arc<NodeIdentity>>,
    quorum: usize,
    node_timeout: Duration,
    /// Fraction of the lease that must still be valid when the quorum has granted it.
    min_validity: f64,
    /// How long after a restart a node's grants count again (`None`: the longest lease used;
    /// zero: restarts are not checked).
    rejoin_after: Option<Duration>,
    /// The longest lease this runtime has used, in nanoseconds.
    longest_lease: AtomicU64,
}

/// Redlock's clock-drift allowance: 1 % of the lease plus 2 ms.
fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

impl RedlockBackend {
    /// Sets up one lazily connected client per node (a node that is down does not stop the
    /// runtime from starting: it is one of the minority Redlock tolerates). Each node's calls
    /// are bounded by `node_timeout`.
    pub(crate) fn connect(
        urls: &[String],
        ctx: &Context,
        tuning: Tuning,
    ) -> Result<Self, LockError> {
        let redacted: Vec<String> = urls.iter().map(|url| redact(url)).collect();
        let identities: Vec<Arc<NodeIdentity>> = redacted
            .iter()
            .map(|url| NodeIdentity::new(url.clone()))
            .collect();
        let nodes = urls
            .iter()
            .zip(&identities)
            .map(|(url, identity)| {
                // A disconnect of this node's connection marks it for a run id check.
                let node_ctx = Context {
                    timeout: tuning.node_timeout,
                    wakeups: Arc::new(NodeWakeups {
                        inner: ctx.wakeups.clone(),
                        identity: identity.clone(),
                    }),
                    ..ctx.clone()
                };
                RedisBackend::connect_lazy(url, &node_ctx).map(Arc::new)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            quorum: tuning.quorum,
            nodes,
            urls: redacted,
            identities,
            node_timeout: tuning.node_timeout,
            min_validity: tuning.min_validity,
            rejoin_after: tuning.rejoin_after,
            longest_lease: AtomicU64::new(0),
        })
    }

    /// Notes a lease in use (the default of `rejoin_after` is the longest).
    fn note_lease(&self, lease: Duration) {
        let nanos = u64::try_from(lease.as_nanos()).unwrap_or(u64::MAX);
        self.longest_lease.fetch_max(nanos, Ordering::AcqRel);
    }

    /// How long after a restart a node's grants count again; `None` when restarts are not
    /// checked.
    fn rejoin_after(&self) -> Option<Duration> {
        match self.rejoin_after {
            Some(d) if d.is_zero() => None,
            Some(d) => Some(d),
            None => Some(Duration::from_nanos(
                self.longest_lease.load(Ordering::Acquire),
            )),
        }
    }

    /// Runs `op` on every node at once; each answer is bounded by the per-node timeout.
    async fn on_all<'a, T, F>(
        &'a self,
        key: Option<&'a str>,
        op: impl Fn(usize, &'a RedisBackend) -> F,
    ) -> Vec<Result<T, LockError>>
    where
        F: Future<Output = Result<T, LockError>>,
    {
        let answers: Vec<Result<T, LockError>> = join_all(
            self.nodes
                .iter()
                .zip(&self.urls)
                .enumerate()
                .map(|(i, (node, url))| {
                    let call = op(i, node);
                    async move {
                        match tokio::time::timeout(self.node_timeout, call).await {
                            Ok(answer) => answer,
                            Err(_) => Err(LockError::backend(
                                key,
                                format!(
                                    "redlock node {url} did not answer within {:?}",
                                    self.node_timeout
                                ),
                                None,
                            )),
                        }
                    }
                }),
        )
        .await;
        // A node that failed may have restarted: read its run id before its next grant counts.
        for (identity, answer) in self.identities.iter().zip(&answers) {
            if answer.is_err() {
                identity.suspect();
            }
        }
        answers
    }

    /// One acquire request to every node; a node whose run id must be read again (first
    /// contact, or a disconnect or failure since) gets `INFO server` pipelined with it.
    async fn acquire_on_all(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
        check_restarts: bool,
        waiting: bool,
    ) -> Vec<Result<Attempt, LockError>> {
        self.on_all(Some(key), |i, node| {
            let identity = &self.identities[i];
            let check = check_restarts && identity.needs_check();
            async move {
                let request = async {
                    if waiting {
                        node.try_acquire_waiting(key, owner, lease).await
                    } else {
                        node.try_acquire(key, owner, lease).await
                    }
                };
                if check {
                    // Same connection, sent together: one round trip for both.
                    let (_, grant) = tokio::join!(identity.check(node), request);
                    grant
                } else {
                    request.await
                }
            }
        })
        .await
    }

    /// Retries, in the background, a release `node` did not answer: otherwise that node keeps
    /// its copy of the lock until the lease runs out. Owner-checked, so harmless where the
    /// first attempt did land.
    fn release_later(&self, node: &Arc<RedisBackend>, key: &str, owner: &str) {
        self.release_at(node, key, owner, Duration::ZERO);
    }

    /// As [`release_later`](Self::release_later), starting `after` from now (the end of a
    /// hold that keeps the key).
    fn release_at(&self, node: &Arc<RedisBackend>, key: &str, owner: &str, after: Duration) {
        let (node, key, owner) = (node.clone(), key.to_owned(), owner.to_owned());
        let timeout = self.node_timeout;
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let mut delay = Duration::from_millis(100);
            for _ in 0..RELEASE_RETRIES {
                tokio::time::sleep(delay).await;
                if let Ok(Ok(_)) = tokio::time::timeout(timeout, node.release(&key, &owner)).await {
                    return;
                }
                delay *= 2;
            }
            tracing::debug!(key = %key, "a redlock node missed a release; its copy expires with the lease");
        });
    }

    /// The error when too many nodes failed for a majority to be possible.
    fn no_quorum<T>(&self, key: &str, answers: &[Result<T, LockError>]) -> LockError {
        let failed: Vec<&LockError> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
        let source = failed
            .first()
            .map(|e| Arc::new((*e).clone()) as Arc<dyn std::error::Error + Send + Sync>);
        LockError::backend(
            Some(key),
            format!(
                "redlock quorum not reached: {} of {} nodes answered, {} needed",
                answers.len() - failed.len(),
                answers.len(),
                self.quorum
            ),
            source,
        )
    }

    /// One Redlock acquisition: an attempt on every node (`waiting`: a waiter's attempt, which
    /// asks each node to notify it of the release), counted against the quorum.
    async fn acquire(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
        waiting: bool,
    ) -> EngineResult<Attempt> {
        let started = Instant::now();
        self.note_lease(lease);
        let rejoin_after = self.rejoin_after();
        let answers = self
            .acquire_on_all(key, owner, lease, rejoin_after.is_some(), waiting)
            .await;
        // A grant counts unless its node restarted within `rejoin_after` (or has not been
        // checked since it reconnected): it may have forgotten another owner's lock.
        let now = Instant::now();
        let mut granted = 0;
        let mut uncounted = 0;
        // The soonest a restarted node that granted counts again.
        let mut rejoins_in: Option<Duration> = None;
        for (answer, identity) in answers.iter().zip(&self.identities) {
            if !matches!(answer, Ok(Attempt::Acquired { .. })) {
                continue;
            }
            match rejoin_after {
                Some(rejoin) if !identity.counts(now, rejoin) => {
                    uncounted += 1;
                    if let Some(d) = identity.rejoins_in(now, rejoin) {
                        rejoins_in = Some(rejoins_in.map_or(d, |r| r.min(d)));
                    }
                }
                _ => granted += 1,
            }
        }
        if uncounted > 0 {
            tracing::debug!(key = %key, granted, uncounted, ?rejoins_in, "grants of restarted or unchecked redlock nodes do not count");
        }
        // Validity left: lease - elapsed - drift. Counted only when at least `min_validity` of
        // the lease is left; a grant arriving later could expire before it is first renewed.
        let validity = lease
            .saturating_sub(started.elapsed())
            .saturating_sub(drift(lease));
        let valid = validity > Duration::ZERO && validity >= lease.mul_f64(self.min_validity);
        if granted >= self.quorum && valid {
            return Ok(Attempt::Acquired { fence: None });
        }
        // Undo wherever the lock may be ours: granted, or the answer was lost (the request
        // may have landed). A node that answered busy granted nothing.
        let undo = answers
            .iter()
            .map(|a| !matches!(a, Ok(Attempt::Busy { .. })));
        let undo: Vec<&Arc<RedisBackend>> = self
            .nodes
            .iter()
            .zip(undo)
            .filter_map(|(node, undo)| undo.then_some(node))
            .collect();
        join_all(undo.into_iter().map(|node| async move {
            let undone = tokio::time::timeout(self.node_timeout, node.release(key, owner)).await;
            if !matches!(undone, Ok(Ok(_))) {
                self.release_later(node, key, owner);
            }
        }))
        .await;
        let failed = answers.iter().filter(|a| a.is_err()).count();
        if failed > self.nodes.len() - self.quorum {
            return Err(self.no_quorum(key, &answers));
        }
        let mut busy_ttls: Vec<Duration> = answers
            .iter()
            .filter_map(|a| match a {
                Ok(Attempt::Busy { ttl }) => Some(ttl.unwrap_or(Duration::from_millis(100))),
                _ => None,
            })
            .collect();
        busy_ttls.sort();
        // Busy nodes that leave too few for a quorum.
        let blocking = self.nodes.len() - self.quorum + 1;
        let ttl = if busy_ttls.len() >= blocking {
            // Another owner holds enough nodes to keep us from a quorum: wait for its release
            // (notification) or for its lease to run out on enough of them.
            busy_ttls[busy_ttls.len() - blocking]
        } else if let Some(rejoins_in) = rejoins_in.filter(|_| granted + uncounted >= self.quorum) {
            // Only a restarted node's grant was missing: look again when it counts (or when a
            // release notification comes first).
            rejoins_in.max(Duration::from_millis(5))
        } else {
            // A split vote (or a grant that came too late): retry after a short random
            // delay so that contenders do not collide again.
            Duration::from_millis(5 + rand::random::<u64>() % 45)
        };
        Ok(Attempt::Busy { ttl: Some(ttl) })
    }
}

impl Backend for RedlockBackend {
    async fn try_acquire(&self, key: &str, owner: &str, lease: Duration) -> EngineResult<Attempt> {
        self.acquire(key, owner, lease, false).await
    }

    async fn try_acquire_waiting(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
    ) -> EngineResult<Attempt> {
        self.acquire(key, owner, lease, true).await
    }

    async fn renew(&self, batch: &[Renewal]) -> Result<Vec<Option<bool>>, LockError> {
        // A renewal only extends a key that carries our owner token, so a restarted node's
        // answer cannot let anyone else in: its votes count as they are.
        for item in batch {
            self.note_lease(item.lease);
        }
        let answers = self.on_all(None, |_, node| node.renew(batch)).await;
        let n = self.nodes.len();
        Ok((0..batch.len())
            .map(|i| {
                let said = |value: bool| {
                    answers
                        .iter()
                        .filter(|a| matches!(a, Ok(v) if v.get(i) == Some(&Some(value))))
                        .count()
                };
                if said(true) >= self.quorum {
                    Some(true)
                } else if said(false) > n - self.quorum {
                    // A majority can no longer confirm: lost.
                    Some(false)
                } else {
                    None
                }
            })
            .collect())
    }

    async fn release(&self, key: &str, owner: &str) -> Result<Released, LockError> {
        let answers = self
            .on_all(Some(key), |_, node| node.release(key, owner))
            .await;
        for (node, answer) in self.nodes.iter().zip(&answers) {
            if answer.is_err() {
                self.release_later(node, key, owner);
            }
        }
        let count = |what: Released| {
            answers
                .iter()
                .filter(|a| matches!(a, Ok(r) if *r == what))
                .count()
        };
        if count(Released::Freed) > 0 {
            Ok(Released::Freed)
        } else if count(Released::StillHeld) > 0 {
            Ok(Released::StillHeld)
        } else if answers.iter().all(Result::is_err) {
            Err(self.no_quorum(key, &answers))
        } else {
            Ok(Released::NotOwner)
        }
    }

    async fn release_after(
        &self,
        key: &str,
        owner: &str,
        hold: Duration,
    ) -> Result<Released, LockError> {
        // Each node counts the hold on its own clock: the drift allowance is added, so that
        // no majority frees the key before the hold ends on this process's clock.
        let kept_for = hold.saturating_add(drift(hold));
        let answers = self
            .on_all(Some(key), |_, node| {
                node.release_after(key, owner, kept_for)
            })
            .await;
        for (node, answer) in self.nodes.iter().zip(&answers) {
            if answer.is_err() {
                // Its copy (if any) is released once the hold is over on every clock.
                self.release_at(node, key, owner, kept_for);
            }
        }
        if answers.iter().any(|a| matches!(a, Ok(Released::Kept))) {
            Ok(Released::Kept)
        } else if answers.iter().all(Result::is_err) {
            Err(self.no_quorum(key, &answers))
        } else {
            Ok(Released::NotOwner)
        }
    }

    async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        let answers = self
            .on_all(Some(key), |_, node| node.force_unlock(key))
            .await;
        if answers.iter().all(Result::is_err) {
            return Err(self.no_quorum(key, &answers));
        }
        Ok(answers.iter().any(|a| matches!(a, Ok(true))))
    }

    async fn holder_ttl(&self, key: &str) -> Option<Duration> {
        // Until fewer than a majority keep the key: the quorum-th longest TTL.
        let answers = self
            .on_all(Some(key), |_, node| async move {
                Ok::<_, LockError>(node.holder_ttl(key).await)
            })
            .await;
        let mut ttls: Vec<Duration> = answers
            .into_iter()
            .filter_map(|a| a.ok().flatten())
            .collect();
        ttls.sort_unstable_by(|a, b| b.cmp(a));
        ttls.get(self.quorum.checked_sub(1)?).copied()
    }

    async fn is_locked(&self, key: &str) -> Result<bool, LockError> {
        let answers = self.on_all(Some(key), |_, node| node.is_locked(key)).await;
        let failed = answers.iter().filter(|a| a.is_err()).count();
        if failed > self.nodes.len() - self.quorum {
            return Err(self.no_quorum(key, &answers));
        }
        let locked = answers.iter().filter(|a| matches!(a, Ok(true))).count();
        Ok(locked >= self.quorum)
    }

    async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let answers = self
            .on_all(Some(key), |_, node| async move {
                Ok(node.holding(key).await?.into_iter().collect::<Vec<_>>())
            })
            .await;
        Ok(self.agreed(Some(key), answers)?.into_iter().next())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>, LockError> {
        let answers = self.on_all(None, |_, node| node.holdings(prefix)).await;
        self.agreed(None, answers)
    }

    async fn watch(&self, key: &str) -> Result<(), LockError> {
        // A notification from any node is a hint; waits stay bounded by the holder's TTL.
        let answers = self.on_all(Some(key), |_, node| node.watch(key)).await;
        if answers.iter().all(Result::is_err) {
            return Err(self.no_quorum(key, &answers));
        }
        Ok(())
    }

    async fn unwatch(&self, key: &str) -> Result<(), LockError> {
        self.on_all(Some(key), |_, node| node.unwatch(key)).await;
        Ok(())
    }

    fn check_mode(&self, key: &str, mode: crate::backend::mode::Mode) -> Result<(), LockError> {
        if !mode.is_shared() {
            return Ok(());
        }
        Err(LockError::config(format!(
            "`{key}`: redlock:// has no {} locks: a quorum of independent nodes cannot agree \
             on a set of holders without fencing; use redis://, redis+cluster://, etcd:// or \
             zk:// for read-write locks and semaphores",
            match mode {
                crate::backend::mode::Mode::Read => "read",
                _ => "semaphore",
            }
        )))
    }

    /// Independent masters keep no common queue of waiters: fair locks are refused.
    fn fairness(&self) -> crate::backend::Fairness {
        crate::backend::Fairness::Unsupported
    }

    fn lease_margin(&self, lease: Duration) -> Result<Duration, LockError> {
        let allowance = drift(lease) + self.node_timeout;
        if lease <= allowance {
            return Err(LockError::config(format!(
                "a lease of {lease:?} is too short for Redlock: the clock-drift allowance ({:?}) plus the per-node timeout ({:?}) leave no validity",
                drift(lease),
                self.node_timeout
            )));
        }
        Ok(drift(lease))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_is_one_percent_plus_two_milliseconds_without_overflow() {
        assert_eq!(drift(Duration::from_secs(10)), Duration::from_millis(102));
        assert_eq!(drift(Duration::from_millis(1)), Duration::from_micros(2010));
        let year = crate::MAX_LEASE;
        assert!(drift(year) < year);
    }
}
