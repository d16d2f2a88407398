//! Several keys at once (`lock_all`): one script takes every key when they all live on one
//! server or one Cluster hash slot (`lua/acquire_all.lua`), all or nothing.

use std::time::Duration;

use super::client::Client;
use super::link::Link;
use super::names::hash_slot;
use super::script::{FENCE_BLOCK, FENCE_FLOOR_MIN, FENCE_TTL, millis_ceil};
use crate::backend::{AttemptAll, EngineResult};
use crate::error::LockError;

/// Whether one script can take every key: one server always, a Cluster when the keys'
/// names share a hash slot (a Redlock node, which keeps no fence counters, never asks).
pub(super) fn one_step(client: &Client, keys: &[String]) -> bool {
    match client.link {
        Link::Single(..) => true,
        Link::Cluster(_) => {
            let mut slots = keys
                .iter()
                .map(|key| hash_slot(client.names.lock(key).as_bytes()));
            let first = slots.next();
            slots.all(|slot| Some(slot) == first)
        }
    }
}

/// See [`crate::backend::Backend::try_acquire_all`].
pub(super) async fn acquire_all(
    client: &Client,
    keys: &[String],
    owner: &str,
    lease: Duration,
) -> EngineResult<AttemptAll> {
    let first = keys.first().map(String::as_str);
    let reply: Vec<i64> = client
        .run_script(
            &client.scripts.acquire_all,
            first,
            "acquire failed",
            |cmd| {
                cmd.arg(2 * keys.len());
                for key in keys {
                    cmd.arg(client.names.lock(key)).arg(client.names.fence(key));
                }
                cmd.arg(owner)
                    .arg(millis_ceil(lease))
                    .arg(millis_ceil(lease.saturating_add(FENCE_TTL)))
                    .arg(FENCE_FLOOR_MIN)
                    .arg(FENCE_BLOCK)
                    .arg(&client.origin);
            },
        )
        .await?;
    decode_all(&reply, keys.len(), FENCE_BLOCK).ok_or_else(|| {
        LockError::backend(
            first,
            "acquire failed: malformed answer of the script",
            None,
        )
    })
}

/// The script's answer (see `lua/acquire_all.lua`) for `n` keys; `None` when malformed.
fn decode_all(reply: &[i64], n: usize, block: u64) -> Option<AttemptAll> {
    match reply {
        [1, lasts @ ..] if lasts.len() == n => Some(AttemptAll::Acquired {
            fences: lasts
                .iter()
                .map(|&last| {
                    u64::try_from(last)
                        .ok()
                        .map(|last| last.saturating_sub(block.saturating_sub(1)).max(1))
                })
                .collect(),
        }),
        [0, index, pttl] => Some(AttemptAll::Busy {
            index: usize::try_from(*index).ok()?.checked_sub(1)?,
            ttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_decode() {
        assert_eq!(
            decode_all(&[1, 1_000_000_000_000_016, 1_000_000_000_000_032], 2, 16),
            Some(AttemptAll::Acquired {
                fences: vec![Some(1_000_000_000_000_001), Some(1_000_000_000_000_017)]
            })
        );
        assert_eq!(
            decode_all(&[0, 2, 1500], 2, 16),
            Some(AttemptAll::Busy {
                index: 1,
                ttl: Some(Duration::from_millis(1500))
            })
        );
        assert_eq!(
            decode_all(&[0, 1, -1], 2, 16),
            Some(AttemptAll::Busy {
                index: 0,
                ttl: None
            })
        );
        assert_eq!(decode_all(&[1, 5], 2, 16), None);
        assert_eq!(decode_all(&[0, 0, 5], 2, 16), None);
    }
}
