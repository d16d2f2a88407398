//! The memory engine's locks as [`LockInfo`]: its entries, read under its one mutex.

use tokio::time::Instant;

use super::shared::Group;
use super::{Entry, MemoryBackend};
use crate::backend::mode::Mode;
use crate::inspect::LockInfo;

impl MemoryBackend {
    /// The live entry of `key`, if any.
    pub(super) fn inspect_now(&self, key: &str) -> Option<LockInfo> {
        let now = Instant::now();
        let mut state = self.state();
        if let Some(entry) = Self::live(&mut state, key, now) {
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
    pub(super) fn list_now(&self, prefix: &str) -> Vec<LockInfo> {
        let now = Instant::now();
        let state = self.state();
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

    use super::*;

    const OWNER: &str = "0123456789abcdef0123456789abcdef";

    #[tokio::test(start_paused = true)]
    async fn entries_show_their_count_fence_and_lease_left() {
        let m = MemoryBackend::new();
        m.acquire_now("a:1", OWNER, Duration::from_secs(10));
        m.acquire_now("a:1", OWNER, Duration::from_secs(10));
        m.acquire_now("b:1", OWNER, Duration::from_secs(2));
        tokio::time::advance(Duration::from_secs(1)).await;
        let info = m.inspect_now("a:1").expect("held");
        assert_eq!(info.holds, 2);
        assert_eq!(info.ttl, Duration::from_secs(9));
        assert_eq!(info.fence, Some(1));
        assert_eq!(info.owner, "01234567…");
        let keys: Vec<String> = m.list_now("").into_iter().map(|i| i.key).collect();
        assert_eq!(keys, ["a:1", "b:1"]);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(
            m.inspect_now("b:1").is_none(),
            "an expired entry is not a holder"
        );
        assert_eq!(m.list_now("b:").len(), 0);
    }
}
