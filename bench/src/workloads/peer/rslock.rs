//! The comparison contender: rslock 0.10, the most used Rust Redis lock (`SET NX PX` to take,
//! a `GET` + `DEL` script to release, sleeps between tries).

use std::time::Duration;

use rslock::{Lock, LockError, LockManager};

use crate::BoxError;

/// Tries per `lock()` call and the upper bound of rslock's random sleep between two tries,
/// unless `DLOCK_BENCH_RSLOCK_RETRY=COUNT,DELAY_MS` says otherwise (worker processes inherit
/// it). The delay is rslock's default (200 ms: a sleep of 100 ms on average, so that waiting
/// tasks leave Redis to the holder); its default 3 tries give up within about 0.3 s, so the
/// count is raised to 50, a budget of about 5 s per call.
const RETRY: (u32, Duration) = (50, Duration::from_millis(200));

/// The variable that overrides [`RETRY`].
const RETRY_VAR: &str = "DLOCK_BENCH_RSLOCK_RETRY";

/// The retry settings in force: [`RETRY`] or [`RETRY_VAR`]'s.
pub(crate) fn retry() -> Result<(u32, Duration), BoxError> {
    match std::env::var(RETRY_VAR) {
        Ok(value) => parse_retry(&value),
        Err(_) => Ok(RETRY),
    }
}

/// Reads `COUNT,DELAY_MS`.
fn parse_retry(value: &str) -> Result<(u32, Duration), BoxError> {
    let bad = || format!("{RETRY_VAR}={value:?}: expected COUNT,DELAY_MS, both above 0");
    let (count, delay) = value.split_once(',').ok_or_else(bad)?;
    let count: u32 = count.trim().parse().map_err(|_| bad())?;
    let delay: u64 = delay.trim().parse().map_err(|_| bad())?;
    if count == 0 || delay == 0 {
        // rslock draws the sleep from 0..delay, which panics on an empty range
        return Err(bad().into());
    }
    Ok((count, Duration::from_millis(delay)))
}

/// The retry settings as the table states them, e.g. `50 tries, sleeps < 200 ms`.
pub(crate) fn retry_label() -> Result<String, BoxError> {
    let (count, delay) = retry()?;
    Ok(format!("{count} tries, sleeps < {} ms", delay.as_millis()))
}

/// rslock on one Redis server, over its own multiplexed connection.
#[derive(Clone)]
pub(crate) struct Rslock {
    manager: LockManager,
    lease: Duration,
}

impl Rslock {
    /// A lock manager for the server at `url` with `lease` and the retry settings of [`retry`]. The
    /// connection is opened by the first call.
    pub(crate) fn new(url: &str, lease: Duration) -> Result<Rslock, BoxError> {
        let mut manager = LockManager::from_clients(vec![redis::Client::open(url)?]);
        let (count, delay) = retry()?;
        manager.set_retry(count, delay);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_settings_read_count_and_delay() {
        assert_eq!(
            parse_retry("100, 50").unwrap(),
            (100, Duration::from_millis(50))
        );
        for bad in ["100", "0,50", "100,0", "x,50", "100,50ms"] {
            let e = parse_retry(bad).unwrap_err().to_string();
            assert!(e.contains("expected COUNT,DELAY_MS"), "{bad}: {e}");
        }
    }
}
