//! The comparison contender: rslock 0.10, the most used Rust Redis lock (`SET NX PX` to take,
//! a `GET` + `DEL` script to release, sleeps between tries).

use std::time::Duration;

use rslock::{Lock, LockError, LockManager};

use crate::BoxError;

/// Tries per `lock()` call. rslock sleeps a random time in `[0, RETRY_DELAY)` between tries
/// (its defaults are 3 tries and 200 ms, which give up within about 0.4 s); 500 tries of a
/// 10 ms delay give a call a budget of about 2.5 s, so that a waiting task gives up rarely.
pub(crate) const RETRY_COUNT: u32 = 500;

/// The upper bound of rslock's random sleep between tries: a 10 ms poll, on average 5 ms.
pub(crate) const RETRY_DELAY: Duration = Duration::from_millis(10);

/// rslock on one Redis server, over its own multiplexed connection.
#[derive(Clone)]
pub(crate) struct Rslock {
    manager: LockManager,
    lease: Duration,
}

impl Rslock {
    /// A lock manager for the server at `url` with `lease` and the retry settings above. The
    /// connection is opened by the first call.
    pub(crate) fn new(url: &str, lease: Duration) -> Result<Rslock, BoxError> {
        let mut manager = LockManager::from_clients(vec![redis::Client::open(url)?]);
        manager.set_retry(RETRY_COUNT, RETRY_DELAY);
        Ok(Rslock { manager, lease })
    }

    /// One `lock()` call: the lock, or `None` when every try of the budget found it taken.
    pub(crate) async fn lock(&self, key: &str) -> Result<Option<Lock>, BoxError> {
        match self.manager.lock(key, self.lease).await {
            Ok(lock) => Ok(Some(lock)),
            Err(LockError::Unavailable) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Releases `lock` (rslock's release is best effort and reports nothing).
    pub(crate) async fn unlock(&self, lock: Lock) {
        self.manager.unlock(&lock).await;
    }
}
