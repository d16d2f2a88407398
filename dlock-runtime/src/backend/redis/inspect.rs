//! Locks as an operator sees them (`inspect`, `list`): the lock strings and semaphores' permits
//! under the prefix, found with `SCAN … MATCH` (on Cluster on every master), read with
//! `lua/inspect.lua` at one instant.
//!
//! A holder is a value that is an owner token (`+` appended or not); a read lock or a semaphore
//! shows the holder whose lease ends last, `holds` counting every live holder. Reservations and
//! foreign values are skipped. No fence is shown (the counter cannot tell the holder's own).

use std::collections::BTreeMap;
use std::time::Duration;

use redis::Value;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};

use super::client::Client;
use super::link::Link;
use super::names::hash_slot;
use crate::backend::mode::Mode;
use crate::error::LockError;
use crate::inspect::LockInfo;
use crate::inspect::is_owner_token;

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
    /// Exclusive, or a read lock's or a semaphore's (`owner` one of its holders).
    pub(crate) mode: Mode,
    /// 1, or the live readers or permit holders.
    pub(crate) holds: u32,
}

impl Holding {
    /// As an operator sees it: the owner redacted, no fence (see the module docs).
    pub(crate) fn info(&self) -> LockInfo {
        let mut info = LockInfo::held(self.key.clone(), &self.owner, self.ttl, self.holds, None);
        info.mode = self.mode.name().to_owned();
        info
    }
}

/// One row of `lua/inspect.lua`: the lock's value and PTTL, then count, last owner and its ms
/// left of the readers, and of the permits.
type Row = (Vec<u8>, i64, i64, Vec<u8>, i64, i64, Vec<u8>, i64);

/// The holders a row of `lua/inspect.lua` shows, if any: the shared holders (readers,
/// permits) where there are live ones, else the lock string's holder.
fn holder_of_row(key: &str, row: &Row) -> Option<Holding> {
    let (value, pttl, readers, reader, reader_ms, permits, permit, permit_ms) = row;
    let shared = [
        (Mode::Read, *readers, reader, *reader_ms),
        (Mode::Permits(0), *permits, permit, *permit_ms),
    ];
    for (mode, count, owner, ms) in shared {
        let Some(owner) = std::str::from_utf8(owner)
            .ok()
            .filter(|o| is_owner_token(o))
        else {
            continue;
        };
        if count > 0 && ms > 0 {
            return Some(Holding {
                key: key.to_owned(),
                owner: owner.to_owned(),
                ttl: Duration::from_millis(u64::try_from(ms).ok()?),
                mode,
                holds: u32::try_from(count).unwrap_or(u32::MAX),
            });
        }
    }
    holder(key, std::str::from_utf8(value).ok()?, *pttl)
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
        mode: Mode::Exclusive,
        holds: 1,
    })
}

/// The holder of `key` now, if any.
pub(super) async fn holding(client: &Client, key: &str) -> Result<Option<Holding>, LockError> {
    Ok(read_locks(client, Some(key), &[key.to_owned()])
        .await?
        .into_iter()
        .next())
}

/// Every lock held now whose key starts with `prefix` (any order).
pub(super) async fn holdings(client: &Client, prefix: &str) -> Result<Vec<Holding>, LockError> {
    let pattern = client.names.lock_pattern(prefix);
    let keys = match &client.link {
        Link::Single(..) => scan(client, &pattern, None).await?,
        Link::Cluster(_) => {
            let mut keys = Vec::new();
            for slot in master_slots(client).await? {
                keys.extend(scan(client, &pattern, Some(slot)).await?);
            }
            keys
        }
    };
    // A key with readers has both its lock string and `:readers`; one with permits only
    // `:permits`: each key once.
    let keys: std::collections::BTreeSet<String> =
        keys.into_iter().filter(|k| k.starts_with(prefix)).collect();
    let keys: Vec<String> = keys.into_iter().collect();
    let mut found = Vec::with_capacity(keys.len());
    match &client.link {
        Link::Single(..) => {
            for batch in keys.chunks(READ_BATCH) {
                found.extend(read_locks(client, None, batch).await?);
            }
        }
        Link::Cluster(_) => {
            // One script's keys must share a hash slot.
            let mut by_slot: BTreeMap<u16, Vec<String>> = BTreeMap::new();
            for key in keys {
                let slot = hash_slot(client.names.lock(&key).as_bytes());
                by_slot.entry(slot).or_default().push(key);
            }
            for batch in by_slot.values() {
                found.extend(read_locks(client, None, batch).await?);
            }
        }
    }
    Ok(found)
}

