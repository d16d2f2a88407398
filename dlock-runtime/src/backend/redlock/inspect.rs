//! Redlock's locks as an operator sees them: every node read at once (as one Redis, see
//! `redis/inspect.rs`), and a key counts as held when at least the quorum of nodes (a
//! majority unless configured higher: what an acquisition needed) show the same owner token.
//! Its TTL is the quorum-th longest among those nodes' (when it runs out, fewer than a quorum
//! of copies are left). No fence: Redlock has none.

use std::collections::BTreeMap;
use std::time::Duration;

use super::nodes::Nodes;
use crate::backend::redis::Holding;
use crate::error::LockError;
use crate::inspect::LockInfo;

/// The locks a quorum of nodes agree on, from each node's `answers`.
pub(super) fn agreed(
    nodes: &Nodes,
    key: Option<&str>,
    answers: Vec<Result<Vec<Holding>, LockError>>,
) -> Result<Vec<LockInfo>, LockError> {
    let failed = answers.iter().filter(|a| a.is_err()).count();
    if failed > nodes.nodes.len() - nodes.quorum {
        let source = answers.iter().find_map(|a| a.as_ref().err()).cloned();
        return Err(LockError::backend(
            key,
            format!(
                "redlock quorum not reached: {} of {} nodes answered the inspection, {} needed",
                answers.len() - failed,
                answers.len(),
                nodes.quorum
            ),
            source.map(|e| std::sync::Arc::new(e) as std::sync::Arc<_>),
        ));
    }
    // (key, owner) -> the TTL each node that shows it has left.
    let mut copies: BTreeMap<(String, String), Vec<Duration>> = BTreeMap::new();
    for held in answers.into_iter().flatten().flatten() {
        copies
            .entry((held.key, held.owner))
            .or_default()
            .push(held.ttl);
    }
    Ok(copies
        .into_iter()
        .filter_map(|((key, owner), mut ttls)| {
            ttls.sort_unstable_by(|a, b| b.cmp(a));
            let ttl = *ttls.get(nodes.quorum.checked_sub(1)?)?;
            // Redlock refuses read locks and semaphores: every hold is exclusive.
            let holding = Holding {
                key,
                owner,
                ttl,
                mode: crate::backend::mode::Mode::Exclusive,
                holds: 1,
            };
            Some(holding.info())
        })
        .collect())
}
