//! One Redlock acquisition: an attempt on every node, counted against the quorum as the
//! answers come, won when the quorum granted within the validity (`lease - elapsed - drift`,
//! at least `min_validity` of the lease), else undone on every node that may have granted.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::fanout::Answer;
use super::nodes::Nodes;
use crate::backend::redis::place_now;
use crate::backend::{Attempt, Backend, EngineResult};

/// Redlock's clock-drift allowance: 1 % of the lease plus 2 ms.
pub(super) fn drift(lease: Duration) -> Duration {
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

/// What one acquisition asks of the nodes.
pub(super) struct Ask {
    pub(super) lease: Duration,
    /// A waiter's attempt: each node is asked to notify it of the release.
    pub(super) waiting: bool,
    /// When the attempt started (the validity counts from then).
    pub(super) started: Instant,
    /// How long after a restart a node's grants count again; `None`: restarts not checked.
    pub(super) rejoin_after: Option<Duration>,
    /// Fraction of the lease that must still be valid when the quorum has granted it.
    pub(super) min_validity: f64,
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
pub(super) async fn acquire(
    nodes: &Nodes,
    key: &str,
    owner: &str,
    ask: Ask,
) -> EngineResult<Attempt> {
    let Ask {
        lease,
        waiting,
        started,
        rejoin_after,
        min_validity,
    } = ask;
    // One place in every node's line of runtimes, so that they serve them alike.
    let place = place_now();
    let (key, owner): (Arc<str>, Arc<str>) = (key.into(), owner.into());
    let mut fan = nodes.each_node(Some(&key), |i, node| {
        let identity = nodes.identities[i].clone();
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
        tally = count(nodes, answers, rejoin_after, Instant::now());
        tally.settled(nodes.quorum)
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
    let valid = validity > Duration::ZERO && validity >= lease.mul_f64(min_validity);
    if tally.granted >= nodes.quorum && valid {
        // Late answers: a grant is part of the hold, a failure was suspected.
        fan.rest(|_, _| {}).spawn();
        return Ok(Attempt::Acquired { fence: None });
    }
    let answer = lost(nodes, &key, fan.answers(), tally);
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
        background.start(nodes.undo(node, &key, &owner));
    }
    background.spawn();
    answer
}

/// Counts the acquire answers so far at `now` (a grant counts unless its node restarted
/// within `rejoin_after`, or has not been checked since it reconnected: it may have
/// forgotten another owner's lock).
fn count(
    nodes: &Nodes,
    answers: &[Answer<Attempt>],
    rejoin_after: Option<Duration>,
    now: Instant,
) -> Tally {
    let mut tally = Tally::default();
    for (answer, identity) in answers.iter().zip(&nodes.identities) {
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

/// The answer of an attempt that did not win: no quorum possible (too many nodes failed),
/// or busy, with how long to wait before the next attempt.
fn lost(
    nodes: &Nodes,
    key: &str,
    answers: &[Answer<Attempt>],
    tally: Tally,
) -> EngineResult<Attempt> {
    if tally.failed > nodes.nodes.len() - nodes.quorum {
        let answered = answers.iter().filter(|a| matches!(a, Some(Ok(_)))).count();
        let first_error = answers.iter().find_map(|a| a.as_ref()?.as_ref().err());
        return Err(nodes.no_quorum(key, answered, first_error));
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
    let blocking = nodes.nodes.len() - nodes.quorum + 1;
    let ttl = if busy_ttls.len() >= blocking {
        // Another owner holds enough nodes to keep us from a quorum: wait for its release
        // (notification) or for its lease to run out on enough of them.
        busy_ttls[busy_ttls.len() - blocking]
    } else if let Some(rejoins_in) = tally
        .rejoins_in
        .filter(|_| tally.granted + tally.uncounted >= nodes.quorum)
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
}
