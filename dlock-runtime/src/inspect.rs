//! What an operator sees of a lock: [`LockInfo`], made by every engine from its own layout
//! (`backend/<engine>/inspect.rs`), with the owner token redacted.

use std::time::Duration;

/// How many leading characters of an owner token [`LockInfo::owner`] shows.
const OWNER_SHOWN: usize = 8;

/// The mode of a plain lock or a write lock.
pub(crate) const EXCLUSIVE: &str = "exclusive";

/// A lock held now, as the engine shows it ([`Runtime::inspect`](crate::Runtime::inspect),
/// [`Runtime::list`](crate::Runtime::list)): a snapshot for operators and monitoring, stale as
/// soon as it is read. Never decide to enter a critical section on it.
///
/// | engine | `ttl` | `holds` | `fence` |
/// |---|---|---|---|
/// | memory | the lease left | the entry's hold count | the holder's token |
/// | Redis, Cluster | `PTTL` of the lock | 1 (none stored) | `None`: the counter is ahead of the holder's token (blocks of 64, spent by busy attempts) |
/// | Redlock | the quorum-th longest `PTTL` among the nodes that agree | 1 | `None` (Redlock has no fences) |
/// | etcd | the holder's lease, `LeaseTimeToLive` (whole seconds) | 1 | the holder key's create revision |
/// | ZooKeeper | the session timeout this runtime negotiated: how long the holder's node outlives its session if the holder stops now (the server does not show another session's) | 1 | the holder node's `czxid` |
///
/// Reentrant holds are counted by the runtime that holds the lock, not in the engine: an
/// engine stores one hold per acquisition, so `holds` is 1 for an exclusive lock on every
/// engine the runtime drives.
///
/// A read lock or a semaphore (`mode` `"read"` or `"semaphore"`) is one entry per key:
/// `holds` counts its live holders (readers, permit holders) and `owner` is one of them:
///
/// | engine | `owner` | `ttl` | `fence` |
/// |---|---|---|---|
/// | memory | the holder with the lowest fence | until the last holder's lease ends | that holder's token |
/// | Redis, Cluster | the holder whose lease ends last (sorted sets `:readers`, `:permits`) | its lease left: until the last holder's lease ends | `None` |
/// | etcd | the earliest holder in the key's queue (lowest create revision) | the longest lease left among the holders | that holder's create revision |
/// | ZooKeeper | the earliest holder in the key's queue (lowest sequence) | the session timeout, as for a lock | that holder's node's `czxid` |
///
/// On etcd and ZooKeeper the holders are the front of the key's queue (the readers before
/// the first writer, the permits among the first N); the waiters behind them are not counted.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock_runtime::LockError> {
/// use std::time::Duration;
/// let rt = dlock_runtime::Runtime::from_url("memory://").await?;
/// let guard = rt.lock("stock:42").lease(Duration::from_secs(30)).acquire().await?;
/// let info = rt.inspect("stock:42").await?.expect("held");
/// assert_eq!(info.key, "stock:42");
/// assert!(info.owner.ends_with('…'));         // never the whole owner token
/// assert!(info.ttl <= Duration::from_secs(30));
/// assert_eq!(info.fence, guard.fence());
/// guard.release().await?;
/// assert!(rt.inspect("stock:42").await?.is_none());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The user's key, without the runtime's prefix.
    pub key: String,
    /// The holder, redacted: the first 8 hex digits of its owner token (the first half of the
    /// holding runtime's id, the same for every lock of one runtime) followed by `…`. The
    /// whole token is what authorises a release, so it is never shown.
    pub owner: String,
    /// How long the lock has left unless renewed (see the table above per engine).
    pub ttl: Duration,
    /// The hold count as the engine stores it; 1 where the engine keeps none.
    pub holds: u32,
    /// The current holder's fencing token where the engine tells it without guessing, else
    /// `None` (see the table above).
    pub fence: Option<u64>,
    /// The lock's mode: `"exclusive"` (a plain lock or a write lock), `"read"` (a read lock:
    /// the entry shows one of its readers, `holds` counts them all) or `"semaphore"` (one
    /// of its permit holders, `holds` counts them all).
    pub mode: String,
}

impl LockInfo {
    /// An exclusive lock on `key` held by the owner token `token` (redacted here).
    pub(crate) fn held(
        key: impl Into<String>,
        token: &str,
        ttl: Duration,
        holds: u32,
        fence: Option<u64>,
    ) -> Self {
        Self {
            key: key.into(),
            owner: redact_owner(token),
            ttl,
            holds,
            fence,
            mode: EXCLUSIVE.to_owned(),
        }
    }
}

/// `token` as [`LockInfo::owner`] shows it: its first 8 characters and `…`.
pub(crate) fn redact_owner(token: &str) -> String {
    let shown: String = token.chars().take(OWNER_SHOWN).collect();
    format!("{shown}…")
}

/// Whether `text` is an owner token as the runtime makes them: 32 hex digits (see
/// `acquire::new_owner`). Anything else in a lock's place is not a holder the runtime made.
#[cfg_attr(
    not(server_engines),
    allow(dead_code, reason = "read by the engines with a server")
)]
pub(crate) fn is_owner_token(text: &str) -> bool {
    let (token, tag) = text.split_at(text.len().min(32));
    token.len() == 32
        && token.bytes().all(|b| b.is_ascii_hexdigit())
        && (tag.is_empty() || crate::backend::mode::Mode::of(text).tag(token.to_owned()) == text)
}

/// Sorts `found` by key, keeps the keys starting with `prefix`, one entry per key.
pub(crate) fn settle_listing(mut found: Vec<LockInfo>, prefix: &str) -> Vec<LockInfo> {
    found.retain(|info| info.key.starts_with(prefix));
    found.sort_by(|a, b| a.key.cmp(&b.key));
    found.dedup_by(|a, b| a.key == b.key);
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_redacted_to_eight_digits() {
        let token = "0123456789abcdef0123456789abcdef";
        assert!(is_owner_token(token));
        let info = LockInfo::held("k", token, Duration::from_secs(1), 1, None);
        assert_eq!(info.owner, "01234567…");
        assert!(!info.owner.contains(&token[8..]));
        assert_eq!(info.mode, "exclusive");
        assert!(!is_owner_token("~0123456789abcdef"));
        assert!(!is_owner_token("0123456789abcdef0123456789abcdeg"));
        assert_eq!(redact_owner("ключ"), "ключ…");
    }

    #[test]
    fn listings_are_sorted_filtered_and_unique() {
        let at = |key: &str| LockInfo::held(key, "t", Duration::ZERO, 1, None);
        let settled = settle_listing(vec![at("b:2"), at("a:1"), at("b:1"), at("b:1")], "b:");
        let keys: Vec<&str> = settled.iter().map(|i| i.key.as_str()).collect();
        assert_eq!(keys, ["b:1", "b:2"]);
    }
}
