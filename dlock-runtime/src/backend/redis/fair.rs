//! Fair locks (`fair(true)`): strict FIFO across processes through a queue of waiters in Redis
//! (`lua/fair_acquire.lua`, `lua/fair_leave.lua`), after Redisson's fair lock: a list of
//! waiters and a sorted set of the deadlines of their places, so that a waiter whose process
//! died leaves the line when its place runs out. The lock itself is the ordinary one (renewed,
//! released and inspected as such); its release notifies as usual. A fair lock is a writer:
//! the first in line that finds readers holding marks itself waiting in their mark for
//! `WRITER_WAITING` at a time, as a plain writer does (`lua/acquire.lua`).

use std::time::Duration;

use super::client::Client;
use super::script::{
    FENCE_BLOCK, FENCE_FLOOR_MIN, FENCE_TTL, WRITER_WAITING, decode_acquire, millis_ceil,
};
use crate::backend::{Attempt, EngineResult};

/// Message a waiter leaving the head of the line publishes (never a runtime id: every
/// runtime's waiters look again).
const LEFT: &str = "left";

/// See [`crate::backend::Backend::try_acquire_fair`].
pub(super) async fn attempt(
    client: &Client,
    key: &str,
    owner: &str,
    lease: Duration,
    place: Duration,
) -> EngineResult<Attempt> {
    let reply: i64 = client
        .run_script(
            &client.scripts.fair_acquire,
            Some(key),
            "acquire failed",
            |cmd| {
                cmd.arg(4)
                    .arg(client.names.lock(key))
                    .arg(client.names.fence(key))
                    .arg(client.names.fair_queue(key))
                    .arg(client.names.fair_places(key))
                    .arg(owner)
                    .arg(millis_ceil(lease))
                    .arg(millis_ceil(lease.saturating_add(FENCE_TTL)))
                    .arg(FENCE_FLOOR_MIN)
                    .arg(FENCE_BLOCK)
                    .arg(&client.origin)
                    .arg(if place.is_zero() {
                        0
                    } else {
                        millis_ceil(place)
                    })
                    .arg(millis_ceil(WRITER_WAITING));
            },
        )
        .await?;
    Ok(decode_acquire(reply, FENCE_BLOCK))
}

/// See [`crate::backend::Backend::leave_fair_queue`].
pub(super) async fn leave(client: &Client, key: &str, owner: &str) -> EngineResult<()> {
    let _: i64 = client
        .run_script(
            &client.scripts.fair_leave,
            Some(key),
            "leaving the queue failed",
            |cmd| {
                cmd.arg(3)
                    .arg(client.names.lock(key))
                    .arg(client.names.fair_queue(key))
                    .arg(client.names.fair_places(key))
                    .arg(owner)
                    .arg(client.names.channel(key))
                    .arg(LEFT)
                    .arg(client.publish_command());
            },
        )
        .await?;
    Ok(())
}
