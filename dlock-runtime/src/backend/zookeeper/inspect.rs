//! ZooKeeper's locks as an operator sees them: the children of a key's node, the lowest sequence
//! holding, its fence the node's `czxid`; a read lock or a semaphore shows the earliest of its
//! holders, `holds` counting them all.
//!
//! The TTL shown is the session timeout this runtime negotiated (a node lives as long as its
//! holder's session; the server does not show another client's timeout).

use zookeeper_client::Error as ZkError;

use super::path::{parent, sequence, unescape};
use super::session::Session;
use crate::backend::mode::{Mode, holding_now};
use crate::error::LockError;
use crate::inspect::LockInfo;
use crate::inspect::is_owner_token;

/// Looks at a queue again when its head went between the listing and the read of its node.
const HEAD_LOOKUPS: usize = 3;

/// The nodes of a queue that hold now, in order (see `mode::holding_now`), with their modes.
pub(super) fn holding_nodes(children: &[String]) -> Vec<(&str, Mode)> {
    let mut queue: Vec<(i64, &str)> = children
        .iter()
        .filter_map(|name| sequence(name).map(|s| (s, name.as_str())))
        .collect();
    queue.sort_unstable();
    let modes: Vec<Mode> = queue
        .iter()
        .map(|(_, name)| Mode::of(name.strip_prefix("lock-").unwrap_or(name)))
        .collect();
    queue
        .iter()
        .zip(modes.iter())
        .take(holding_now(&modes))
        .map(|((_, name), mode)| (*name, *mode))
        .collect()
}

/// The owner token in a queue node's name (`lock-<owner>-<sequence>`).
fn owner_of(name: &str) -> Option<&str> {
    let (owner, _) = name.strip_prefix("lock-")?.rsplit_once('-')?;
    is_owner_token(owner).then_some(owner)
}

/// The children of `path`; `None` when it does not exist.
async fn children(
    session: &Session,
    key: Option<&str>,
    path: &str,
) -> Result<Option<Vec<String>>, LockError> {
    let client = session.client();
    match session
        .within(key, "inspection failed", client.list_children(path))
        .await?
    {
        Ok(children) => Ok(Some(children)),
        Err(ZkError::NoNode) => Ok(None),
        Err(e) => Err(session.failed(key, "inspection failed", e).await),
    }
}

/// The holder of `key`: the lowest sequence among its queue's nodes.
pub(super) async fn holder(
    session: &Session,
    root: &str,
    key: &str,
) -> Result<Option<LockInfo>, LockError> {
    let parent = parent(root, key);
    for _ in 0..HEAD_LOOKUPS {
        let Some(children) = children(session, Some(key), &parent).await? else {
            return Ok(None);
        };
        let holding = holding_nodes(&children);
        let Some(&(head, mode)) = holding.first() else {
            return Ok(None);
        };
        let Some(owner) = owner_of(head) else {
            // Not a node the runtime made.
            return Ok(None);
        };
        let client = session.client();
        let stat = session
            .bounded(
                Some(key),
                "inspection failed",
                client.check_stat(&format!("{parent}/{head}")),
            )
            .await?;
        if let Some(stat) = stat {
            let mut info = LockInfo::held(
                key,
                owner,
                session.negotiated(),
                u32::try_from(holding.len()).unwrap_or(u32::MAX),
                u64::try_from(stat.czxid).ok(),
            );
            info.mode = mode.name().to_owned();
            return Ok(Some(info));
        }
        // Released between the listing and the read: look at the queue again.
    }
    Ok(None)
}

/// The holders of every key starting with `prefix`.
pub(super) async fn holders(
    session: &Session,
    root: &str,
    prefix: &str,
) -> Result<Vec<LockInfo>, LockError> {
    let Some(children) = children(session, None, root).await? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for key in children.iter().filter_map(|segment| unescape(segment)) {
        if !key.starts_with(prefix) {
            continue;
        }
        if let Some(info) = holder(session, root, &key).await? {
            out.push(info);
        }
    }
    Ok(out)
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
        assert_eq!(
            owner_of(&format!("lock-{token}-r-0000000042")),
            Some(format!("{token}-r").as_str())
        );
    }

    #[test]
    fn the_holding_nodes_are_the_front_of_the_queue_by_mode() {
        let token = "0123456789abcdef0123456789abcdef";
        let children: Vec<String> = ["r-0000000003", "r-0000000001", "0000000002", "r-0000000004"]
            .iter()
            .map(|tail| format!("lock-{token}-{tail}"))
            .collect();
        let holding = holding_nodes(&children);
        assert_eq!(holding.len(), 1, "{holding:?}");
        assert_eq!(holding[0].1, Mode::Read);
        assert!(holding[0].0.ends_with("-0000000001"));
    }
}
