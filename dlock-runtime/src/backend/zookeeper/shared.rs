//! Read locks and semaphore permits in ZooKeeper's queue of a key. Contenders of every mode
//! create their ephemeral sequential node in the same parent, named `lock-<owner>-<sequence>`
//! where the owner token ends in the mode's tag (`-r` a reader, `-s<N>` a permit, nothing a
//! writer), Curator's read-write lock and semaphore in one queue: a reader holds when no
//! writer node has a lower sequence, a permit when fewer than N nodes do; a writer holds when
//! its node is the lowest (`queue.rs`). Waiting watches the parent's children.

use tokio::time::Instant;

use super::path::sequence;
use super::session::Session;
use crate::backend::mode::{Mode, Position, shared_holds};
use crate::error::LockError;

/// How a reader's or a permit's wait ended.
pub(super) enum Waited {
    /// Its node holds.
    Holds,
    /// The deadline passed: the caller leaves the queue.
    GaveUp,
    /// A holder of the semaphore asked for another number of permits: the caller leaves the
    /// queue and answers this.
    Refused(LockError),
}

/// Waits until the node `my_node` (sequence `my_seq`) of a reader or permit under `parent`
/// holds, or `deadline`.
pub(super) async fn wait(
    session: &Session,
    key: &str,
    (parent, my_node, my_seq): (&str, &str, i64),
    deadline: Instant,
    mode: Mode,
) -> Result<Waited, LockError> {
    let client = session.client();
    loop {
        let (children, watcher) = session
            .bounded(
                Some(key),
                "queue lookup failed",
                client.list_and_watch_children(parent),
            )
            .await?;
        let entries = children.iter().filter_map(|name| {
            let seq = sequence(name)?;
            let other = Mode::of(name.strip_prefix("lock-").unwrap_or_default());
            let position = if my_node.ends_with(name.as_str()) {
                Position::Mine
            } else if seq < my_seq {
                Position::Ahead
            } else {
                Position::Behind
            };
            Some((other, position))
        });
        match shared_holds(key, mode, entries) {
            Err(refused) => return Ok(Waited::Refused(refused)),
            Ok(None) => {
                return Err(LockError::backend(
                    Some(key),
                    "the queue node vanished (session expired?)",
                    None,
                ));
            }
            Ok(Some(true)) => return Ok(Waited::Holds),
            Ok(Some(false)) => {}
        }
        if Instant::now() >= deadline
            || tokio::time::timeout_at(deadline, watcher.changed())
                .await
                .is_err()
        {
            return Ok(Waited::GaveUp);
        }
    }
}
