//! An exclusive lock's life on Redis: the first attempt (plain commands in one round trip), a
//! waiter's attempt (`lua/acquire.lua`), renewal, release, the release that keeps the key for
//! another block of tokens (`lua/extend.lua`) and the one that keeps it for `hold_at_least`
//! (`lua/hold.lua`). A lock's value is its owner token, `+` appended while a waiter outside
//! the process wants it; a reservation after a flagged release is `><runtime id>` or
//! `~<runtime id>` (see `lua/release.lua`).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::client::Client;
use super::names::{self, Name};
use super::script::{
    FENCE_BLOCK, FENCE_FLOOR_MIN, FENCE_TTL, RESERVATION, WRITER_WAITING, decode_acquire,
    millis_ceil,
};
use crate::backend::{Attempt, EngineResult, Extension, Released, Renewal};
use crate::error::LockError;

/// An acquisition leaves the counter's `PEXPIRE` out when this backend pushed the counter's
/// expiry (to at least `FENCE_TTL` from then) less than this long before, lease included: the
/// counter then still outlives the lock by more than nine tenths of `FENCE_TTL`.
const COUNTER_PUSH_SPARED: Duration = Duration::from_secs(60);

/// At most this many counters are remembered (the memory is cleared when it is full).
const COUNTERS_REMEMBERED: usize = 4096;

/// Key -> when this backend last sent a `PEXPIRE` of its fence counter (that was answered).
#[derive(Default)]
pub(super) struct Counters(Mutex<HashMap<String, Instant>>);

impl Counters {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Instant>> {
        // Map operations cannot be interrupted half-way: a poisoned lock is consistent.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether an acquisition with `lease`, sent now, needs to push the expiry of `key`'s
    /// counter: not when this backend pushed it recently enough (see [`COUNTER_PUSH_SPARED`]).
    /// Every push sets at least `FENCE_TTL` from its own time, so a later one by anybody never
    /// shortens what an earlier one promised.
    fn push_needed(&self, key: &str, lease: Duration, now: Instant) -> bool {
        self.lock()
            .get(key)
            .is_none_or(|&pushed| now + lease >= pushed + COUNTER_PUSH_SPARED)
    }

