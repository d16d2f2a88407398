//! Scoped holds in their body's first step, within the watchdog's sight.
//!
//! A scoped hold is registered with the watchdog when its body first waits ([`Held::watch`]):
//! most bodies end in their first step and are never registered. A body may instead block its
//! thread in that step (a synchronous call in async code) for longer than a third of its
//! lease, and the watchdog, running on another worker, must renew it all the same. So while a
//! body takes its first step, its hold is published in a slot of the polling thread, with its
//! watchdog and the instant its first renewal falls due; the watchdog plans a look by then
//! ([`Watchdog::look_by`]), and at that look registers every hold of its own published in a
//! slot and due (from then on renewed like any other). A hold whose first step is over by then
//! was registered by its body, or has ended: registering it again does nothing.
//!
//! A slot keeps its last hold (a weak reference) until the next publication on its thread or
//! the watchdog's look, so that publishing costs one short lock and no withdrawal. Ordering:
//! the body publishes, then reads the look planned; the watchdog plans its look, then reads
//! the slots (see [`Watchdog::look_by`]), so either the body sees a look planned too late and
//! asks for an earlier one, or the watchdog sees the hold.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use tokio::time::Instant;

use super::Watchdog;
use crate::held::Held;

/// One thread's slot.
#[derive(Default)]
struct Slot {
    published: Mutex<Option<Published>>,
}

/// A hold published in a slot.
struct Published {
    held: Weak<Held>,
    /// Its watchdog's address (which runtime's it is).
    watchdog: usize,
    /// When its first renewal falls due.
    due: Instant,
}

impl Slot {
    fn published(&self) -> MutexGuard<'_, Option<Published>> {
        // One field replaced at a time: a poisoned lock is consistent.
        self.published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Every slot made so far, and those free (their thread ended).
#[derive(Default)]
struct Slots {
    all: Vec<Arc<Slot>>,
    free: Vec<Arc<Slot>>,
}

static SLOTS: Mutex<Slots> = Mutex::new(Slots {
    all: Vec::new(),
    free: Vec::new(),
});

fn slots() -> MutexGuard<'static, Slots> {
    // Plain pushes and pops: a poisoned lock is consistent.
    SLOTS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A thread's slot, handed back to the free ones when the thread ends.
struct ThreadSlot(Arc<Slot>);

impl ThreadSlot {
    fn take() -> Self {
        let mut slots = slots();
        let slot = slots.free.pop().unwrap_or_else(|| {
            let slot = Arc::new(Slot::default());
            slots.all.push(slot.clone());
            slot
        });
        Self(slot)
    }
}

impl Drop for ThreadSlot {
    fn drop(&mut self) {
        // The ended thread's last hold is not its concern any more.
        self.0.published().take();
        slots().free.push(self.0.clone());
    }
}

thread_local! {
    static SLOT: ThreadSlot = ThreadSlot::take();
}

fn address(watchdog: &Watchdog) -> usize {
    std::ptr::from_ref(watchdog) as usize
}

/// Publishes the hold `held`, whose body is about to take its first step, for its watchdog
/// (see the module). A thread that is ending has no slot: its hold is registered at once.
pub(crate) fn publish(held: &Arc<Held>) {
    let watchdog = &held.core.watchdog;
    let due = held.first_due();
    let published = SLOT.try_with(|slot| {
        *slot.0.published() = Some(Published {
            held: Arc::downgrade(held),
            watchdog: address(watchdog),
            due,
        });
    });
    match published {
        Ok(()) => watchdog.look_by(due),
        Err(_) => {
            held.watch();
        }
    }
}

/// Registers the holds of `watchdog` published in a slot and due by `by`. Whether it
/// registered any, and the earliest due of those published and not due yet.
pub(super) fn sweep(watchdog: &Watchdog, by: Instant) -> (bool, Option<Instant>) {
    let me = address(watchdog);
    let all = slots().all.clone();
    let mut due = Vec::new();
    let mut earliest: Option<Instant> = None;
    for slot in &all {
        let mut published = slot.published();
        match published.as_ref() {
            Some(p) if p.watchdog == me && p.due <= by => {
                if let Some(p) = published.take() {
                    due.push(p.held);
                }
            }
            Some(p) if p.watchdog == me => {
                earliest = Some(earliest.map_or(p.due, |e| e.min(p.due)));
            }
            _ => {}
        }
    }
    // Outside the slots' locks: registering takes the watchdog's.
    let mut registered = false;
    for held in due {
        if let Some(held) = held.upgrade() {
            registered |= held.watch();
        }
    }
    (registered, earliest)
}
