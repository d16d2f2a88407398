//! Several keys at once (`lock_all`): canonical order, one wait budget for
//! the set, all or nothing, one guard over every key.
//!
//! The keys are sorted and merged, then taken in that order, so two acquisitions of
//! overlapping sets never wait for each other in a cycle. Where the engine can take every key
//! in one atomic step (Redis: one server, or one Cluster hash slot), a first attempt does so;
//! otherwise, or when that attempt finds a key busy and there is time left to wait, each key is
//! an ordinary acquisition (re-entry, waiting, notifications) within what is left of the budget.
//! A failure releases the keys already taken.

use std::sync::Arc;

use tokio::time::Instant;

use super::builder::LockBuilder;
use super::one;
use crate::acquire::attempt::new_owner;
use crate::backend::{AttemptAll, Backend};
use crate::chain::Frame;
use crate::core::{Core, FOREVER};
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::held::{Held, Registry, Terms};
use crate::release::ReleaseOnDrop;

/// Acquires every key of the multi-key lock `lock` in `core`, from the call-chain `frame`
/// (`scope`: the frame a scoped acquisition opens for its body, see `LockBuilder::acquire_in`).
pub(crate) async fn acquire(
    lock: LockBuilder,
    core: &Arc<Core>,
    frame: Option<&Arc<Frame>>,
    scope: Option<u64>,
) -> Result<LockGuard, LockError> {
    let keys = lock.multi().unwrap_or_default().to_vec();
    if keys.is_empty() {
        return Err(LockError::config(
            "lock_all needs at least one key; the set is empty",
        ));
    }
    let mut lease = core.default_lease;
    for key in &keys {
        lease = lock.one(core, key.clone()).checked_lease(core)?;
    }
    let started = Instant::now();
    let wait = lock.wait.unwrap_or(core.default_wait);
    let deadline = started + wait.min(FOREVER);

    // One atomic step for the whole set, when the engine can and nothing of this process is
    // in the way (a hold of the chain to re-enter, local waiters to queue behind).
    let in_chain = |key: &String| frame.is_some_and(|f| f.find(core.id, key).is_some());
    // (The one script takes exclusive locks: read locks and permits go key by key.)
    if keys.len() > 1
        && !lock.fair
        && !lock.mode.is_shared()
        && !keys.iter().any(|k| in_chain(k) || core.hub.has_waiters(k))
    {
        // (Not fair, tracked from the acquisition: the one-step set is neither.)
        let terms = Terms {
            fair: false,
            track_on_wait: false,
            ..lock.terms(lease, frame, scope)
        };
        match Box::pin(at_once(core, &keys, terms, frame, scope, started)).await {
            Err(err) => {
                core.observer.failed(started.elapsed());
                return Err(err);
            }
            Ok(Some(Ok(guard))) => return Ok(guard),
            Ok(Some(Err((index, ttl)))) if wait.is_zero() => {
                let key = keys.get(index).cloned().unwrap_or_default();
                let waited = started.elapsed();
                core.observer.timed_out(&key, waited);
                return Err(LockError::Timeout {
                    key,
                    waited,
                    holder_ttl: ttl,
                });
            }
            // Busy with time to wait, or no atomic step here: key by key.
            Ok(_) => {}
        }
    }

    let mut guards = Vec::with_capacity(keys.len());
    for key in keys {
        let left = deadline.saturating_duration_since(Instant::now());
        // Boxed: one key's acquisition is a large future, polled here below the caller's.
        let one = Box::pin(one::acquire(
            lock.one(core, key).wait(left),
            core,
            frame,
            scope,
        ));
        match one.await {
            Ok(guard) => guards.push(guard),
            Err(err) => {
                // All or nothing: give back what was taken (in the background if this future
                // is dropped meanwhile, by the guards' `Drop`).
                for guard in guards {
                    if let Err(err) = guard.release().await {
                        tracing::debug!(error = %err, "releasing a key of an incomplete set failed");
                    }
                }
                return Err(match err {
                    LockError::Timeout {
                        key, holder_ttl, ..
                    } => LockError::Timeout {
                        key,
                        waited: started.elapsed(),
                        holder_ttl,
                    },
                    err => err,
                });
            }
        }
    }
    LockGuard::over(guards).ok_or_else(|| LockError::config("lock_all needs at least one key"))
}

