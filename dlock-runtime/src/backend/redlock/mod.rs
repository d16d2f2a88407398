//! Redlock: a quorum of N independent Redis masters (`redlock://h1:p1,h2:p2,h3:p3`), each a
//! lazily connected single-server backend ([`nodes`]).
//!
//! Invariant: a lock is ours only while a quorum of nodes granted (or renewed) it and the
//! validity `lease - elapsed - drift` holds ([`acquire`]); grants of a node seen restarting
//! within `rejoin_after` do not count ([`restarts`]). No fencing: the nodes' counters are
//! independent, so `fence()` is `None`.

mod acquire;
pub(crate) mod config;
mod fanout;
mod inspect;
mod nodes;
mod restarts;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use self::acquire::{Ask, drift};
use self::config::{OPTIONS, RedlockConfig, Tuning, fraction};
use self::fanout::Answer;
use self::nodes::{Nodes, release_at};
use super::redis::config::{CLIENT_OPTIONS, check_tls};
use super::{
    Attempt, Backend, Capabilities, Connecting, Context, DynBackend, EngineConfig, EngineResult,
    Fairness, Released, Renewal, Setting,
};
use crate::error::LockError;
use crate::inspect::LockInfo;

pub(crate) struct RedlockBackend {
    nodes: Nodes,
    /// Fraction of the lease that must still be valid when the quorum has granted it.
    min_validity: f64,
    /// How long after a restart a node's grants count again (`None`: the longest lease used;
    /// zero: restarts are not checked).
    rejoin_after: Option<Duration>,
    /// The longest lease this runtime has used, in nanoseconds.
    longest_lease: AtomicU64,
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

impl RedlockBackend {
    /// Sets up one lazily connected client per node (see [`Nodes::connect`]).
    pub(crate) fn connect(
        urls: &[String],
        ctx: &Context,
        tuning: Tuning,
    ) -> Result<Self, LockError> {
        Ok(Self {
            nodes: Nodes::connect(urls, ctx, &tuning)?,
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

    /// One acquisition on every node (see [`acquire::acquire`]).
    async fn acquire(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
        waiting: bool,
    ) -> EngineResult<Attempt> {
        let started = Instant::now();
        self.note_lease(lease);
        let ask = Ask {
            lease,
            waiting,
            started,
            rejoin_after: self.rejoin_after(),
            min_validity: self.min_validity,
        };
        acquire::acquire(&self.nodes, key, owner, ask).await
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

    async fn leave_line(&self, key: &str) {
        // Each node answers within the node timeout; a node that does not keeps a place that
        // costs its next release a short reservation.
        self.nodes
            .on_all(Some(key), |_, node| async move {
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
        let mut fan = self.nodes.each_node(None, |_, node| {
            let batch = batch.clone();
            async move { node.renew(&batch).await }
        });
        // Settled once every lock has its verdict; the answers still out change none.
        fan.until(|answers| {
            (0..items).all(|i| renewal_verdict(answers, i, self.nodes.quorum).is_some())
        })
        .await;
        let verdicts = (0..items)
            .map(|i| renewal_verdict(fan.answers(), i, self.nodes.quorum))
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
        let mut fan = self.nodes.each_node(Some(&key), |_, node| {
            let (key, owner) = (key.clone(), owner.clone());
            async move { node.release(&key, &owner).await }
        });
        fan.until(|answers| release_settled(answers, self.nodes.quorum))
            .await;
        let answers = fan.answers();
        for (i, answer) in answers.iter().enumerate() {
            if matches!(answer, Some(Err(_))) {
                self.nodes.release_later(i, &key, &owner);
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
            Err(self.nodes.no_quorum(&key, 0, first_error))
        } else {
            Ok(Released::NotOwner)
        };
        let (nodes, timeout) = (self.nodes.nodes.clone(), self.nodes.node_timeout);
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
            .nodes
            .on_all(Some(key), |_, node| {
                node.release_after(key, owner, kept_for)
            })
            .await;
        for (node, answer) in self.nodes.nodes.iter().zip(&answers) {
            if answer.is_err() {
                // Its copy (if any) is released once the hold is over on every clock.
                release_at(
                    node.clone(),
                    key.into(),
                    owner.into(),
                    kept_for,
                    self.nodes.node_timeout,
                );
            }
        }
        if answers.iter().any(|a| matches!(a, Ok(Released::Kept))) {
            Ok(Released::Kept)
        } else if answers.iter().all(Result::is_err) {
            Err(self.nodes.no_quorum_of(key, &answers))
        } else {
            Ok(Released::NotOwner)
        }
    }

    async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        let answers = self
            .nodes
            .on_any(key, |_, node| node.force_unlock(key))
            .await?;
        Ok(answers.iter().any(|a| matches!(a, Ok(true))))
    }

    async fn holder_ttl(&self, key: &str) -> Option<Duration> {
        // Until fewer than a majority keep the key: the quorum-th longest TTL.
        let answers = self
            .nodes
            .on_all(Some(key), |_, node| async move {
                Ok::<_, LockError>(node.holder_ttl(key).await)
            })
            .await;
        let mut ttls: Vec<Duration> = answers
            .into_iter()
            .filter_map(|a| a.ok().flatten())
            .collect();
        ttls.sort_unstable_by(|a, b| b.cmp(a));
        ttls.get(self.nodes.quorum.checked_sub(1)?).copied()
    }

    async fn is_locked(&self, key: &str) -> Result<bool, LockError> {
        let answers = self
            .nodes
            .on_all(Some(key), |_, node| node.is_locked(key))
            .await;
        let failed = answers.iter().filter(|a| a.is_err()).count();
        if failed > self.nodes.nodes.len() - self.nodes.quorum {
            return Err(self.nodes.no_quorum_of(key, &answers));
        }
        let locked = answers.iter().filter(|a| matches!(a, Ok(true))).count();
        Ok(locked >= self.nodes.quorum)
    }

    async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let answers = self
            .nodes
            .on_all(Some(key), |_, node| async move {
                Ok(node.holding(key).await?.into_iter().collect::<Vec<_>>())
            })
            .await;
        Ok(inspect::agreed(&self.nodes, Some(key), answers)?
            .into_iter()
            .next())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>, LockError> {
        let answers = self
            .nodes
            .on_all(None, |_, node| node.holdings(prefix))
            .await;
        inspect::agreed(&self.nodes, None, answers)
    }

    async fn watch(&self, key: &str) -> Result<(), LockError> {
        // A notification from any node is a hint; waits stay bounded by the holder's TTL.
        self.nodes.on_any(key, |_, node| node.watch(key)).await?;
        Ok(())
    }

    async fn unwatch(&self, key: &str) -> Result<(), LockError> {
        self.nodes
            .on_all(Some(key), |_, node| node.unwatch(key))
            .await;
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fairness: Fairness::Unsupported,
            shared_modes: false,
            ..Capabilities::DEFAULT
        }
    }

    fn lease_margin(&self, lease: Duration) -> Result<Duration, LockError> {
        let allowance = drift(lease) + self.nodes.node_timeout;
        if lease <= allowance {
            return Err(LockError::config(format!(
                "a lease of {lease:?} is too short for Redlock: the clock-drift allowance ({:?}) plus the per-node timeout ({:?}) leave no validity",
                drift(lease),
                self.nodes.node_timeout
            )));
        }
        Ok(drift(lease))
    }
}

impl EngineConfig for RedlockConfig {
    fn name(&self) -> &'static str {
        "redlock"
    }

    fn set(&mut self, name: &str, value: Setting<'_>) -> Result<bool, LockError> {
        match name {
            "node_timeout" => self.node_timeout = value.positive_duration(name)?,
            "min_validity" => self.min_validity = fraction(name, value)?,
            "quorum" => self.quorum = Some(value.count(name)?),
            "rejoin_after" => self.rejoin_after = Some(value.duration(name)?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn options(&self) -> &'static [&'static str] {
        debug_assert_eq!(&OPTIONS[4..], &CLIENT_OPTIONS);
        &OPTIONS
    }

    fn connect(self: Box<Self>, ctx: Context) -> Connecting {
        Box::pin(async move {
            if self.nodes.len() < 3 {
                return Err(LockError::config(format!(
                    "Redlock needs at least 3 independent Redis masters, got {}",
                    self.nodes.len()
                )));
            }
            for node in &self.nodes {
                check_tls(node)?;
            }
            let tuning = Tuning {
                node_timeout: self.node_timeout,
                min_validity: self.min_validity,
                quorum: self.quorum()?,
                rejoin_after: self.rejoin_after,
            };
            let backend = RedlockBackend::connect(&self.nodes, &ctx, tuning)?;
            Ok(DynBackend::new_arc(backend))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed<T>() -> Option<Result<T, LockError>> {
        Some(Err(LockError::backend(None, "down", None)))
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