    /// Remembers that a `PEXPIRE` of `key`'s counter sent at `sent_at` was answered.
    fn pushed(&self, key: &str, sent_at: Instant) {
        let mut counters = self.lock();
        if counters.len() >= COUNTERS_REMEMBERED && !counters.contains_key(key) {
            counters.clear();
        }
        counters.insert(key.to_owned(), sent_at);
    }
}

/// The first attempt, plain commands in one round trip (no script): `SET lock owner NX PX
/// lease GET`, `INCRBY counter FENCE_BLOCK`, and `PEXPIRE counter` unless this backend
/// pushed the counter's expiry lately (see [`COUNTER_PUSH_SPARED`]; a recreated counter
/// gets its expiry from the floor script). Not atomic, and need not be: the
/// counter only grows, an attempt that found the key taken just spends a value, and a
/// holder's `INCR` runs after its `SET` and before the release that lets the next holder
/// in, so tokens follow the order of the holds. (A holder whose value came from a
/// recreated counter raises it to the clock first, see [`FENCE_FLOOR_MIN`].)
pub(super) async fn try_acquire(
    client: &Client,
    counters: &Counters,
    key: &str,
    owner: &str,
    lease: Duration,
) -> EngineResult<Attempt> {
    let tag = client.names.tag(key);
    let (lock, counter) = (
        client.names.name(&tag, ""),
        client.names.name(&tag, names::FENCE),
    );
    let sent_at = Instant::now();
    let push = counters.push_needed(key, lease, sent_at);
    let mut pipe = redis::Pipeline::with_capacity(3);
    // Sized for its arguments, as `set_if_free`: no reallocation while they are written.
    let mut draw = redis::Cmd::with_capacity(3, counter.len() + 16);
    draw.arg("INCRBY").arg(counter).arg(FENCE_BLOCK);
    pipe.add_command(set_if_free(lock, owner, lease))
        .add_command(draw);
    if push {
        pipe.cmd("PEXPIRE")
            .arg(counter)
            .arg(millis_ceil(lease.saturating_add(FENCE_TTL)))
            .ignore();
    }
    let mut conn = client.handle();
    let sent = std::pin::pin!(conn.replies(&pipe, if push { 3 } else { 2 }));
    let replies = client
        .bounded_by(sent, std::pin::pin!(client.bound_from(sent_at)))
        .await;
    let (held, fence) = client.settle(
        Some(key),
        "acquire failed",
        replies.map(|replies| held_and_fence(replies?)),
    )?;
    if push {
        counters.pushed(key, sent_at);
    }
    if let Some(held) = held.as_deref().filter(|held| !is_owner(held, owner)) {
        return Box::pin(found_taken(client, key, owner, lease, held)).await;
    }
    let last = if fence < FENCE_FLOOR_MIN {
        Box::pin(
            client.run_script(&client.scripts.floor, Some(key), "acquire failed", |cmd| {
                cmd.arg(1)
                    .arg(counter)
                    .arg(millis_ceil(lease.saturating_add(FENCE_TTL)))
                    .arg(FENCE_BLOCK);
            }),
        )
        .await?
    } else {
        fence
    };
    Ok(decode_acquire(last, FENCE_BLOCK))
}

/// The first attempt without a fencing token (a Redlock node): `SET lock owner NX PX lease
/// GET` alone. Idempotent per owner like the fenced one.
pub(super) async fn try_acquire_unfenced(
    client: &Client,
    key: &str,
    owner: &str,
    lease: Duration,
) -> EngineResult<Attempt> {
    let tag = client.names.tag(key);
    let cmd = set_if_free(client.names.name(&tag, ""), owner, lease);
    let mut conn = client.handle();
    let answer = client.bounded(std::pin::pin!(conn.query(&cmd))).await;
    let held: Option<String> = client.settle(Some(key), "acquire failed", answer)?;
    match held.as_deref() {
        Some(held) if !is_owner(held, owner) => {
            Box::pin(found_taken(client, key, owner, lease, held)).await
        }
        _ => Ok(Attempt::Acquired { fence: None }),
    }
}

/// The answer of a first attempt that found the lock holding `held`, not `owner`'s: a
/// reservation for this runtime after another runtime's flagged release (release.lua) is
/// taken the way a waiter does; anything else is busy.
async fn found_taken(
    client: &Client,
    key: &str,
    owner: &str,
    lease: Duration,
    held: &str,
) -> EngineResult<Attempt> {
    if reserved_for_us(client, held) {
        return try_acquire_waiting(client, key, owner, lease, None).await;
    }
    Ok(Attempt::Busy { ttl: None })
}

/// A waiter's attempt (`lua/acquire.lua`: acquires, or flags the holder's lock so that its
/// release notifies, takes this runtime's place in the key's line, and answers the holder's
/// TTL), taking the place at `place` (see [`place_now`]) if given, else at the server's
/// clock: Redlock gives every node the same, so that the nodes order the runtimes alike and
/// reserve a release for the same one.
pub(super) async fn try_acquire_waiting(
    client: &Client,
    key: &str,
    owner: &str,
    lease: Duration,
    place: Option<u64>,
) -> EngineResult<Attempt> {
    let reply: i64 = client
        .run_script(
            &client.scripts.acquire,
            Some(key),
            "acquire failed",
            |cmd| {
                block_args(client, cmd, key, owner, lease);
                cmd.arg(&client.origin).arg(millis_ceil(WRITER_WAITING));
                if let Some(place) = place {
                    cmd.arg(place);
                }
            },
        )
        .await?;
    Ok(decode_acquire(reply, FENCE_BLOCK))
}

/// Renews the locks of `batch` (no reader, no permit) with one script call.
pub(super) async fn renew(
    client: &Client,
    batch: &[Renewal],
) -> Result<Vec<Option<bool>>, LockError> {
    let key = (batch.len() == 1).then(|| batch[0].key.as_str());
    let reply: Vec<i64> = client
        .run_script(&client.scripts.renew, key, "renewal failed", |cmd| {
            cmd.arg(2 * batch.len());
            for item in batch {
                let tag = client.names.tag(&item.key);
                cmd.arg(client.names.name(&tag, ""))
                    .arg(client.names.name(&tag, names::FENCE));
            }
            cmd.arg(millis_ceil(FENCE_TTL));
            for item in batch {
                cmd.arg(&item.owner).arg(millis_ceil(item.lease));
            }
        })
        .await?;
    Ok(reply.into_iter().map(|r| Some(r == 1)).collect())
}

/// Owner-checked release (`lua/release.lua`).
pub(super) async fn release(
    client: &Client,
    key: &str,
    owner: &str,
) -> Result<Released, LockError> {
    let tag = client.names.tag(key);
    let reply: i64 = client
        .run_script(
            &client.scripts.release,
            Some(key),
            "release failed",
            |cmd| {
                cmd.arg(2)
                    .arg(client.names.name(&tag, ""))
                    .arg(client.names.name(&tag, names::TURNS))
                    .arg(owner)
                    .arg(client.publish_command())
                    .arg(millis_ceil(RESERVATION));
            },
        )
        .await?;
    Ok(match reply {
        1 => Released::Freed,
        _ => Released::NotOwner,
    })
}

/// A release that keeps the key with a new block of tokens when no other runtime waits
/// (`lua/extend.lua`).
pub(super) async fn release_or_extend(
    client: &Client,
    key: &str,
    owner: &str,
    lease: Duration,
) -> Result<Extension, LockError> {
    let reply: i64 = client
        .run_script(&client.scripts.extend, Some(key), "release failed", |cmd| {
            block_args(client, cmd, key, owner, lease);
            cmd.arg(client.names.channel(key))
                .arg(&client.origin)
                .arg(client.publish_command())
                .arg(millis_ceil(RESERVATION));
        })
        .await?;
    Ok(match u64::try_from(reply) {
        Ok(last @ 1..) => Extension::Extended { last },
        _ if reply == -1 => Extension::Released(Released::Freed),
        _ => Extension::Released(Released::NotOwner),
    })
}

/// The end of a hold that keeps the key `hold` longer, no longer renewed (`lua/hold.lua`).
pub(super) async fn release_after(
    client: &Client,
    key: &str,
    owner: &str,
    hold: Duration,
) -> Result<Released, LockError> {
    let reply: i64 = client
        .run_script(&client.scripts.hold, Some(key), "release failed", |cmd| {
            cmd.arg(1)
                .arg(client.names.lock(key))
                .arg(owner)
                .arg(millis_ceil(hold))
                .arg(client.names.channel(key))
                .arg(&client.origin)
                .arg(client.publish_command());
        })
        .await?;
    Ok(match reply {
        1 => Released::Kept,
        _ => Released::NotOwner,
    })
}

/// Whether the lock's value `held` is a reservation (`+` appended when flagged again) made
/// by another runtime's release for this runtime's turn (`><runtime id>`) or for every
/// runtime but the releaser's (`~<runtime id>`), or the writers' turn: this runtime may
/// take the key.
fn reserved_for_us(client: &Client, held: &str) -> bool {
    let unflagged = held.strip_suffix('+').unwrap_or(held);
    // The writers' turn (`^`, `lua/read_release.lua`) is every writer's.
    unflagged.starts_with('^')
        || unflagged.strip_prefix('>') == Some(client.origin.as_str())
        || unflagged
            .strip_prefix('~')
            .is_some_and(|by| by != client.origin)
}

/// The keys and first arguments of the scripts that reserve a block of fences
/// (`acquire.lua`, `extend.lua`): lock and counter, owner, lease, counter TTL, floor, block.
fn block_args(client: &Client, cmd: &mut redis::Cmd, key: &str, owner: &str, lease: Duration) {
    let tag = client.names.tag(key);
    cmd.arg(3)
        .arg(client.names.name(&tag, ""))
        .arg(client.names.name(&tag, names::FENCE))
        .arg(client.names.name(&tag, names::TURNS))
        .arg(owner)
        .arg(millis_ceil(lease))
        .arg(millis_ceil(lease.saturating_add(FENCE_TTL)))
        .arg(FENCE_FLOOR_MIN)
        .arg(FENCE_BLOCK);
}

/// Where a Redlock waiter attempting now takes its runtime's place in a key's line of runtimes
/// on every node (`lua/acquire.lua`): microseconds since the Unix epoch on this machine's
/// clock. Places are compared across processes, so across machines the order is as fair as
/// the clocks agree (a place counts only for the order of runtimes waiting at once, never for
/// exclusion); one server or a Cluster orders by the server's clock instead.
pub(crate) fn place_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// `SET lock owner NX PX lease GET`: writes the lock if it is free, and answers the value it
/// held before either way.
fn set_if_free(lock: Name<'_>, owner: &str, lease: Duration) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(7, lock.len() + owner.len() + 32);
    cmd.arg("SET")
        .arg(lock)
        .arg(owner)
        .arg("NX")
        .arg("PX")
        .arg(millis_ceil(lease))
        .arg("GET");
    cmd
}

/// The replies of the first attempt's `SET … GET` and `INCRBY`: the lock's previous value and
/// the counter's new one (a `PEXPIRE` after them is ignored).
fn held_and_fence(replies: Vec<redis::Value>) -> redis::RedisResult<(Option<String>, i64)> {
    let mut replies = replies.into_iter();
    match (replies.next(), replies.next()) {
        (Some(held), Some(fence)) => Ok((
            redis::from_redis_value(held)?,
            redis::from_redis_value(fence)?,
        )),
        _ => Err(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "fewer replies than commands in the acquire pipeline",
        ))),
    }
}

/// Whether the lock's value `held` is `owner`'s (a `+` appended when a waiter flagged it): a
/// retried request of the same owner, which keeps its one hold.
fn is_owner(held: &str, owner: &str) -> bool {
    held.strip_suffix('+').unwrap_or(held) == owner
}
