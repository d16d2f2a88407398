//! In-process engine: the embedded default (`memory://`), for local runs, doc examples and tests.
//!
//! Same semantics as the Redis backend within one process: leases expire (on tokio's clock, so
//! tests can pause it), fences strictly increase, a holder's remaining TTL is reported when
//! busy. Waiters are woken by the runtime itself, since every holder is local.

mod inspect;
mod shared;
mod state;

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use self::state::{Entry, State};
use super::mode::Mode;
use super::url::EngineUrl;
use super::{
    Attempt, Backend, Capabilities, Connecting, Context, DynBackend, EngineConfig, EngineResult,
    Released, Renewal,
};
use crate::error::LockError;
use crate::inspect::LockInfo;

/// Expired entries are swept every this many fresh acquisitions.
const SWEEP_EVERY: u64 = 1024;

#[derive(Debug, Default)]
pub(crate) struct MemoryBackend {
    state: Mutex<State>,
}

impl MemoryBackend {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave `State` half-updated (every update is a
        // single map operation), so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn acquire_now(&self, key: &str, owner: &str, lease: Duration) -> Attempt {
        self.acquire_exclusive(key, owner, lease, false)
    }

    /// An exclusive (write) attempt; `waiting`: a waiter's, which marks itself waiting when
    /// readers hold the key, so that new readers queue behind it.
    fn acquire_exclusive(&self, key: &str, owner: &str, lease: Duration, waiting: bool) -> Attempt {
        let now = Instant::now();
        let mut state = self.state();
        let ours = state.live(key, now).is_some_and(|e| e.owner == owner);
        if !ours && let Some(ttl) = state.readers_block(key, owner, waiting, now) {
            return Attempt::Busy { ttl: Some(ttl) };
        }
        state.clear_writer_waiting(key, Some(owner));
        if let Some(entry) = state.live(key, now) {
            if entry.owner == owner {
                entry.count += 1;
                entry.expires = now + lease;
                return Attempt::Acquired {
                    fence: Some(entry.fence),
                };
            }
            return Attempt::Busy {
                ttl: Some(entry.expires.saturating_duration_since(now)),
            };
        }
        state.fence += 1;
        let fence = state.fence;
        if fence.is_multiple_of(SWEEP_EVERY) {
            state.locks.retain(|_, e| e.expires > now);
        }
        state.locks.insert(
            key.to_owned(),
            Entry {
                owner: owner.to_owned(),
                count: 1,
                fence,
                expires: now + lease,
            },
        );
        Attempt::Acquired { fence: Some(fence) }
    }

    fn release_now(&self, key: &str, owner: &str) -> Released {
        let mode = Mode::of(owner);
        if mode.is_shared() {
            let now = Instant::now();
            return shared::release(&mut self.state(), key, owner, mode, now);
        }
        let now = Instant::now();
        let mut state = self.state();
        // A writer that stops waiting (cancelled, timed out) lets readers in again.
        state.clear_writer_waiting(key, Some(owner));
        match state.live(key, now) {
            Some(entry) if entry.owner == owner => {
                entry.count -= 1;
                if entry.count > 0 {
                    return Released::StillHeld;
                }
                state.locks.remove(key);
                Released::Freed
            }
            _ => Released::NotOwner,
        }
    }

    fn release_after_now(&self, key: &str, owner: &str, hold: Duration) -> Released {
        let now = Instant::now();
        let mut state = self.state();
        match state.live(key, now) {
            Some(entry) if entry.owner == owner => {
                entry.count = 1;
                entry.expires = now + hold;
                Released::Kept
            }
            _ => Released::NotOwner,
        }
    }

    fn renew_now(&self, batch: &[Renewal]) -> Vec<bool> {
        let now = Instant::now();
        let mut state = self.state();
        batch
            .iter()
            .map(|r| match state.live(&r.key, now) {
                _ if Mode::of(&r.owner).is_shared() => {
                    shared::renew(&mut state, &r.key, &r.owner, r.lease, now)
                }
                Some(entry) if entry.owner == r.owner => {
                    entry.expires = now + r.lease;
                    true
                }
                _ => false,
            })
            .collect()
    }
}

impl Backend for MemoryBackend {
    async fn try_acquire(&self, key: &str, owner: &str, lease: Duration) -> EngineResult<Attempt> {
        match Mode::of(owner) {
            Mode::Exclusive => Ok(self.acquire_now(key, owner, lease)),
            mode => {
                let now = Instant::now();
                shared::acquire(&mut self.state(), key, owner, lease, mode, now)
            }
        }
    }

    async fn try_acquire_waiting(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
    ) -> EngineResult<Attempt> {
        match Mode::of(owner) {
            Mode::Exclusive => Ok(self.acquire_exclusive(key, owner, lease, true)),
            mode => {
                let now = Instant::now();
                shared::acquire(&mut self.state(), key, owner, lease, mode, now)
            }
        }
    }

    async fn renew(&self, batch: &[Renewal]) -> Result<Vec<Option<bool>>, LockError> {
        Ok(self.renew_now(batch).into_iter().map(Some).collect())
    }

    async fn release(&self, key: &str, owner: &str) -> Result<Released, LockError> {
        Ok(self.release_now(key, owner))
    }

    async fn release_after(
        &self,
        key: &str,
        owner: &str,
        hold: Duration,
    ) -> Result<Released, LockError> {
        Ok(self.release_after_now(key, owner, hold))
    }

    async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        let now = Instant::now();
        let mut state = self.state();
        let existed = state.live(key, now).is_some()
            || state.group(key, Mode::Read, now).is_some()
            || state.group(key, Mode::Permits(0), now).is_some();
        state.locks.remove(key);
        state.readers.remove(key);
        state.permits.remove(key);
        state.clear_writer_waiting(key, None);
        Ok(existed)
    }

    async fn is_locked(&self, key: &str) -> Result<bool, LockError> {
        let now = Instant::now();
        let mut state = self.state();
        Ok(state.live(key, now).is_some()
            || state.group(key, Mode::Read, now).is_some()
            || state.group(key, Mode::Permits(0), now).is_some())
    }

    async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let now = Instant::now();
        Ok(inspect::inspect(&mut self.state(), key, now))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>, LockError> {
        let now = Instant::now();
        Ok(inspect::list(&self.state(), prefix, now))
    }

    // No `watch`: every holder is in this process, and the runtime wakes waiters on release
    // itself.

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            renew_batch_limit: usize::MAX,
            ..Capabilities::DEFAULT
        }
    }
}

/// `memory://`: no host, no engine option.
#[derive(Debug, Default, Clone)]
pub(crate) struct MemoryConfig;

impl MemoryConfig {
    pub(crate) fn from_url(url: &EngineUrl<'_>) -> Result<Box<dyn EngineConfig>, LockError> {
        if !url.base.is_empty() || url.fragment.is_some() {
            return Err(LockError::config(format!(
                "`{}`: memory:// takes no host",
                url.url
            )));
        }
        url.apply_options(&mut Self, &[])?;
        Ok(Box::new(Self))
    }
}

impl EngineConfig for MemoryConfig {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn in_process(&self) -> bool {
        true
    }

    fn connect(self: Box<Self>, _ctx: Context) -> Connecting {
        Box::pin(async { Ok(DynBackend::new_arc(MemoryBackend::new())) })
    }
}

#[cfg(test)]
mod tests;
