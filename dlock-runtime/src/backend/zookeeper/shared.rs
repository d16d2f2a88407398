//! Read locks and semaphore permits in ZooKeeper's queue of a key. Contenders of every mode
//! create their ephemeral sequential node in the same parent, named `lock-<owner>-<sequence>`
//! where the owner token ends in the mode's tag (`-r` a reader, `-s<N>` a permit, nothing a
//! writer), Curator's read-write lock and semaphore in one queue: a reader holds when no
//! writer node has a lower sequence, a permit when fewer than N nodes do; a writer holds when
//! its node is the lowest (`mod.rs`). Waiting watches the parent's children.

use tokio::time::Instant;

use super::ZooKeeperBackend;
use super::path::sequence;
use crate::backend::Attempt;
use crate::backend::mode::{Mode, permits_mismatch};
use crate::error::LockError;

impl ZooKeeperBackend {
    /// Waits until the node `my_node` (sequence `my_seq`) of a reader or permit under
    /// `parent` holds (`Acquired` with `fence`), or `deadline` (`Busy`, node deleted).
    pub(super) async fn wait_shared(
        &self,
        key: &str,
        owner: &str,
        (parent, my_node, my_seq): (&str, &str, i64),
        fence: Option<u64>,
        deadline: Instant,
        mode: Mode,
    ) -> Result<Attempt, LockError> {
        let client = self.session.client();
        loop {
            let (children, watcher) = self
                .session
                .bounded(
                    Some(key),
                    "queue lookup failed",
                    client.list_and_watch_children(parent),
                )
                .await?;
            let mut earlier = 0usize;
            let mut writer_ahead = false;
            let mut present = false;
            for name in &children {
                let Some(seq) = sequence(name) else { continue };
                let other = Mode::of(name.strip_prefix("lock-").unwrap_or_default());
                if let (Mode::Permits(asked), Mode::Permits(held)) = (mode, other)
                    && asked != held
                {
                    self.leave(key, owner).await;
                    return Err(permits_mismatch(key, asked, held));
                }
                if my_node.ends_with(name.as_str()) {
                    present = true;
                } else if seq < my_seq {
                    earlier += 1;
                    writer_ahead |= other == Mode::Exclusive;
                }
            }
            if !present {
                return Err(LockError::backend(
                    Some(key),
                    "the queue node vanished (session expired?)",
                    None,
                ));
            }
            let holds = match mode {
                Mode::Permits(n) => earlier < n as usize,
                _ => !writer_ahead,
            };
            if holds {
                return Ok(Attempt::Acquired { fence });
            }
            if Instant::now() >= deadline
                || tokio::time::timeout_at(deadline, watcher.changed())
                    .await
                    .is_err()
            {
                self.leave(key, owner).await;
                return Ok(Attempt::Busy { ttl: None });
            }
        }
    }
}
