//! Locks as an operator sees them (`inspect`, `list`): the lock strings under the prefix,
//! found with `SCAN … MATCH` (never `KEYS`; on Cluster on every master), read with
//! `lua/inspect.lua` (value and `PTTL` at one instant).
//!
//! A holder is a value that is an owner token, `+` appended or not (see `names.rs`). A
//! reservation after a flagged release (`~<runtime id>`) is nobody's hold, and a key of
//! another type or with a value the runtime did not write is skipped, not an error. No fence is
//! shown: the counter holds the last token of the latest reserved block, spent also by
//! attempts that found the key busy, and the holder may be one the lock was handed to within
//! its runtime, so the holder's own token cannot be told from it.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::Value;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};

use super::RedisBackend;
use super::hash_slot;
use super::link::Link;
use crate::inspect::is_owner_token;
use crate::{LockError, LockInfo};

/// Keys one `SCAN` call looks at (a hint to the server).
const SCAN_COUNT: u32 = 1000;

/// Locks one read of `lua/inspect.lua` covers on a single server.
const READ_BATCH: usize = 256;

/// One lock held now, with its whole owner token (Redlock compares the nodes' holders).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holding {
    pub(crate) key: String,
    pub(crate) owner: String,
    pub(crate) ttl: Duration,
}

impl Holding {
    /// As an operator sees it: the owner redacted, one hold, no fence (see the module docs).
    pub(crate) fn info(&self) -> LockInfo {
        LockInfo::held(self.key.clone(), &self.owner, self.ttl, 1, None)
    }
}

/// The holder a lock's `value` and `pttl` show, if any.
fn holder(key: &str, value: &str, pttl: i64) -> Option<Holding> {
    let owner = value.strip_suffix('+').unwrap_or(value);
    if !is_owner_token(owner) || pttl <= 0 {
        // A reservation (`~…`), a foreign value, or no expiry: the runtime writes none of
        // these as a hold.
        return None;
    }
    let ttl = Duration::from_millis(u64::try_from(pttl).ok()?);
    Some(Holding {
        key: key.to_owned(),
        owner: owner.to_owned(),
        ttl,
    })
}

impl RedisBackend {
    /// The holder of `key` now, if any.
    pub(crate) async fn holding(&self, key: &str) -> Result<Option<Holding>, LockError> {
        Ok(self
            .read_locks(Some(key), &[key.to_owned()])
            .await?
            .into_iter()
            .next())
    }

    /// Every lock held now whose key starts with `prefix` (any order).
    pub(crate) async fn holdings(&self, prefix: &str) -> Result<Vec<Holding>, LockError> {
        let pattern = self.names.lock_pattern(prefix);
        let keys = match &self.link {
            Link::Single(_) => self.scan(&pattern, None).await?,
            Link::Cluster(_) => {
                let mut keys = Vec::new();
                for slot in self.master_slots().await? {
                    keys.extend(self.scan(&pattern, Some(slot)).await?);
                }
                keys
            }
        };
        let keys: Vec<String> = keys.into_iter().filter(|k| k.starts_with(prefix)).collect();
        let mut found = Vec::with_capacity(keys.len());
        match &self.link {
            Link::Single(_) => {
                for batch in keys.chunks(READ_BATCH) {
                    found.extend(self.read_locks(None, batch).await?);
                }
            }
            Link::Cluster(_) => {
                // One script's keys must share a hash slot.
                let mut by_slot: BTreeMap<u16, Vec<String>> = BTreeMap::new();
                for key in keys {
                    let slot = hash_slot(self.names.lock(&key).as_bytes());
                    by_slot.entry(slot).or_default().push(key);
                }
                for batch in by_slot.values() {
                    found.extend(self.read_locks(None, batch).await?);
                }
            }
        }
        Ok(found)
    }

