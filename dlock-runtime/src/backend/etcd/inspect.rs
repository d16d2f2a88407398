//! etcd's locks as an operator sees them: one range read over the queues
//! (`<prefix><key>/<owner token>`), the holder of each key its lowest create revision (also
//! its fence), its TTL what `LeaseTimeToLive` says of its lease; a read lock or a semaphore
//! shows the earliest of its holders, `holds` counting them all.
//!
//! Keys that are not a queue entry of exactly that key (a tombstone, a key without a lease, a
//! name that is no owner token, an entry of a longer key) are skipped.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use etcd_client::{GetOptions, KeyValue};

use super::client::Etcd;
use crate::backend::mode::{Mode, holding_now};
use crate::error::LockError;
use crate::inspect::LockInfo;
use crate::inspect::is_owner_token;

/// A contender in a queue.
struct Head {
    owner: String,
    revision: i64,
    lease: i64,
}

/// The holders of the queues under `<prefix><start>` (`exact`: only the queue of the key
/// `start`), read at one revision, with their leases' TTLs.
pub(super) async fn holders(
    etcd: &Etcd,
    start: &str,
    exact: bool,
) -> Result<Vec<LockInfo>, LockError> {
    let range = if exact {
        etcd.queue_prefix(start)
    } else {
        format!("{}{start}", etcd.prefix)
    };
    let key = exact.then_some(start);
    let found = etcd
        .bounded(key, "inspection failed", |mut c| {
            let range = range.clone();
            async move { c.get(range, Some(GetOptions::new().with_prefix())).await }
        })
        .await?;
    let mut queues: BTreeMap<String, Vec<Head>> = BTreeMap::new();
    for kv in found.kvs() {
        let Some((user_key, owner)) = entry_of(etcd, kv) else {
            continue;
        };
        if exact && user_key != start {
            continue;
        }
        queues.entry(user_key.to_owned()).or_default().push(Head {
            owner: owner.to_owned(),
            revision: kv.create_revision(),
            lease: kv.lease(),
        });
    }
    let mut ttls: HashMap<i64, Option<Duration>> = HashMap::new();
    let mut out = Vec::with_capacity(queues.len());
    for (user_key, mut queue) in queues {
        queue.sort_by_key(|c| c.revision);
        let modes: Vec<Mode> = queue.iter().map(|c| Mode::of(&c.owner)).collect();
        let holding = &queue[..holding_now(&modes)];
        let Some(head) = holding.first() else {
            continue;
        };
        let mut ttl = None;
        for holder in holding {
            let left = match ttls.get(&holder.lease) {
                Some(left) => *left,
                None => {
                    let left = lease_left(etcd, &user_key, holder.lease).await?;
                    ttls.insert(holder.lease, left);
                    left
                }
            };
            ttl = ttl.max(left);
        }
        // Leases already gone: the server is removing their keys.
        let Some(ttl) = ttl else { continue };
        let mut info = LockInfo::held(
            user_key,
            &head.owner,
            ttl,
            u32::try_from(holding.len()).unwrap_or(u32::MAX),
            u64::try_from(head.revision).ok(),
        );
        info.mode = Mode::of(&head.owner).name().to_owned();
        out.push(info);
    }
    Ok(out)
}

/// The user key and owner token of a queue entry, if `kv` is one.
fn entry_of<'k>(etcd: &Etcd, kv: &'k KeyValue) -> Option<(&'k str, &'k str)> {
    let name = kv.key_str().ok()?.strip_prefix(etcd.prefix.as_str())?;
    let (user_key, owner) = name.rsplit_once('/')?;
    (!user_key.is_empty() && is_owner_token(owner) && kv.lease() != 0).then_some((user_key, owner))
}

/// What is left of `lease` (`None`: expired or revoked).
async fn lease_left(etcd: &Etcd, key: &str, lease: i64) -> Result<Option<Duration>, LockError> {
    let answer = etcd
        .bounded(Some(key), "inspection failed", |mut c| async move {
            c.lease_time_to_live(lease, None).await
        })
        .await?;
    Ok(u64::try_from(answer.ttl())
        .ok()
        .filter(|&secs| secs > 0)
        .map(Duration::from_secs))
}
