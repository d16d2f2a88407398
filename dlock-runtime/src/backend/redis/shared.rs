//! Read locks and semaphore permits on Redis (and Cluster: every name of a key in its hash
//! slot): the readers and the permits are sorted sets of owner tokens scored by their expiry
//! in server time, swept on every call (`lua/read_*.lua`, `lua/permit_*.lua`,
//! `lua/shared_renew.lua`). While readers hold, the lock string holds their mark, so that a
//! writer (an exclusive lock) finds the key taken; a writer that finds readers marks itself
//! waiting in it (`lua/acquire.lua`) and new readers queue behind it. Releases publish on the
//! key's release channel when somebody outside the process waits, as a lock's do.

use std::time::Duration;

use super::client::Client;
use super::exclusive;
use super::script::{FENCE_FLOOR_MIN, FENCE_TTL, RESERVATION, decode_acquire, millis_ceil};
use crate::backend::mode::{Mode, permits_mismatch};
use crate::backend::{Attempt, EngineResult, Released, Renewal};
use crate::error::LockError;

/// A renewal and its place in the batch.
type Indexed<'a> = (usize, &'a Renewal);

/// A reader's or a permit's attempt; `waiting`: a waiter's (its release is asked to
/// notify).
pub(super) async fn acquire(
    client: &Client,
    key: &str,
    owner: &str,
    lease: Duration,
    mode: Mode,
    waiting: bool,
) -> EngineResult<Attempt> {
    let names = &client.names;
    let fence_ttl = millis_ceil(lease.saturating_add(FENCE_TTL));
    let waiting = u8::from(waiting);
    match mode {
        Mode::Permits(n) => {
            let (code, value): (i64, i64) = client
                .run_script(
                    &client.scripts.permit_acquire,
                    Some(key),
                    "acquire failed",
                    |cmd| {
                        cmd.arg(3)
                            .arg(names.permits(key))
                            .arg(names.permits_size(key))
                            .arg(names.fence(key))
                            .arg(owner)
                            .arg(millis_ceil(lease))
                            .arg(fence_ttl)
                            .arg(FENCE_FLOOR_MIN)
                            .arg(n)
                            .arg(waiting);
                    },
                )
                .await?;
            match code {
                1 => Ok(decode_acquire(value, 1)),
                2 => Err(permits_mismatch(
                    key,
                    n,
                    u32::try_from(value).unwrap_or_default(),
                )),
                _ => Ok(Attempt::Busy {
                    ttl: u64::try_from(value).ok().map(Duration::from_millis),
                }),
            }
        }
        _ => {
            let reply: i64 = client
                .run_script(
                    &client.scripts.read_acquire,
                    Some(key),
                    "acquire failed",
                    |cmd| {
                        cmd.arg(3)
                            .arg(names.lock(key))
                            .arg(names.fence(key))
                            .arg(names.readers(key))
                            .arg(owner)
                            .arg(millis_ceil(lease))
                            .arg(fence_ttl)
                            .arg(FENCE_FLOOR_MIN)
                            .arg(&client.origin)
                            .arg(waiting);
                    },
                )
                .await?;
            Ok(decode_acquire(reply, 1))
        }
    }
}

/// A reader's or a permit's release.
pub(super) async fn release(
    client: &Client,
    key: &str,
    owner: &str,
    mode: Mode,
) -> Result<Released, LockError> {
    let names = &client.names;
    let reply: i64 = match mode {
        Mode::Permits(_) => {
            client
                .run_script(
                    &client.scripts.permit_release,
                    Some(key),
                    "release failed",
                    |cmd| {
                        cmd.arg(2)
                            .arg(names.permits(key))
                            .arg(names.permits_size(key))
                            .arg(owner)
                            .arg(names.channel(key))
                            .arg(&client.origin)
                            .arg(client.publish_command());
                    },
                )
                .await?
        }
        _ => {
            client
                .run_script(
                    &client.scripts.read_release,
                    Some(key),
                    "release failed",
                    |cmd| {
                        cmd.arg(2)
                            .arg(names.lock(key))
                            .arg(names.readers(key))
                            .arg(owner)
                            .arg(names.channel(key))
                            .arg(&client.origin)
                            .arg(client.publish_command())
                            .arg(millis_ceil(RESERVATION));
                    },
                )
                .await?
        }
    };
    Ok(match reply {
        1 => Released::Freed,
        _ => Released::NotOwner,
    })
}

/// Renews readers and permits in one script call (one hash slot per call on Cluster, as
/// the watchdog partitions batches).
pub(super) async fn renew(client: &Client, batch: &[&Renewal]) -> Result<Vec<bool>, LockError> {
    let names = &client.names;
    let key = (batch.len() == 1).then(|| batch[0].key.as_str());
    let reply: Vec<i64> = client
        .run_script(&client.scripts.shared_renew, key, "renewal failed", |cmd| {
            cmd.arg(3 * batch.len());
            for item in batch {
                match Mode::of(&item.owner) {
                    Mode::Permits(_) => cmd
                        .arg(names.permits(&item.key))
                        .arg(names.permits_size(&item.key)),
                    _ => cmd.arg(names.readers(&item.key)).arg(names.lock(&item.key)),
                };
                cmd.arg(names.fence(&item.key));
            }
            cmd.arg(millis_ceil(FENCE_TTL));
            for item in batch {
                cmd.arg(&item.owner).arg(millis_ceil(item.lease));
            }
        })
        .await?;
    Ok(reply.into_iter().map(|r| r == 1).collect())
}

/// Renews a batch with readers or permits in it: locks with `lua/renew.lua`, the others
/// with `lua/shared_renew.lua`, both at once; the answers in the batch's order.
pub(super) async fn renew_mixed(
    client: &Client,
    batch: &[Renewal],
) -> Result<Vec<Option<bool>>, LockError> {
    let (shared, locks): (Vec<Indexed<'_>>, Vec<Indexed<'_>>) = batch
        .iter()
        .enumerate()
        .partition(|(_, r)| Mode::of(&r.owner).is_shared());
    let lock_batch: Vec<Renewal> = locks.iter().map(|(_, r)| (*r).clone()).collect();
    let shared_batch: Vec<&Renewal> = shared.iter().map(|(_, r)| *r).collect();
    let (renewed_locks, renewed_shared) = tokio::join!(
        async {
            if lock_batch.is_empty() {
                return Ok(Vec::new());
            }
            exclusive::renew(client, &lock_batch).await
        },
        renew(client, &shared_batch)
    );
    let mut answers = vec![None; batch.len()];
    for ((i, _), answer) in locks.iter().zip(renewed_locks?) {
        answers[*i] = answer;
    }
    for ((i, _), answer) in shared.iter().zip(renewed_shared?) {
        answers[*i] = Some(answer);
    }
    Ok(answers)
}