    /// Reads the locks of `keys` (one hash slot on Cluster) with `lua/inspect.lua`.
    async fn read_locks(
        &self,
        key: Option<&str>,
        keys: &[String],
    ) -> Result<Vec<Holding>, LockError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let (values, ttls): (Vec<Vec<u8>>, Vec<i64>) = self
            .run_script(&self.scripts.inspect, key, "inspection failed", |cmd| {
                cmd.arg(keys.len());
                for k in keys {
                    cmd.arg(self.names.lock(k));
                }
            })
            .await?;
        Ok(keys
            .iter()
            .zip(values.iter().zip(&ttls))
            .filter_map(|(k, (value, &pttl))| {
                let value = std::str::from_utf8(value).ok()?;
                holder(k, value, pttl)
            })
            .collect())
    }

    /// The user keys of the lock names matching `pattern`, on this server or, on Cluster, on
    /// the master serving `slot`: `SCAN` until the cursor comes back to 0.
    async fn scan(&self, pattern: &str, slot: Option<u16>) -> Result<Vec<String>, LockError> {
        let mut keys = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT)
                .arg("TYPE")
                .arg("string");
            let (next, names): (u64, Vec<Vec<u8>>) = match (&self.link, slot) {
                (Link::Cluster(link), Some(slot)) => {
                    let mut conn = link.conn();
                    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                        Route::new(slot, SlotAddr::Master),
                    ));
                    // A server error comes back as a value here: made an error again, so
                    // that an ACL refusal is explained like any other.
                    let reply: Value = self
                        .call(None, "lock scan failed", async {
                            conn.route_command(cmd, route).await?.extract_error()
                        })
                        .await?;
                    redis::from_redis_value(reply).map_err(|e| {
                        LockError::backend(None, format!("lock scan failed: {e}"), None)
                    })?
                }
                _ => {
                    let mut conn = self.link.handle();
                    self.call(None, "lock scan failed", cmd.query_async(&mut conn))
                        .await?
                }
            };
            keys.extend(
                names
                    .iter()
                    .filter_map(|name| std::str::from_utf8(name).ok())
                    .filter_map(|name| self.names.key_of_lock(name)),
            );
            if next == 0 {
                return Ok(keys);
            }
            cursor = next;
        }
    }

    /// One slot of each master of the cluster (`CLUSTER SLOTS`: the first slot of each range,
    /// one range per master address).
    async fn master_slots(&self) -> Result<Vec<u16>, LockError> {
        let mut conn = self.link.handle();
        let cmd = redis::cmd("CLUSTER").arg("SLOTS").clone();
        let reply: Value = self
            .call(
                None,
                "cluster topology query failed",
                cmd.query_async(&mut conn),
            )
            .await?;
        let Value::Array(ranges) = reply else {
            return Err(LockError::backend(
                None,
                "cluster topology query failed: CLUSTER SLOTS answered no array",
                None,
            ));
        };
        let mut masters: BTreeMap<String, u16> = BTreeMap::new();
        for range in ranges {
            let Value::Array(fields) = range else {
                continue;
            };
            let start = match fields.first() {
                Some(Value::Int(start)) => u16::try_from(*start).ok(),
                _ => None,
            };
            let address = match fields.get(2) {
                Some(Value::Array(node)) => address_of(node),
                _ => None,
            };
            if let (Some(start), Some(address)) = (start, address) {
                masters.entry(address).or_insert(start);
            }
        }
        Ok(masters.into_values().collect())
    }
}

/// `host:port` of a node entry of `CLUSTER SLOTS` (`[host, port, id, …]`).
fn address_of(node: &[Value]) -> Option<String> {
    let host = match node.first()? {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(text) => text.clone(),
        _ => return None,
    };
    let Value::Int(port) = node.get(1)? else {
        return None;
    };
    Some(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn holders_are_owner_tokens_with_a_ttl() {
        let held = holder("k", TOKEN, 1500).expect("a holder");
        assert_eq!(held.owner, TOKEN);
        assert_eq!(held.ttl, Duration::from_millis(1500));
        assert_eq!(
            holder("k", &format!("{TOKEN}+"), 10).map(|h| h.owner),
            Some(TOKEN.to_owned())
        );
        assert_eq!(holder("k", "~0123456789abcdef", 40), None, "a reservation");
        assert_eq!(
            holder("k", "~0123456789abcdef+", 40),
            None,
            "a flagged reservation"
        );
        assert_eq!(holder("k", "hello", 1000), None, "a foreign value");
        assert_eq!(holder("k", "", -2), None, "missing");
        assert_eq!(holder("k", TOKEN, -1), None, "no expiry");
        let info = held.info();
        assert_eq!(info.owner, "01234567…");
        assert_eq!((info.holds, info.fence), (1, None));
    }
}
