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
//! Acquire, release and renew are decided as soon as the answers so far settle them
//! ([`fanout`]): the nodes still out finish in the background, each request already queued on
//! its node's connection, so that this process's next request to that node comes after it.
//!
//! Each node runs the same scripts as standalone Redis. Renewal must be confirmed by a
//! majority within the validity, or the lease counts as lost; a majority that says "not ours"
//! is a loss at once. A release message from any node is a hint that wakes local waiters.
//!
//! No fencing: the nodes' counters are independent, and no majority vote can turn them into
//! one strictly increasing sequence, so `fence()` is `None`.

pub(crate) mod config;
mod fanout;
mod inspect;
mod restarts;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use self::config::Tuning;
use self::fanout::{Answer, FanOut, NodeCall};
use self::restarts::{NodeIdentity, NodeWakeups};
use super::redis::RedisBackend;
use super::redis::config::redact;
use super::{Attempt, Backend, Context, EngineResult, Released, Renewal};
use crate::error::LockError;
use crate::inspect::LockInfo;

/// Background attempts at a release (or an undo) a node did not answer.
const RELEASE_RETRIES: u32 = 5;

pub(crate) struct RedlockBackend {
    nodes: Arc<[Arc<RedisBackend>]>,
    urls: Vec<Arc<str>>,
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

/// Where an acquisition stands, from the answers so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Tally {
    /// Grants that count toward the quorum.
    granted: usize,
    /// Grants of nodes restarted within `rejoin_after`, or not checked since a reconnect.
    uncounted: usize,
    failed: usize,
    /// Nodes that have not answered yet.
    pending: usize,
    /// The soonest a restarted node that granted counts again.
    rejoins_in: Option<Duration>,
}

impl Tally {
    /// Whether the outcome is known: the quorum granted, or too few nodes are left to grant.
    fn settled(&self, quorum: usize) -> bool {
        self.granted >= quorum || self.granted + self.pending < quorum
    }
}

/// Whether the release answers so far settle it: a node freed the lock (so the answer is
/// `Freed` whatever the rest say) and a quorum of nodes no longer keep it (freed, or not ours
/// there), so that another owner can assemble a quorum from them without waiting for the rest.
fn release_settled(answers: &[Answer<Released>], quorum: usize) -> bool {
    let said = |what: Released| {
        answers
            .iter()
            .filter(|a| matches!(a, Some(Ok(r)) if *r == what))
            .count()
    };
    let freed = said(Released::Freed);
    freed > 0 && freed + said(Released::NotOwner) >= quorum
}

/// The verdict on item `i` of a renewal batch from the answers so far: `Some(true)` once the
/// quorum renewed it, `Some(false)` once a majority can no longer confirm it (lost), `None`
/// while neither is known (or when every node answered without a verdict).
fn renewal_verdict(answers: &[Answer<Vec<Option<bool>>>], i: usize, quorum: usize) -> Option<bool> {
    let said = |value: bool| {
        answers
            .iter()
            .filter(|a| matches!(a, Some(Ok(v)) if v.get(i) == Some(&Some(value))))
            .count()
    };
    if said(true) >= quorum {
        Some(true)
    } else if said(false) > answers.len() - quorum {
        Some(false)
    } else {
        None
    }
}

