//! The memory engine's locks as [`LockInfo`]: its entries, read under its one mutex.

use tokio::time::Instant;

use super::state::{Entry, Group, State};
use crate::backend::mode::Mode;
use crate::inspect::LockInfo;

/// The live entry of `key`, if any.
pub(super) fn inspect(state: &mut State, key: &str, now: Instant) -> Option<LockInfo> {
    if let Some(entry) = state.live(key, now) {
        return Some(info(key, entry, now));
    }
    for mode in [Mode::Read, Mode::Permits(0)] {
        if let Some(group) = state.group(key, mode, now) {
            return shared_info(key, group, mode, now);
        }
    }
    None
}

/// The live entries whose keys start with `prefix`, sorted by key.
pub(super) fn list(state: &State, prefix: &str, now: Instant) -> Vec<LockInfo> {
    let mut found: Vec<LockInfo> = state
        .locks
        .iter()
        .filter(|(key, entry)| key.starts_with(prefix) && entry.expires > now)
        .map(|(key, entry)| info(key, entry, now))
        .collect();
    for (mode, map) in [
        (Mode::Read, &state.readers),
        (Mode::Permits(0), &state.permits),
    ] {
        found.extend(
            map.iter()
                .filter(|(key, _)| key.starts_with(prefix))
                .filter_map(|(key, group)| shared_info(key, group, mode, now)),
        );
    }
    found.sort_by(|a, b| a.key.cmp(&b.key));
    found
}

fn info(key: &str, entry: &Entry, now: Instant) -> LockInfo {
    LockInfo::held(
        key,
        &entry.owner,
        entry.expires.saturating_duration_since(now),
        u32::try_from(entry.count).unwrap_or(u32::MAX),
        Some(entry.fence),
    )
}

/// A read lock or a semaphore: its earliest live holder, the latest expiry, and how many
/// hold it.
fn shared_info(key: &str, group: &Group, mode: Mode, now: Instant) -> Option<LockInfo> {
    let live: Vec<&Entry> = group.holders().filter(|e| e.expires > now).collect();
    let first = live.iter().min_by_key(|e| e.fence)?;
    let mut info = LockInfo::held(
        key,
        &first.owner,
        group.last_ttl(now).unwrap_or_default(),
        u32::try_from(live.len()).unwrap_or(u32::MAX),
        Some(first.fence),
    );
    info.mode = mode.name().to_owned();
    Some(info)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::MemoryBackend;
    use super::*;

    const OWNER: &str = "0123456789abcdef0123456789abcdef";

    #[tokio::test(start_paused = true)]
    async fn entries_show_their_count_fence_and_lease_left() {
        let m = MemoryBackend::new();
        m.acquire_now("a:1", OWNER, Duration::from_secs(10));
        m.acquire_now("a:1", OWNER, Duration::from_secs(10));
        m.acquire_now("b:1", OWNER, Duration::from_secs(2));
        tokio::time::advance(Duration::from_secs(1)).await;
        let info = inspect(&mut m.state(), "a:1", Instant::now()).expect("held");
        assert_eq!(info.holds, 2);
        assert_eq!(info.ttl, Duration::from_secs(9));
        assert_eq!(info.fence, Some(1));
        assert_eq!(info.owner, "01234567…");
        let keys: Vec<String> = list(&m.state(), "", Instant::now())
            .into_iter()
            .map(|i| i.key)
            .collect();
        assert_eq!(keys, ["a:1", "b:1"]);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(
            inspect(&mut m.state(), "b:1", Instant::now()).is_none(),
            "an expired entry is not a holder"
        );
        assert_eq!(list(&m.state(), "b:", Instant::now()).len(), 0);
    }
}
