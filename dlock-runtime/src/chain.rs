//! The call chain: the dynamic extent of an annotated call or of `with_lock`, and the holds it
//! owns (reentrancy). Spawned tasks do not inherit it: another task is another owner.

use std::cell::RefCell;
use std::future::Future;
use std::sync::Arc;

use crate::held::Held;

tokio::task_local! {
    /// The locks held by one call chain (the dynamic extent of an annotated call or of
    /// [`with_lock`]). Spawned tasks do not inherit it: another task is another owner.
    pub(crate) static CHAIN: RefCell<ChainHolds>;
}

/// The holds of one call chain, innermost last. The first lives inline: a chain that holds
/// one lock at a time never allocates.
#[derive(Default)]
pub(crate) struct ChainHolds {
    first: Option<Arc<Held>>,
    more: Vec<Arc<Held>>,
}

impl ChainHolds {
    /// Innermost first.
    pub(crate) fn iter_rev(&self) -> impl Iterator<Item = &Arc<Held>> {
        self.more.iter().rev().chain(self.first.iter())
    }

    pub(crate) fn find(&self, runtime: u64, key: &str) -> Option<Arc<Held>> {
        self.iter_rev()
            .find(|h| h.core.id == runtime && h.key == key)
            .cloned()
    }

    pub(crate) fn push(&mut self, held: Arc<Held>) {
        if self.first.is_none() && self.more.is_empty() {
            self.first = Some(held);
        } else {
            self.more.push(held);
        }
    }

    fn remove(&mut self, held: &Arc<Held>) {
        if let Some(i) = self.more.iter().rposition(|h| Arc::ptr_eq(h, held)) {
            self.more.remove(i);
        } else if self.first.as_ref().is_some_and(|h| Arc::ptr_eq(h, held)) {
            self.first = None;
        }
    }
}

/// Whether this task is inside a call chain.
pub(crate) fn in_chain() -> bool {
    CHAIN.try_with(|_| ()).is_ok()
}

/// Runs `fut` as a new call chain (a plain function: an `async fn` would store `fut` twice).
pub(crate) fn new_chain<F: Future>(
    fut: F,
) -> tokio::task::futures::TaskLocalFuture<RefCell<ChainHolds>, F> {
    CHAIN.scope(RefCell::default(), fut)
}

/// Forgets the innermost occurrence of `held` in the current chain (no-op elsewhere).
pub(crate) fn leave_chain(held: &Arc<Held>) {
    let _ = CHAIN.try_with(|c| c.borrow_mut().remove(held));
}

/// The fencing token of the innermost lock held by this call chain, if any.
///
/// Pass it to the storage you write under the lock so it can reject a stale holder.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock_runtime::LockError> {
/// # let rt = dlock_runtime::Runtime::from_url("memory://").await?;
/// # rt.scope(async {
/// use dlock_runtime::{current_fence, lock, with_lock};
/// assert_eq!(current_fence(), None);
/// let fence = with_lock(lock("ledger"), async { current_fence() }).await?;
/// assert!(fence.is_some());
/// # Ok::<(), dlock_runtime::LockError>(()) }).await?;
/// # Ok(()) }
/// ```
pub fn current_fence() -> Option<u64> {
    CHAIN
        .try_with(|c| {
            c.borrow()
                .iter_rev()
                .find(|h| h.is_held())
                .and_then(|h| h.fence)
        })
        .ok()
        .flatten()
}
