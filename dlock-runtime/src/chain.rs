//! The call chain: the dynamic extent of an annotated call or of `with_lock`, and the holds it
//! owns (reentrancy).
//!
//! Every annotated call and every `with_lock` runs its body in a new [`Frame`] whose parent is
//! the frame it was called from. A lookup walks from the innermost frame outwards, so a nested
//! call finds the holds of its callers, while two sub-futures polled side by side (`join!`,
//! `join_all`) each run in a frame of their own and never see each other's holds: they are
//! different owners. Spawned tasks do not inherit the frame at all.
//!
//! A body runs with its [`Scope`] (the guard of the acquisition that opened it, and the frame,
//! allocated only when something in the body asks for it) as the innermost level while it is
//! polled ([`in_level`]): a scoped thread-local points at it for the length of that poll, as a
//! task-local would, without moving the scope in and out of the thread's slot at every poll.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::guard::LockGuard;
use crate::held::{Held, Registry};

scoped_tls::scoped_thread_local! {
    /// The innermost level of the call chain whose body this thread is polling.
    static CHAIN: Scope
}

/// The innermost level of a call chain as its body's [`InChain`] holds it: the guard of the
/// scoped acquisition that opened it (kept here while the body runs), and the frame itself,
/// made the first time something asks for it (a nested call, a plain `acquire()`). Most bodies
/// never ask, and then no frame is allocated.
pub(crate) struct Scope {
    id: u64,
    parent: Option<Arc<Frame>>,
    /// Taken back when the body ends.
    guard: Option<LockGuard>,
    frame: std::cell::OnceCell<Arc<Frame>>,
}

impl Scope {
    /// The level `id` below `parent`, opened by the acquisition of `guard`: the holds it took
    /// fresh (not re-entered) are this level's.
    pub(crate) fn new(id: u64, parent: Option<Arc<Frame>>, guard: LockGuard) -> Self {
        Self {
            id,
            parent,
            guard: Some(guard),
            frame: std::cell::OnceCell::new(),
        }
    }

    /// The guard of the acquisition that opened this level, until the body ends.
    pub(crate) fn guard(&self) -> Option<&LockGuard> {
        self.guard.as_ref()
    }

    /// The guard handed back when the body ends (`None` once taken).
    pub(crate) fn take_guard(&mut self) -> Option<LockGuard> {
        self.guard.take()
    }

    /// The holds taken fresh by the acquisition that opened this level, in canonical order.
    fn fresh(&self) -> impl DoubleEndedIterator<Item = &Arc<Held>> {
        self.guard.iter().flat_map(LockGuard::fresh_holds)
    }

    fn frame(&self) -> Arc<Frame> {
        self.frame
            .get_or_init(|| {
                let mut fresh = self.fresh();
                let frame = Frame::new(self.id, self.parent.clone(), fresh.next().cloned());
                for held in fresh {
                    frame.push(held.clone());
                }
                frame
            })
            .clone()
    }

    /// The fence of the innermost hold still in force, searched from this level outwards:
    /// `Some(fence)` for the first such hold (whose fence may be `None`), `None` without one.
    fn innermost_fence(&self) -> Option<Option<u64>> {
        if let Some(frame) = self.frame.get() {
            return frame.innermost_fence();
        }
        match self.fresh().rev().find(|h| h.is_held()) {
            Some(held) => Some(held.fence),
            None => self.parent.as_ref().and_then(|p| p.innermost_fence()),
        }
    }
}

/// Frame ids start at 1: 0 stands for "no frame".
static NEXT_FRAME: AtomicU64 = AtomicU64::new(1);

/// Frame ids a thread takes from [`NEXT_FRAME`] at a time.
const ID_BLOCK: u64 = 1024;

/// One level of a call chain: the body of one annotated call or `with_lock`.
pub(crate) struct Frame {
    /// Unique for the life of the process.
    pub(crate) id: u64,
    parent: Option<Arc<Frame>>,
    /// Locks acquired fresh in this frame: the scoped acquisition that opened it, then plain
    /// `acquire()`s made in its body, innermost last.
    holds: Mutex<ChainHolds>,
}

