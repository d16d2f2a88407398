//! Ending a hold in the engine from the background: a release scheduled from `Drop` or after
//! a cancelled request, retried a few times, and run on the [last resort](last_resort) when
//! the tokio runtime it was spawned on shuts down first.
//!
//! Every release here is owner-checked: it can only end a hold of its own owner token, so a
//! release of a request that never landed is a no-op.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::backend::{AnyBackend, Released, Wakeups};

mod end;
mod last_resort;
pub(crate) use end::end_in_engine;
pub(crate) use last_resort::LastResort;

/// Attempts of a release scheduled from `Drop` or after a cancelled acquire.
const BACKGROUND_RELEASE_ATTEMPTS: u32 = 5;

/// A runtime's background releases: its engine, the local waiters to wake once a key is
/// free, the tokio handle the releases run on, and the last resort behind it.
pub(crate) struct Releaser {
    backend: Arc<AnyBackend>,
    wakeups: Arc<dyn Wakeups>,
    handle: Handle,
    /// Bound on each engine call: a compensating release looks again after it.
    timeout: Duration,
    last_resort: LastResort,
}

impl Releaser {
    pub(crate) fn new(
        backend: Arc<AnyBackend>,
        wakeups: Arc<dyn Wakeups>,
        handle: Handle,
        timeout: Duration,
        last_resort: LastResort,
    ) -> Self {
        Self {
            backend,
            wakeups,
            handle,
            timeout,
            last_resort,
        }
    }

    /// Releases `owner`'s hold on `key` (kept until `hold_until`, if any) from a spawned task
    /// (Drop, cancellation). If that task is dropped before it finishes (its tokio runtime
    /// shuts down, or is already gone), the release runs on the last resort instead.
    pub(crate) fn release_in_background(
        self: &Arc<Self>,
        key: String,
        owner: String,
        hold_until: Option<Instant>,
    ) {
        self.spawn_release(key, owner, hold_until, false);
    }

    fn spawn_release(
        self: &Arc<Self>,
        key: String,
        owner: String,
        hold_until: Option<Instant>,
        compensating: bool,
    ) {
        let pending = PendingRelease {
            releaser: self.clone(),
            key,
            owner,
            hold_until,
            finished: false,
        };
        self.handle.spawn(async move {
            let (releaser, key, owner) = (&pending.releaser, &pending.key, &pending.owner);
            let mut found = releaser.release_with_retries(key, owner, hold_until).await;
            if compensating {
                for wait in [releaser.timeout, releaser.timeout * 2] {
                    if found {
                        break;
                    }
                    tokio::time::sleep(wait).await;
                    found = releaser.release_with_retries(key, owner, None).await;
                    if found {
                        tracing::debug!(key = %key, "an acquire that landed after its compensating release was undone");
                    }
                }
            }
            pending.finish();
        });
    }

    /// Retried a few times: a release that fails leaves the lock until its lease ends. `false`
    /// when the engine had nothing of `owner`'s. Each attempt keeps the key for what is left
    /// of the hold until `hold_until` (if any).
    async fn release_with_retries(
        &self,
        key: &str,
        owner: &str,
        hold_until: Option<Instant>,
    ) -> bool {
        let mut delay = Duration::from_millis(100);
        for attempt in 1..=BACKGROUND_RELEASE_ATTEMPTS {
            match end_in_engine(self.backend.as_ref(), key, owner, hold_until).await {
                Ok(Released::Freed) => {
                    tracing::debug!(key = %key, "lock released in the background");
                    self.wakeups.wake(key);
                    return true;
                }
                Ok(Released::Kept) => {
                    tracing::debug!(key = %key, "lock released in the background; its key is kept until its hold ends");
                    // Local waiters look again and wait for the hold's end, not the lease's.
                    self.wakeups.wake(key);
                    return true;
                }
                Ok(Released::NotOwner) => {
                    self.wakeups.wake(key);
                    return false;
                }
                Ok(Released::StillHeld) => return true,
                Err(err) if attempt < BACKGROUND_RELEASE_ATTEMPTS => {
                    tracing::debug!(key = %key, error = %err, "background release failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Err(err) => {
                    tracing::warn!(key = %key, error = %err, "background release failed; the lock expires with its lease");
                }
            }
        }
        // Given up: looking again would not help.
        true
    }
}

/// A background release; if dropped unfinished, hands over to the last resort.
struct PendingRelease {
    releaser: Arc<Releaser>,
    key: String,
    owner: String,
    hold_until: Option<Instant>,
    finished: bool,
}

impl PendingRelease {
    /// Done (released, or given up after its retries): nothing for the last resort.
    fn finish(mut self) {
        self.finished = true;
    }
}

impl Drop for PendingRelease {
    fn drop(&mut self) {
        if !self.finished {
            let releaser = &self.releaser;
            releaser.last_resort.release(
                &releaser.backend,
                &self.key,
                &self.owner,
                self.hold_until,
            );
        }
    }
}

/// Until disarmed, schedules an owner-checked release of `owner`'s hold on `key` when dropped:
/// an engine call whose answer never arrived (an error, a timeout, the future dropped) may
/// still have landed, and the release is a no-op if it did not.
pub(crate) struct ReleaseOnDrop<'a> {
    releaser: &'a Arc<Releaser>,
    key: &'a str,
    owner: &'a str,
    /// The end of the hold that keeps the key (see [`end_in_engine`]).
    hold_until: Option<Instant>,
    armed: bool,
    /// Undoes an acquire request (which may land late) rather than finishing a release.
    compensating: bool,
}

impl<'a> ReleaseOnDrop<'a> {
    pub(crate) fn new(
        releaser: &'a Arc<Releaser>,
        key: &'a str,
        owner: &'a str,
        hold_until: Option<Instant>,
    ) -> Self {
        Self {
            releaser,
            key,
            owner,
            hold_until,
            armed: true,
            compensating: false,
        }
    }

    /// Until disarmed, undoes the acquire request of `owner` on `key` when dropped. The
    /// request may still land after this release (a reconnect resends nothing, but a Cluster
    /// redirect or a slow socket can deliver it late): when the release finds nothing of
    /// `owner`'s, it looks again after the runtime's `timeout` and after three, by when every
    /// request of that owner has been answered or given up. A late acquire therefore keeps
    /// the key for about the runtime's `timeout` at most, not for its lease.
    pub(crate) fn compensate(releaser: &'a Arc<Releaser>, key: &'a str, owner: &'a str) -> Self {
        // Not `..Self::new(..)`: that would make (and drop, armed) a second value.
        Self {
            releaser,
            key,
            owner,
            hold_until: None,
            armed: true,
            compensating: true,
        }
    }

    /// The call answered: nothing to compensate.
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.releaser.spawn_release(
                self.key.to_owned(),
                self.owner.to_owned(),
                self.hold_until,
                self.compensating,
            );
        }
    }
}

#[cfg(test)]
mod tests;