/// Retries, in the background, a release `node` did not answer: otherwise that node keeps
/// its copy of the lock until the lease runs out. Owner-checked, so harmless where the first
/// attempt did land. Starts `after` from now (the end of a hold that keeps the key).
fn release_at(
    node: Arc<RedisBackend>,
    key: Arc<str>,
    owner: Arc<str>,
    after: Duration,
    timeout: Duration,
) {
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
            nodes: nodes.into(),
            urls: redacted.into_iter().map(Arc::from).collect(),
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

    /// The error of node `i` that did not answer within the node timeout.
    fn node_timed_out(&self, i: usize, key: Option<&str>) -> LockError {
        timed_out(&self.urls[i], self.node_timeout, key)
    }

    /// Runs `op` on every node at once and waits for every answer; each answer is bounded by
    /// the per-node timeout.
    async fn on_all<'a, T, F>(
        &'a self,
        key: Option<&'a str>,
        op: impl Fn(usize, &'a RedisBackend) -> F,
    ) -> Vec<Result<T, LockError>>
    where
        F: Future<Output = Result<T, LockError>>,
    {
        let answers: Vec<Result<T, LockError>> =
            join_all(self.nodes.iter().enumerate().map(|(i, node)| {
                let call = op(i, node);
                async move {
                    match tokio::time::timeout(self.node_timeout, call).await {
                        Ok(answer) => answer,
                        Err(_) => Err(self.node_timed_out(i, key)),
                    }
                }
            }))
            .await;
        // A node that failed may have restarted: read its run id before its next grant counts.
        for (identity, answer) in self.identities.iter().zip(&answers) {
            if answer.is_err() {
                identity.suspect();
            }
        }
        answers
    }

    /// `op` on every node, each call owning what it needs (so that what is still out when the
    /// outcome is known can finish in the background), bounded by the per-node timeout; a node
    /// that fails is suspected of a restart (its run id is read again before its next grant
    /// counts), whenever its answer comes.
    fn each_node<T, F>(
        &self,
        key: Option<&Arc<str>>,
        op: impl Fn(usize, Arc<RedisBackend>) -> F,
    ) -> FanOut<T>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, LockError>> + Send + 'static,
    {
        let calls = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let identity = self.identities[i].clone();
                // A node that may not have the scripts may not be connected either (first
                // contact, a disconnect or failure since): its answer is awaited (see
                // `FanOut`).
                let needs_scripts = identity.needs_scripts();
                let awaited = needs_scripts.is_some();
                // Sent ahead of the call (polled first), on the same connection.
                let load = needs_scripts.map(|epoch| {
                    let (node, identity) = (node.clone(), identity.clone());
                    async move {
                        if node.load_scripts().await.is_ok() {
                            identity.scripts_loaded(epoch);
                        }
                    }
                });
                // Boxed as it is made: the future below moves a pointer, not the request's
                // whole state, each time it is wrapped or polled first.
                let call = Box::pin(op(i, node.clone()));
                let timeout = self.node_timeout;
                // Only for the message of a node that does not answer (made if it does not).
                let (url, key) = (self.urls[i].clone(), key.cloned());
                // Unconstrained: tokio's cooperative budget must not keep the first poll from
                // queueing the request on its connection (see `fanout`).
                let call = Box::pin(tokio::task::unconstrained(async move {
                    let call = async move {
                        match load {
                            Some(load) => tokio::join!(load, call).1,
                            None => call.await,
                        }
                    };
                    let answer = match tokio::time::timeout(timeout, call).await {
                        Ok(answer) => answer,
                        Err(_) => Err(timed_out(&url, timeout, key.as_deref())),
                    };
                    if answer.is_err() {
                        identity.suspect();
                    }
                    answer
                })) as NodeCall<T>;
                (call, awaited)
            })
            .collect();
        FanOut::new(calls)
    }

    /// Retries, in the background, a release `node` did not answer (see [`release_at`]).
    fn release_later(&self, node: usize, key: &Arc<str>, owner: &Arc<str>) {
        release_at(
            self.nodes[node].clone(),
            key.clone(),
            owner.clone(),
            Duration::ZERO,
            self.node_timeout,
        );
    }

    /// An owner-checked release of an attempt's copy on `node`, retried in the background if
    /// the node does not answer.
    fn undo(
        &self,
        node: usize,
        key: &Arc<str>,
        owner: &Arc<str>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let (node, key, owner) = (self.nodes[node].clone(), key.clone(), owner.clone());
        let timeout = self.node_timeout;
        async move {
            let undone = tokio::time::timeout(timeout, node.release(&key, &owner)).await;
            if !matches!(undone, Ok(Ok(_))) {
                release_at(node, key, owner, Duration::ZERO, timeout);
            }
        }
    }

    /// The error when too many nodes failed for a majority to be possible (`answered`: nodes
    /// that answered without an error).
    fn no_quorum(&self, key: &str, answered: usize, first_error: Option<&LockError>) -> LockError {
        let source =
            first_error.map(|e| Arc::new(e.clone()) as Arc<dyn std::error::Error + Send + Sync>);
        LockError::backend(
            Some(key),
            format!(
                "redlock quorum not reached: {} of {} nodes answered, {} needed",
                answered,
                self.nodes.len(),
                self.quorum
            ),
            source,
        )
    }

    /// [`no_quorum`](Self::no_quorum) from a full set of answers.
    fn no_quorum_of<T>(&self, key: &str, answers: &[Result<T, LockError>]) -> LockError {
        let first_error = answers.iter().find_map(|a| a.as_ref().err());
        let answered = answers.iter().filter(|a| a.is_ok()).count();
        self.no_quorum(key, answered, first_error)
    }

    /// Counts the acquire answers so far at `now` (a grant counts unless its node restarted
    /// within `rejoin_after`, or has not been checked since it reconnected: it may have
    /// forgotten another owner's lock).
    fn tally(
        &self,
        answers: &[Answer<Attempt>],
        rejoin_after: Option<Duration>,
        now: Instant,
    ) -> Tally {
        let mut tally = Tally::default();
        for (answer, identity) in answers.iter().zip(&self.identities) {
            match answer {
                None => tally.pending += 1,
                Some(Err(_)) => tally.failed += 1,
                Some(Ok(Attempt::Busy { .. })) => {}
                Some(Ok(Attempt::Acquired { .. })) => match rejoin_after {
                    Some(rejoin) if !identity.counts(now, rejoin) => {
                        tally.uncounted += 1;
                        if let Some(d) = identity.rejoins_in(now, rejoin) {
                            tally.rejoins_in = Some(tally.rejoins_in.map_or(d, |r| r.min(d)));
                        }
                    }
                    _ => tally.granted += 1,
                },
            }
        }
        tally
    }

    /// One Redlock acquisition: an attempt on every node (`waiting`: a waiter's attempt, which
    /// asks each node to notify it of the release), counted against the quorum as the answers
    /// come. It is decided as soon as the quorum granted, or too few nodes are left to grant;
    /// the nodes still out finish in the background: a late grant of a won attempt is part of
    /// the hold (renewals and the release go to every node), and a lost attempt is undone at
    /// once on every node that granted, failed or has not answered (each node's undo is queued
    /// behind its acquire request, and before the next attempt).
    ///
    /// A node whose run id must be read again (first contact, or a disconnect or failure
    /// since) gets `INFO server` pipelined with the acquire request.
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
        // One place in every node's line of runtimes, so that they serve them alike.
        let place = crate::backend::redis::place_now();
        let (key, owner): (Arc<str>, Arc<str>) = (key.into(), owner.into());
        let mut fan = self.each_node(Some(&key), |i, node| {
            let identity = self.identities[i].clone();
            let check = rejoin_after.is_some() && identity.needs_check();
            let (key, owner) = (key.clone(), owner.clone());
            async move {
                let request = async {
                    if waiting {
                        node.try_acquire_waiting_at(&key, &owner, lease, Some(place))
                            .await
                    } else {
                        node.try_acquire(&key, &owner, lease).await
                    }
                };
                if check {
                    // Same connection, sent together: one round trip for both.
                    let (_, grant) = tokio::join!(identity.check(&node), request);
                    grant
                } else {
                    request.await
                }
            }
        });
        let mut tally = Tally::default();
        fan.until(|answers| {
            tally = self.tally(answers, rejoin_after, Instant::now());
            tally.settled(self.quorum)
        })
        .await;
        if tally.uncounted > 0 {
            tracing::debug!(key = %key, granted = tally.granted, uncounted = tally.uncounted, rejoins_in = ?tally.rejoins_in, "grants of restarted or unchecked redlock nodes do not count");
        }
        // Validity left: lease - elapsed - drift. Counted only when at least `min_validity` of
        // the lease is left; a grant arriving later could expire before it is first renewed.
        let validity = lease
            .saturating_sub(started.elapsed())
            .saturating_sub(drift(lease));
        let valid = validity > Duration::ZERO && validity >= lease.mul_f64(self.min_validity);
        if tally.granted >= self.quorum && valid {
            // Late answers: a grant is part of the hold, a failure was suspected.
            fan.rest(|_, _| {}).spawn();
            return Ok(Attempt::Acquired { fence: None });
        }
        let answer = self.lost(&key, fan.answers(), tally);
        // Undo wherever the lock may be ours: granted, not answered yet, or the answer was
        // lost (the request may have landed). A node that answered busy granted nothing.
        let undo: Vec<usize> = fan
            .answers()
            .iter()
            .enumerate()
            .filter_map(|(i, a)| (!matches!(a, Some(Ok(Attempt::Busy { .. })))).then_some(i))
            .collect();
        let mut background = fan.rest(|_, _| {});
        for node in undo {
            background.start(self.undo(node, &key, &owner));
        }
        background.spawn();
        answer
    }

    /// The answer of an attempt that did not win: no quorum possible (too many nodes failed),
    /// or busy, with how long to wait before the next attempt.
    fn lost(&self, key: &str, answers: &[Answer<Attempt>], tally: Tally) -> EngineResult<Attempt> {
        if tally.failed > self.nodes.len() - self.quorum {
            let answered = answers.iter().filter(|a| matches!(a, Some(Ok(_)))).count();
            let first_error = answers.iter().find_map(|a| a.as_ref()?.as_ref().err());
            return Err(self.no_quorum(key, answered, first_error));
        }
        let mut busy_ttls: Vec<Duration> = answers
            .iter()
            .filter_map(|a| match a {
                Some(Ok(Attempt::Busy { ttl })) => Some(ttl.unwrap_or(Duration::from_millis(100))),
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
        } else if let Some(rejoins_in) = tally
            .rejoins_in
            .filter(|_| tally.granted + tally.uncounted >= self.quorum)
        {
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

/// The error of the node at `url` that did not answer within `timeout`.
fn timed_out(url: &str, timeout: Duration, key: Option<&str>) -> LockError {
    LockError::backend(
        key,
        format!("redlock node {url} did not answer within {timeout:?}"),
        None,
    )
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

    async fn leave_line(&self, key: &str) {
        // Each node answers within the node timeout; a node that does not keeps a place that
        // costs its next release a short reservation.
        self.on_all(Some(key), |_, node| async move {
            node.leave_line(key).await;
            Ok(())
        })
        .await;
    }

    async fn renew(&self, batch: &[Renewal]) -> Result<Vec<Option<bool>>, LockError> {
        // A renewal only extends a key that carries our owner token, so a restarted node's
        // answer cannot let anyone else in: its votes count as they are.
        for item in batch {
            self.note_lease(item.lease);
        }
        let items = batch.len();
        let batch: Arc<[Renewal]> = batch.into();
        let mut fan = self.each_node(None, |_, node| {
            let batch = batch.clone();
            async move { node.renew(&batch).await }
        });
        // Settled once every lock has its verdict; the answers still out change none.
        fan.until(|answers| (0..items).all(|i| renewal_verdict(answers, i, self.quorum).is_some()))
            .await;
        let verdicts = (0..items)
            .map(|i| renewal_verdict(fan.answers(), i, self.quorum))
            .collect();
        fan.rest(|_, _| {}).spawn();
        Ok(verdicts)
    }

    /// Settled once a node freed the lock and a quorum no longer keeps it (see
    /// [`release_settled`]); the other nodes' answers come in the background, and a node that
    /// fails is retried there. The request to every node is queued on its connection before
    /// this returns, so this process's next attempt at the key reaches each node after it.
    async fn release(&self, key: &str, owner: &str) -> Result<Released, LockError> {
        let (key, owner): (Arc<str>, Arc<str>) = (key.into(), owner.into());
        let mut fan = self.each_node(Some(&key), |_, node| {
            let (key, owner) = (key.clone(), owner.clone());
            async move { node.release(&key, &owner).await }
        });
        fan.until(|answers| release_settled(answers, self.quorum))
            .await;
        let answers = fan.answers();
        for (i, answer) in answers.iter().enumerate() {
            if matches!(answer, Some(Err(_))) {
                self.release_later(i, &key, &owner);
            }
        }
        let said = |what: Released| {
            answers
                .iter()
                .any(|a| matches!(a, Some(Ok(r)) if *r == what))
        };
        let released = if said(Released::Freed) {
            Ok(Released::Freed)
        } else if said(Released::StillHeld) {
            Ok(Released::StillHeld)
        } else if answers.iter().all(|a| matches!(a, Some(Err(_)))) {
            let first_error = answers.iter().find_map(|a| a.as_ref()?.as_ref().err());
            Err(self.no_quorum(&key, 0, first_error))
        } else {
            Ok(Released::NotOwner)
        };
        let (nodes, timeout) = (self.nodes.clone(), self.node_timeout);
        fan.rest(move |i, answer| {
            if answer.is_err() {
                release_at(
                    nodes[i].clone(),
                    key.clone(),
                    owner.clone(),
                    Duration::ZERO,
                    timeout,
                );
            }
        })
        .spawn();
        released
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
                release_at(
                    node.clone(),
                    key.into(),
                    owner.into(),
                    kept_for,
                    self.node_timeout,
                );
            }
        }
        if answers.iter().any(|a| matches!(a, Ok(Released::Kept))) {
            Ok(Released::Kept)
        } else if answers.iter().all(Result::is_err) {
            Err(self.no_quorum_of(key, &answers))
        } else {
            Ok(Released::NotOwner)
        }
    }

    async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        let answers = self
            .on_all(Some(key), |_, node| node.force_unlock(key))
            .await;
        if answers.iter().all(Result::is_err) {
            return Err(self.no_quorum_of(key, &answers));
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
            return Err(self.no_quorum_of(key, &answers));
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
            return Err(self.no_quorum_of(key, &answers));
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
        let year = crate::core::MAX_LEASE;
        assert!(drift(year) < year);
    }

    fn failed<T>() -> Option<Result<T, LockError>> {
        Some(Err(LockError::backend(None, "down", None)))
    }

    #[test]
    fn an_acquisition_settles_at_the_quorum_or_when_too_few_nodes_are_left() {
        let tally = |granted, pending| Tally {
            granted,
            pending,
            ..Tally::default()
        };
        // 3 nodes, quorum 2.
        assert!(tally(2, 1).settled(2), "won with one node still out");
        assert!(!tally(1, 2).settled(2), "one grant, two out: open");
        assert!(
            !tally(1, 1).settled(2),
            "one grant, one refusal, one out: open"
        );
        assert!(tally(0, 1).settled(2), "two refusals: lost with one out");
        assert!(tally(1, 0).settled(2), "everyone answered");
        // 5 nodes, quorum 3.
        assert!(!tally(2, 2).settled(3));
        assert!(tally(3, 2).settled(3));
        assert!(tally(1, 1).settled(3), "three refusals of five");
    }

    #[test]
    fn a_release_settles_once_a_node_freed_it_and_a_quorum_keeps_it_no_longer() {
        use Released::{Freed, NotOwner};
        let answers = |said: &[Option<Released>]| -> Vec<Option<Result<Released, LockError>>> {
            said.iter().map(|a| a.map(Ok)).collect()
        };
        assert!(release_settled(
            &answers(&[Some(Freed), Some(Freed), None]),
            2
        ));
        assert!(release_settled(
            &answers(&[Some(Freed), Some(NotOwner), None]),
            2
        ));
        assert!(!release_settled(&answers(&[Some(Freed), None, None]), 2));
        // Not ours on a quorum: the answer is `Freed` only if a node freed it; wait.
        assert!(!release_settled(
            &answers(&[Some(NotOwner), Some(NotOwner), None]),
            2
        ));
        let mut with_failure = answers(&[Some(Freed), None, None]);
        with_failure[1] = failed();
        assert!(
            !release_settled(&with_failure, 2),
            "a failure is no release"
        );
        assert!(!release_settled(
            &answers(&[Some(Freed), Some(Freed), None, None, None]),
            3
        ));
    }

    #[test]
    fn a_renewal_verdict_comes_at_the_quorum_or_a_majority_not_ours() {
        let answer = |v: &[Option<bool>]| Some(Ok(v.to_vec()));
        // Two locks, 3 nodes, quorum 2.
        let answers = vec![
            answer(&[Some(true), Some(false)]),
            answer(&[Some(true), Some(false)]),
            None,
        ];
        assert_eq!(renewal_verdict(&answers, 0, 2), Some(true));
        assert_eq!(renewal_verdict(&answers, 1, 2), Some(false));
        let answers = vec![answer(&[Some(true)]), failed(), None];
        assert_eq!(
            renewal_verdict(&answers, 0, 2),
            None,
            "open while a node is out"
        );
        let answers = vec![answer(&[Some(true)]), failed(), failed()];
        assert_eq!(
            renewal_verdict(&answers, 0, 2),
            None,
            "undetermined, not lost"
        );
    }
}