impl Frame {
    /// A fresh frame id, taken before the acquisition that opens the frame.
    pub(crate) fn next_id() -> u64 {
        thread_local! {
            /// The next id of this thread's block, and the end of the block.
            static IDS: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
        }
        IDS.with(|ids| {
            let (mut next, mut end) = ids.get();
            if next == end {
                next = NEXT_FRAME.fetch_add(ID_BLOCK, Ordering::Relaxed);
                end = next + ID_BLOCK;
            }
            ids.set((next + 1, end));
            next
        })
    }

    /// A frame below `parent`, holding `held` if the call that opens it acquired fresh.
    pub(crate) fn new(id: u64, parent: Option<Arc<Frame>>, held: Option<Arc<Held>>) -> Arc<Self> {
        Arc::new(Self {
            id,
            parent,
            holds: Mutex::new(ChainHolds {
                first: held,
                more: Vec::new(),
            }),
        })
    }

    /// This frame, then its callers' frames.
    fn lineage(&self) -> impl Iterator<Item = &Frame> {
        std::iter::successors(Some(self), |f| f.parent.as_deref())
    }

    /// The innermost hold of `key` in `runtime` visible from this frame.
    pub(crate) fn find(&self, runtime: u64, key: &str) -> Option<Arc<Held>> {
        self.lineage()
            .find_map(|f| f.lock_holds().find(runtime, key))
    }

    /// See [`Scope::innermost_fence`].
    fn innermost_fence(&self) -> Option<Option<u64>> {
        self.lineage().find_map(|f| {
            f.lock_holds()
                .iter_rev()
                .find(|h| h.is_held())
                .map(|h| h.fence)
        })
    }

    pub(crate) fn push(&self, held: Arc<Held>) {
        self.lock_holds().push(held);
    }

    fn lock_holds(&self) -> std::sync::MutexGuard<'_, ChainHolds> {
        // Nothing panics while holding it; a poisoned lock still holds consistent data.
        self.holds.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Registry for Frame {
    fn descends_from(&self, id: u64) -> bool {
        self.lineage().any(|f| f.id == id)
    }

    fn remove(&self, held: &Arc<Held>) {
        self.lock_holds().remove(held);
    }
}

/// The holds of one frame, innermost last. The first lives inline: a frame opened by a
/// scoped acquisition never allocates for it.
#[derive(Default)]
struct ChainHolds {
    first: Option<Arc<Held>>,
    more: Vec<Arc<Held>>,
}

impl ChainHolds {
    /// Innermost first.
    fn iter_rev(&self) -> impl Iterator<Item = &Arc<Held>> {
        self.more.iter().rev().chain(self.first.iter())
    }

    fn find(&self, runtime: u64, key: &str) -> Option<Arc<Held>> {
        self.iter_rev()
            .find(|h| h.core.id == runtime && h.key == key)
            .cloned()
    }

    fn push(&mut self, held: Arc<Held>) {
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

/// The innermost frame of the running call chain, if any.
pub(crate) fn current_frame() -> Option<Arc<Frame>> {
    // `with` is only called once `is_set` said a level is in force.
    CHAIN.is_set().then(|| CHAIN.with(Scope::frame))
}

/// Runs `f` with `scope` as the innermost level of the call chain on this thread (the body
/// of that level is polled, or dropped, inside).
pub(crate) fn in_level<R>(scope: &Scope, f: impl FnOnce() -> R) -> R {
    CHAIN.set(scope, f)
}

/// The fencing token of the innermost lock held by this call chain, if any.
///
/// Pass it to the storage you write under the lock so it can reject a stale holder. In the
/// body of a multi-key lock (`keys = [..]`, `with_lock(lock_all(..))`) it is the token of the
/// last key, in canonical order, that the call acquired (not re-entered); the guard's
/// [`fences`](crate::guard::LockGuard::fences) gives every key's.
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
    if !CHAIN.is_set() {
        return None;
    }
    // `with` is only called once `is_set` said a level is in force.
    CHAIN.with(Scope::innermost_fence).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads take ids in blocks of their own: no id is ever handed out twice, and none is 0.
    #[test]
    fn frame_ids_are_unique_across_threads() {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    (0..3 * ID_BLOCK)
                        .map(|_| Frame::next_id())
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        let mut ids: Vec<u64> = threads
            .into_iter()
            .flat_map(|t| t.join().expect("thread"))
            .chain((0..10).map(|_| Frame::next_id()))
            .collect();
        let taken = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), taken, "an id was handed out twice");
        assert!(!ids.contains(&0));
    }
}