/// The answer of [`at_once`]: the guard, or the index of a busy key and its holder's TTL.
type AtOnce = Result<LockGuard, (usize, Option<std::time::Duration>)>;

/// One attempt at every key in one atomic step (`None` when the engine cannot for these keys),
/// compensated like a one-key attempt if its answer never arrives.
async fn at_once(
    core: &Arc<Core>,
    keys: &[String],
    terms: Terms,
    frame: Option<&Arc<Frame>>,
    scope: Option<u64>,
    started: Instant,
) -> Result<Option<AtOnce>, LockError> {
    let owner = new_owner(core, &terms);
    if !core.backend.acquires_all_at_once(keys) {
        return Ok(None);
    }
    let request = core.backend.try_acquire_all(keys, &owner, terms.lease);
    let compensate: Vec<_> = keys
        .iter()
        .map(|key| ReleaseOnDrop::compensate(&core.releaser, key, &owner))
        .collect();
    let sent_at = Instant::now();
    let answer = request.await?;
    compensate.into_iter().for_each(ReleaseOnDrop::disarm);
    let fences = match answer {
        AttemptAll::Acquired { fences } => fences,
        AttemptAll::Busy { index, ttl } => return Ok(Some(Err((index, ttl)))),
    };
    // A scoped acquisition's frame is made around the holds by the caller.
    let frame = match scope {
        Some(_) => None,
        None => frame.cloned(),
    };
    let registry = frame.clone().map(|f| f as Arc<dyn Registry>);
    let waited = started.elapsed();
    let mut guards = Vec::with_capacity(keys.len());
    for (key, fence) in keys.iter().zip(fences) {
        let held = Held::new(core, key.clone(), owner.clone(), fence, terms, sent_at);
        if let Some(frame) = &frame {
            frame.push(held.clone());
        }
        if core.observer.timed() {
            core.observer.acquired(key, fence, waited);
        }
        guards.push(LockGuard::first(held, registry.clone()));
    }
    Ok(LockGuard::over(guards).map(Ok))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: std::time::Duration = std::time::Duration::from_millis(1);

    async fn memory() -> crate::runtime::Runtime {
        crate::runtime::Runtime::from_url("memory://")
            .await
            .expect("memory runtime")
    }

    /// `a` is freed 300 ms into a 500 ms wait, `b` never: the set times out naming `b` when
    /// the one budget ends (500 ms), not 500 ms after `a` was taken, and `a` is free again.
    #[tokio::test(start_paused = true)]
    async fn one_wait_budget_covers_the_whole_set() {
        let rt = memory().await;
        let a = rt.lock("a").acquire().await.expect("a");
        let _b = rt.lock("b").acquire().await.expect("b");
        tokio::spawn(async move {
            tokio::time::sleep(300 * MS).await;
            a.release().await.expect("release a");
        });
        let started = Instant::now();
        let err = rt
            .lock_all(["b", "a"])
            .wait(500 * MS)
            .acquire()
            .await
            .expect_err("b stays busy");
        let took = started.elapsed();
        assert!(
            matches!(&err, LockError::Timeout { key, .. } if key == "b"),
            "{err:?}"
        );
        assert!(took >= 500 * MS && took < 550 * MS, "took {took:?}");
        let again = rt.lock("a").acquire().await.expect("a is free again");
        drop(again);
    }

    #[tokio::test]
    async fn an_empty_set_is_invalid_config() {
        let rt = memory().await;
        let err = rt
            .lock_all(Vec::<String>::new())
            .acquire()
            .await
            .expect_err("no keys");
        assert!(err.is_invalid_config(), "{err:?}");
        assert!(err.to_string().contains("at least one key"), "{err}");
        let err = rt
            .lock_all(["ok", ""])
            .acquire()
            .await
            .expect_err("empty key");
        assert!(err.is_invalid_config(), "{err:?}");
    }
}
