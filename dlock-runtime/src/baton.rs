//! A hold on its way from one holder of a runtime to the next (see `handoff`): the engine
//! hold stays, its watchdog entry goes on, and the next holder takes the next fencing token of
//! the block the acquisition reserved. A baton nobody takes is released in the engine.

use std::sync::Arc;
use std::time::Duration;

use crate::release::Releaser;
use crate::wait::Parked;
use crate::watchdog::Watchdog;

/// A hold on its way from one holder to the next.
pub(crate) struct Baton {
    pub(crate) releaser: Arc<Releaser>,
    pub(crate) watchdog: Arc<Watchdog>,
    pub(crate) owner: String,
    /// The next holder's fencing token.
    pub(crate) fence: u64,
    /// One past the last token of the block.
    pub(crate) fences_end: u64,
    pub(crate) watchdog_id: u64,
    pub(crate) lease: Duration,
    /// The part of the lease counted on, the same for the next holder: a hold is handed only
    /// to a waiter asking the same lease.
    pub(crate) effective: Duration,
}

impl std::fmt::Debug for Baton {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Baton")
            .field("fence", &self.fence)
            .field("fences_end", &self.fences_end)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl Parked for Baton {
    fn lease(&self) -> Duration {
        self.lease
    }

    /// Its watchdog entry ends and the engine is told.
    fn strand(self, key: &str) {
        self.watchdog.unregister(self.watchdog_id);
        self.releaser
            .release_in_background(key.to_owned(), self.owner, None);
    }
}
