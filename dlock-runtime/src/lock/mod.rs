//! Acquiring: a lock's builder, its checks, one key (re-entry or fresh) and several keys at
//! once. Each submodule points down: `multi` takes its keys through `one`, both read the
//! builder.

use std::sync::Arc;

use crate::chain::{Frame, current_frame};
use crate::error::LockError;
use crate::guard::LockGuard;

pub(crate) mod builder;
mod multi;
mod one;
pub(crate) mod validate;

pub use builder::{LockBuilder, OnLost, lock, lock_all, semaphore};
pub use validate::MAX_KEY_LEN;

impl LockBuilder {
    /// Acquires the lock, waiting up to the `wait` budget by notification.
    ///
    /// Inside a call chain (an annotated call or [`with_lock`](crate::with_lock)) that already holds this key in
    /// the same runtime, re-enters: the hold count grows, the fence stays, nothing is sent to
    /// the engine, and the returned guard's release leaves the outer hold in place. The
    /// returned guard must not outlive the hold it re-entered (see [`LockGuard`]).
    ///
    /// Errors: [`LockError::Timeout`](crate::LockError::Timeout) when still busy at the deadline, [`LockError::Backend`](crate::LockError::Backend)
    /// when the engine fails, [`LockError::InvalidConfig`](crate::LockError::InvalidConfig) for an empty or too long key (see
    /// [`MAX_KEY_LEN`](crate::MAX_KEY_LEN)) or a bad lease, [`LockError::NotInstalled`](crate::LockError::NotInstalled)
    /// without a runtime, [`LockError::Lost`](crate::LockError::Lost) when re-entering a hold whose lease is already
    /// lost.
    ///
    /// Cancel-safe: dropping the future while it waits or while the request is in flight
    /// leaves no lock behind (a compensating owner-checked release is sent).
    pub async fn acquire(self) -> Result<LockGuard, LockError> {
        let frame = current_frame();
        self.acquire_in(frame.as_ref(), None).await
    }

    /// Acquires from the call-chain frame `frame` (none: outside any chain). `scope` is the
    /// frame that a scoped acquisition (`with_lock`, the attribute) opens for its body: a
    /// re-entry makes it the hold's innermost user, so that concurrent branches take turns.
    ///
    pub(crate) async fn acquire_in(
        mut self,
        frame: Option<&Arc<Frame>>,
        scope: Option<u64>,
    ) -> Result<LockGuard, LockError> {
        let core = match self.rt.take() {
            Some(core) => core,
            None => crate::core::current()?,
        };
        if self.keys.is_some() {
            return Box::pin(multi::acquire(self, &core, frame, scope)).await;
        }
        one::acquire(self, &core, frame, scope).await
    }
}

#[cfg(test)]
mod tests;
