//! etcd's locks as an operator sees them: one range read over the queues
//! (`<prefix><key>/<owner token>`), the holder of each key its lowest create revision (which
//! is also its fencing token), its TTL what `LeaseTimeToLive` says of its lease (whole
//! seconds; one call per lease, and renewed locks of one runtime share one).
//!
//! Keys that are not a queue entry (an owner tombstone `<prefix>/<owner>`, a key without a
//! lease, a name whose last segment is not an owner token) are skipped; so is a queue entry of
//! a longer key (`a/b/<owner>` is in the queue of `a/b`, not of `a`).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use etcd_client::{GetOptions, KeyValue};

use super::EtcdBackend;
use crate::inspect::is_owner_token;
use crate::{LockError, LockInfo};

/// A queue's head: the contender with the lowest create revision.
struct Head {
    owner: String,
    revision: i64,
    lease: i64,
}

impl EtcdBackend {
    /// The holders of the queues under `<prefix><start>` (`exact`: only the queue of the key
    /// `start`), read at one revision, with their leases' TTLs.
    pub(super) async fn holders(
        &self,
        start: &str,
        exact: bool,
    ) -> Result<Vec<LockInfo>, LockError> {
        let range = if exact {
            self.queue_prefix(start)
        } else {
            format!("{}{start}", self.prefix)
        };
        let key = exact.then_some(start);
        let found = self
            .bounded(key, "inspection failed", |mut c| {
                let range = range.clone();
                async move { c.get(range, Some(GetOptions::new().with_prefix())).await }
            })
            .await?;
        let mut heads: BTreeMap<String, Head> = BTreeMap::new();
        for kv in found.kvs() {
            let Some((user_key, owner)) = self.entry_of(kv) else {
                continue;
            };
            if exact && user_key != start {
                continue;
            }
            let head = Head {
                owner: owner.to_owned(),
                revision: kv.create_revision(),
                lease: kv.lease(),
            };
            match heads.get(user_key) {
                Some(first) if first.revision <= head.revision => {}
                _ => {
                    heads.insert(user_key.to_owned(), head);
                }
            }
        }
        let mut ttls: HashMap<i64, Option<Duration>> = HashMap::new();
        let mut out = Vec::with_capacity(heads.len());
        for (user_key, head) in heads {
            let ttl = match ttls.get(&head.lease) {
                Some(ttl) => *ttl,
                None => {
                    let ttl = self.lease_left(&user_key, head.lease).await?;
                    ttls.insert(head.lease, ttl);
                    ttl
                }
            };
            // A lease already gone: the server is removing its keys.
            let Some(ttl) = ttl else { continue };
            out.push(LockInfo::held(
                user_key,
                &head.owner,
                ttl,
                1,
                u64::try_from(head.revision).ok(),
            ));
        }
        Ok(out)
    }

    /// The user key and owner token of a queue entry, if `kv` is one.
    fn entry_of<'k>(&self, kv: &'k KeyValue) -> Option<(&'k str, &'k str)> {
        let name = kv.key_str().ok()?.strip_prefix(self.prefix.as_str())?;
        let (user_key, owner) = name.rsplit_once('/')?;
        (!user_key.is_empty() && is_owner_token(owner) && kv.lease() != 0)
            .then_some((user_key, owner))
    }

    /// What is left of `lease` (`None`: expired or revoked).
    async fn lease_left(&self, key: &str, lease: i64) -> Result<Option<Duration>, LockError> {
        let answer = self
            .bounded(Some(key), "inspection failed", |mut c| async move {
                c.lease_time_to_live(lease, None).await
            })
            .await?;
        Ok(u64::try_from(answer.ttl())
            .ok()
            .filter(|&secs| secs > 0)
            .map(Duration::from_secs))
    }
}
