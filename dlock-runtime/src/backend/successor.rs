//! The waiters of this runtime in an engine's own queue (etcd, ZooKeeper), by the entry each
//! watches as its predecessor, so that a holder of this runtime hands its key to the waiter
//! right behind it without waiting for the engine.
//!
//! Invariant: a waiter is registered ([`Successors::watch`]) exactly while it watches (the
//! [`Watching`] guard); a hand-over ([`Successors::hand_over`]) reaches at most the one waiter
//! registered on the holder's entry, and two waiters on one entry are both left to the engine.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

/// One registered waiter: its registration id and where its hand-over goes.
struct Waiter {
    id: u64,
    handed: oneshot::Sender<()>,
}

/// The waiters of one backend by the entry they watch.
#[derive(Default)]
pub(crate) struct Successors {
    by_predecessor: Mutex<HashMap<Vec<u8>, Vec<Waiter>>>,
    next_id: AtomicU64,
}

impl std::fmt::Debug for Successors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Successors")
            .field("watched", &self.map().len())
            .finish()
    }
}

impl Successors {
    fn map(&self) -> MutexGuard<'_, HashMap<Vec<u8>, Vec<Waiter>>> {
        // Plain map updates: a poisoned lock is consistent.
        self.by_predecessor
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a waiter watching `predecessor`; it stays registered until the returned
    /// [`Watching`] is dropped.
    pub(crate) fn watch(&self, predecessor: &[u8]) -> Watching<'_> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (handed, receiver) = oneshot::channel();
        self.map()
            .entry(predecessor.to_vec())
            .or_default()
            .push(Waiter { id, handed });
        Watching {
            successors: self,
            predecessor: predecessor.to_vec(),
            id,
            handed: receiver,
        }
    }

    /// The hold of the (exclusive) holder whose entry is `entry` has ended: hands its key to
    /// the one waiter of this runtime watching that entry, if exactly one does. `true` when
    /// one was told (it may still decline, or be gone already).
    pub(crate) fn hand_over(&self, entry: &[u8]) -> bool {
        let Some(waiters) = self.map().remove(entry) else {
            return false;
        };
        let mut waiters = waiters.into_iter();
        match (waiters.next(), waiters.next()) {
            (Some(only), None) => only.handed.send(()).is_ok(),
            _ => false,
        }
    }
}

/// A waiter's registration (see [`Successors::watch`]); dropped, it takes its name off.
pub(crate) struct Watching<'a> {
    successors: &'a Successors,
    predecessor: Vec<u8>,
    id: u64,
    handed: oneshot::Receiver<()>,
}

impl Watching<'_> {
    /// Resolves when the holder ahead handed its key over; never otherwise.
    pub(crate) async fn handed(&mut self) {
        if (&mut self.handed).await.is_err() {
            // Taken off without a hand-over (another waiter claimed the same predecessor, or
            // the holder's release found two): only the engine's events tell now.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        let mut map = self.successors.map();
        if let Some(waiters) = map.get_mut(&self.predecessor) {
            waiters.retain(|w| w.id != self.id);
            if waiters.is_empty() {
                map.remove(&self.predecessor);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn handed_within(watching: &mut Watching<'_>, within: Duration) -> bool {
        tokio::time::timeout(within, watching.handed())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn the_one_waiter_behind_an_entry_is_handed_its_key() {
        let successors = Successors::default();
        let mut behind_a = successors.watch(b"a");
        let mut behind_b = successors.watch(b"b");
        assert!(successors.hand_over(b"a"));
        assert!(handed_within(&mut behind_a, Duration::from_millis(10)).await);
        assert!(!handed_within(&mut behind_b, Duration::from_millis(10)).await);
        // Once: a second release of the same entry finds nobody.
        assert!(!successors.hand_over(b"a"));
    }

    #[tokio::test]
    async fn a_waiter_gone_is_not_handed_anything() {
        let successors = Successors::default();
        drop(successors.watch(b"a"));
        assert!(!successors.hand_over(b"a"));
        assert!(successors.map().is_empty(), "registrations are taken off");
    }

    #[tokio::test]
    async fn two_waiters_on_one_predecessor_are_left_to_the_engine() {
        let successors = Successors::default();
        let mut first = successors.watch(b"a");
        let mut second = successors.watch(b"a");
        assert!(!successors.hand_over(b"a"));
        assert!(!handed_within(&mut first, Duration::from_millis(10)).await);
        assert!(!handed_within(&mut second, Duration::from_millis(10)).await);
        drop((first, second));
        assert!(successors.map().is_empty());
    }
}
