//! ZooKeeper's locks as an operator sees them: the children of a key's node
//! (`/<prefix>/<escaped key>/lock-<owner>-<sequence>`), the lowest sequence holding; its
//! fence the node's `czxid`. A node lives as long as its holder's session, not a lease, so the
//! TTL shown is the session timeout this runtime negotiated: how long the holder's node
//! outlives its session if the holder stopped now (the server does not show the timeout of
//! another client's session; runtimes configured alike get the same).

use zookeeper_client::Error as ZkError;

use super::ZooKeeperBackend;
use super::path::{sequence, unescape};
use crate::inspect::is_owner_token;
use crate::{LockError, LockInfo};

/// Looks at a queue again when its head went between the listing and the read of its node.
const HEAD_LOOKUPS: usize = 3;

/// The owner token in a queue node's name (`lock-<owner>-<sequence>`).
fn owner_of(name: &str) -> Option<&str> {
    let (owner, _) = name.strip_prefix("lock-")?.rsplit_once('-')?;
    is_owner_token(owner).then_some(owner)
}

impl ZooKeeperBackend {
    /// The children of `path`; `None` when it does not exist.
    async fn children(
        &self,
        key: Option<&str>,
        path: &str,
    ) -> Result<Option<Vec<String>>, LockError> {
        let client = self.session.client();
        match self
            .session
            .within(key, "inspection failed", client.list_children(path))
            .await?
        {
            Ok(children) => Ok(Some(children)),
            Err(ZkError::NoNode) => Ok(None),
            Err(e) => Err(self.session.failed(key, "inspection failed", e).await),
        }
    }

    /// The holder of `key`: the lowest sequence among its queue's nodes.
    pub(super) async fn holder(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let parent = self.parent(key);
        for _ in 0..HEAD_LOOKUPS {
            let Some(children) = self.children(Some(key), &parent).await? else {
                return Ok(None);
            };
            let Some((_, head)) = children
                .iter()
                .filter_map(|name| sequence(name).map(|s| (s, name)))
                .min()
            else {
                return Ok(None);
            };
            let Some(owner) = owner_of(head) else {
                // Not a node the runtime made.
                return Ok(None);
            };
            let client = self.session.client();
            let stat = self
                .session
                .bounded(
                    Some(key),
                    "inspection failed",
                    client.check_stat(&format!("{parent}/{head}")),
                )
                .await?;
            if let Some(stat) = stat {
                return Ok(Some(LockInfo::held(
                    key,
                    owner,
                    self.session.negotiated(),
                    1,
                    u64::try_from(stat.czxid).ok(),
                )));
            }
            // Released between the listing and the read: look at the queue again.
        }
        Ok(None)
    }

    /// The holders of every key starting with `prefix`.
    pub(super) async fn holders(&self, prefix: &str) -> Result<Vec<LockInfo>, LockError> {
        let Some(children) = self.children(None, &self.root).await? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for key in children.iter().filter_map(|segment| unescape(segment)) {
            if !key.starts_with(prefix) {
                continue;
            }
            if let Some(info) = self.holder(&key).await? {
                out.push(info);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_come_from_node_names() {
        let token = "0123456789abcdef0123456789abcdef";
        assert_eq!(owner_of(&format!("lock-{token}-0000000042")), Some(token));
        assert_eq!(owner_of("lock-0000000042"), None);
        assert_eq!(owner_of("lock-nothex-0000000042"), None);
    }
}
