//! One acquisition in the engine, shared by the guards of its reentrant holds.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::core::Core;
use crate::watchdog::LostSignal;

/// One acquisition in the engine, shared by the guards of its reentrant holds.
pub(crate) struct Held {
    pub(crate) core: Arc<Core>,
    pub(crate) key: String,
    pub(crate) owner: String,
    pub(crate) fence: Option<u64>,
    pub(crate) lost: Arc<LostSignal>,
    pub(crate) watchdog_id: u64,
    /// Live guards; the last one out releases in the engine. Zero means released (or being
    /// released): nobody may re-enter then.
    holds: Mutex<usize>,
}

impl Held {
    pub(crate) fn new(
        core: &Arc<Core>,
        key: String,
        owner: String,
        fence: Option<u64>,
        lease: Duration,
        renew: bool,
        sent_at: Instant,
    ) -> Arc<Self> {
        // Checked when the lock was requested; counting on nothing is the safe answer otherwise.
        let drift = core.backend.lease_margin(lease).unwrap_or(lease);
        let (watchdog_id, lost) = core
            .watchdog
            .register(&key, &owner, lease, drift, renew, sent_at);
        tracing::debug!(key = %key, ?fence, ?lease, watchdog = renew, "lock acquired");
        Arc::new(Self {
            core: core.clone(),
            key,
            owner,
            fence,
            lost,
            watchdog_id,
            holds: Mutex::new(1),
        })
    }

    /// Adds a reentrant hold; `false` when the lock is already released.
    pub(crate) fn add_hold(&self) -> bool {
        let mut holds = self.holds.lock().unwrap_or_else(PoisonError::into_inner);
        if *holds == 0 {
            return false;
        }
        *holds += 1;
        true
    }

    /// Whether some guard still holds it.
    pub(crate) fn is_held(&self) -> bool {
        *self.holds.lock().unwrap_or_else(PoisonError::into_inner) > 0
    }

    /// Drops one hold; `true` when it was the last (the caller releases in the engine).
    pub(crate) fn drop_hold(&self) -> bool {
        let mut holds = self.holds.lock().unwrap_or_else(PoisonError::into_inner);
        *holds = holds.saturating_sub(1);
        *holds == 0
    }
}
