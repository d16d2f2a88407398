//! Read locks and semaphore permits in etcd's queue of a key. Contenders of every mode join
//! the same queue (`<prefix><key>/<owner>`, on a lease as a lock's, the owner token telling
//! the mode); the order by create revision decides: a reader holds when no writer (exclusive)
//! key has a lower revision, a permit when fewer than N keys do. A writer holds when it has
//! the lowest revision (`queue.rs`), so a waiting writer is never overtaken by later readers.
//! Waiting watches the queue's deletions.

use std::time::Duration;

use etcd_client::{EventType, WatchOptions};
use tokio::time::Instant;

use super::client::ttl_seconds;
use super::lease;
use super::queue::{Queue, acquired, confirmed_at};
use crate::backend::io_thread::AbortOnDrop;
use crate::backend::mode::{Mode, Position, shared_holds};
use crate::backend::{Attempt, Queued, Queueing};
use crate::error::LockError;

/// Queues a reader or a permit in `key` until it holds (`Acquired`) or the deadline
/// (`Busy`, having left).
pub(super) async fn queue(
    queue: &Queue,
    key: &str,
    owner: &str,
    ask: Queueing,
    mode: Mode,
) -> Result<Queued, LockError> {
    let contender_key = queue.etcd.contender_key(key, owner);
    let (lease_id, shared, granted_at) = queue.contender_lease(key, ask).await?;
    queue.record(owner, &contender_key, lease_id, shared.clone());
    let contender = contender_key.as_str();
    let (my_revision, _) = queue
        .etcd
        .bounded(Some(key), "queueing failed", |_| async move {
            queue.join(key, contender, owner, lease_id).await
        })
        .await?;
    if my_revision == 0 {
        return Err(LockError::backend(
            Some(key),
            "acquisition already released (its owner token is buried)",
            None,
        ));
    }
    let mut keeper: Option<AbortOnDrop<()>> = None;
    let mut waited = false;
    loop {
        let entries = queue.etcd.read_in_line(key, "queue lookup failed").await?;
        let positions = entries.kvs().iter().map(|kv| {
            let other = Mode::of(kv.value_str().unwrap_or_default());
            let position = if kv.key() == contender.as_bytes() {
                Position::Mine
            } else if kv.create_revision() < my_revision {
                Position::Ahead
            } else {
                Position::Behind
            };
            (other, position)
        });
        let holds = match shared_holds(key, mode, positions) {
            Err(refused) => {
                queue.leave(owner).await;
                return Err(refused);
            }
            Ok(None) => {
                return Err(LockError::backend(
                    Some(key),
                    "the key was deleted while queued",
                    None,
                ));
            }
            Ok(Some(holds)) => holds,
        };
        if holds {
            if !waited {
                return Ok(acquired(my_revision, confirmed_at(&shared, granted_at)));
            }
            return queue
                .confirm_first(key, contender, lease_id, &shared, my_revision)
                .await;
        }
        if Instant::now() >= ask.deadline {
            queue.leave(owner).await;
            return Ok(Queued::kept_alive(Attempt::Busy { ttl: None }));
        }
        waited = true;
        if keeper.is_none() && shared.is_none() {
            let ttl = Duration::from_secs(u64::try_from(ttl_seconds(ask.lease)).unwrap_or(1));
            keeper = Some(AbortOnDrop(lease::keep_alive_while_queued(
                &queue.etcd.client,
                lease_id,
                ttl,
            )));
        }
        // Any key of the queue deleted may let this one hold: look again then.
        let from = entries.header().map_or(0, |h| h.revision()) + 1;
        let prefix = queue.etcd.queue_prefix(key);
        let prefix = prefix.as_str();
        let mut watch = queue
            .etcd
            .bounded(Some(key), "watch failed", |mut c| async move {
                c.watch(
                    prefix,
                    Some(WatchOptions::new().with_prefix().with_start_revision(from)),
                )
                .await
            })
            .await?;
        let deleted = async {
            while let Ok(Some(resp)) = watch.message().await {
                if resp.canceled()
                    || resp
                        .events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete)
                {
                    return;
                }
            }
        };
        if tokio::time::timeout_at(ask.deadline, deleted)
            .await
            .is_err()
        {
            queue.leave(owner).await;
            return Ok(Queued::kept_alive(Attempt::Busy { ttl: None }));
        }
    }
}
