//! Fair locks (`fair(true)`): strict FIFO across processes through a queue of waiters in Redis
//! (`lua/fair_acquire.lua`, `lua/fair_leave.lua`), after Redisson's fair lock: a list of
//! waiters and a sorted set of the deadlines of their places, so that a waiter whose process
//! died leaves the line when its place runs out. The lock itself is the ordinary one (renewed,
//! released and inspected as such); its release notifies as usual. A fair lock is a writer:
//! the first in line that finds readers holding marks itself waiting in their mark for
//! `shared::WRITER_WAITING` at a time, as a plain writer does (`lua/acquire.lua`).

use std::time::Duration;

use super::script::{FENCE_FLOOR_MIN, decode_acquire, millis_ceil};
use super::{FENCE_BLOCK, FENCE_TTL, RedisBackend, shared};
use crate::backend::{Attempt, EngineResult};

/// Message a waiter leaving the head of the line publishes (never a runtime id: every
/// runtime's waiters look again).
const LEFT: &str = "left";

impl RedisBackend {
    /// See [`crate::backend::Backend::try_acquire_fair`].
    pub(super) async fn fair_attempt(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
        place: Duration,
    ) -> EngineResult<Attempt> {
        let reply: i64 = self
            .run_script(
                &self.scripts.fair_acquire,
                Some(key),
                "acquire failed",
                |cmd| {
                    cmd.arg(4)
                        .arg(self.names.lock(key))
                        .arg(self.names.fence(key))
                        .arg(self.names.fair_queue(key))
                        .arg(self.names.fair_places(key))
                        .arg(owner)
                        .arg(millis_ceil(lease))
                        .arg(millis_ceil(lease.saturating_add(FENCE_TTL)))
                        .arg(FENCE_FLOOR_MIN)
                        .arg(FENCE_BLOCK)
                        .arg(&self.origin)
                        .arg(if place.is_zero() {
                            0
                        } else {
                            millis_ceil(place)
                        })
                        .arg(millis_ceil(shared::WRITER_WAITING));
                },
            )
            .await?;
        Ok(decode_acquire(reply, FENCE_BLOCK))
    }

    /// See [`crate::backend::Backend::leave_fair_queue`].
    pub(super) async fn fair_leave(&self, key: &str, owner: &str) -> EngineResult<()> {
        let _: i64 = self
            .run_script(
                &self.scripts.fair_leave,
                Some(key),
                "leaving the queue failed",
                |cmd| {
                    cmd.arg(3)
                        .arg(self.names.lock(key))
                        .arg(self.names.fair_queue(key))
                        .arg(self.names.fair_places(key))
                        .arg(owner)
                        .arg(self.names.channel(key))
                        .arg(LEFT)
                        .arg(self.link.publish_command());
                },
            )
            .await?;
        Ok(())
    }
}