/// Reads the locks of `keys` (one hash slot on Cluster) with `lua/inspect.lua`.
async fn read_locks(
    client: &Client,
    key: Option<&str>,
    keys: &[String],
) -> Result<Vec<Holding>, LockError> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<Row> = client
        .run_script(&client.scripts.inspect, key, "inspection failed", |cmd| {
            cmd.arg(keys.len() * 3);
            for k in keys {
                cmd.arg(client.names.lock(k))
                    .arg(client.names.readers(k))
                    .arg(client.names.permits(k));
            }
        })
        .await?;
    Ok(keys
        .iter()
        .zip(&rows)
        .filter_map(|(k, row)| holder_of_row(k, row))
        .collect())
}

/// The user keys of the lock names matching `pattern`, on this server or, on Cluster, on
/// the master serving `slot`: `SCAN` until the cursor comes back to 0.
async fn scan(client: &Client, pattern: &str, slot: Option<u16>) -> Result<Vec<String>, LockError> {
    let mut keys = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT);
        let (next, names): (u64, Vec<Vec<u8>>) = match (&client.link, slot) {
            (Link::Cluster(link), Some(slot)) => {
                let mut conn = link.conn();
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                    Route::new(slot, SlotAddr::Master),
                ));
                // A server error comes back as a value here: made an error again, so
                // that an ACL refusal is explained like any other.
                let reply: Value = client
                    .call(None, "lock scan failed", async {
                        conn.route_command(cmd, route).await?.extract_error()
                    })
                    .await?;
                redis::from_redis_value(reply)
                    .map_err(|e| LockError::backend(None, format!("lock scan failed: {e}"), None))?
            }
            _ => {
                let mut conn = client.handle();
                client
                    .call(None, "lock scan failed", cmd.query_async(&mut conn))
                    .await?
            }
        };
        keys.extend(
            names
                .iter()
                .filter_map(|name| std::str::from_utf8(name).ok())
                .filter_map(|name| {
                    client
                        .names
                        .key_of_lock(name)
                        .or_else(|| client.names.key_of_permits(name))
                }),
        );
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// One slot of each master of the cluster (`CLUSTER SLOTS`: the first slot of each range,
/// one range per master address).
async fn master_slots(client: &Client) -> Result<Vec<u16>, LockError> {
    let mut conn = client.handle();
    let cmd = redis::cmd("CLUSTER").arg("SLOTS").clone();
    let reply: Value = client
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
            holder("k", ">0123456789abcdef", 40),
            None,
            "a reservation for one runtime"
        );
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

    #[test]
    fn live_readers_or_permits_are_the_holders_of_a_row() {
        let reader = format!("{TOKEN}-r").into_bytes();
        let row: Row = (b"=0".to_vec(), 900, 3, reader, 900, 0, Vec::new(), 0);
        let held = holder_of_row("k", &row).expect("readers");
        assert_eq!((held.mode, held.holds), (Mode::Read, 3));
        assert_eq!(held.ttl, Duration::from_millis(900));
        assert_eq!(held.info().mode, "read");
        let permit = format!("{TOKEN}-s2").into_bytes();
        let row: Row = (Vec::new(), -2, 0, Vec::new(), 0, 2, permit, 400);
        let held = holder_of_row("k", &row).expect("permits");
        assert_eq!((held.info().mode.as_str(), held.holds), ("semaphore", 2));
        let row: Row = (b"=0".to_vec(), 900, 0, Vec::new(), 0, 0, Vec::new(), 0);
        assert_eq!(
            holder_of_row("k", &row),
            None,
            "a mark without live readers"
        );
    }
}
