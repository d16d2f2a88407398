//! Scoped holds in their body's first step, within the watchdog's sight.
//!
//! A scoped hold is registered with the watchdog when its body first waits ([`FirstStep::watch`]):
//! most bodies end in their first step and are never registered. A body may instead block its
//! thread in that step (a synchronous call in async code) for longer than a third of its
//! lease, and the watchdog, running on another worker, must renew it all the same. So while a
//! body takes its first step, its hold is published in a slot of the polling thread. While
//! holds of its own are published, the watchdog looks at the slots at least once a period no
//! longer than the shortest of their renewal intervals, and registers those whose first
//! renewal is due (from then on renewed like any other). A body publishing a hold whose
//! renewal interval is shorter than that period, or when the watchdog is not looking, has it
//! look ([`Watchdog::cover_first_step`]); any other publication costs one short lock and two
//! loads.
//!
//! A publication lasts one step of its body: when the step returns, the slot holds again what
//! it held before (the hold of an enclosing body still in its step, or nothing). Ordering: the body publishes, then reads
//! whether the watchdog is looking; the watchdog clears that flag, then reads the slots: either
//! the body sees the flag cleared and has it look, or the watchdog sees the hold.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;

/// A scoped hold as the watchdog sees it in its first step.
pub(crate) trait FirstStep: Send + Sync {
    /// The id of its runtime's watchdog (see `Watchdog::id`).
    fn scheduler(&self) -> u64;
    /// Whether the watchdog does not track it yet.
    fn is_untracked(&self) -> bool;
    /// When its first renewal falls due.
    fn first_due(&self) -> Instant;
    /// The part of its lease counted on (renewals come every third of it).
    fn effective(&self) -> Duration;
    /// Has the watchdog track it, if it does not yet.
    fn watch(&self);
}

/// One thread's slot: the last hold published on the thread.
#[derive(Default)]
struct Slot {
    published: Mutex<Option<Weak<dyn FirstStep>>>,
}

impl Slot {
    fn published(&self) -> MutexGuard<'_, Option<Weak<dyn FirstStep>>> {
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

/// Publishes the hold `held`, whose body is about to take its first step, for its watchdog
/// (see the module), for as long as the returned value lives: the length of the step. The
/// caller then tells the watchdog (`Watchdog::first_step_published`). `None` on a thread that
/// is ending, which has no slot: register the hold at once instead.
pub(crate) fn publish<H: FirstStep + 'static>(held: &Arc<H>) -> Option<Published> {
    SLOT.try_with(|slot| {
        let weak: Weak<H> = Arc::downgrade(held);
        let weak: Weak<dyn FirstStep> = weak;
        Published {
            previous: slot.0.published().replace(weak),
        }
    })
    .ok()
}

/// A hold published in its thread's slot for one step of its body. Dropped when the step
/// returns, it puts back what the slot held before: the hold of the body around it, whose
/// step goes on (a nested locked call that ends within the outer body's first step must not
/// leave the outer hold out of the watchdog's sight).
#[must_use = "the hold is published only while this lives"]
pub(crate) struct Published {
    previous: Option<Weak<dyn FirstStep>>,
}

impl Drop for Published {
    fn drop(&mut self) {
        let previous = self.previous.take();
        let _ = SLOT.try_with(|slot| *slot.0.published() = previous);
    }
}

/// What the watchdog's look at the slots found.
#[derive(Debug, Default)]
pub(super) struct Sweep {
    /// The shortest renewal interval of its holds still in their first step (none left:
    /// `None`).
    pub(super) period: Option<Duration>,
    /// The earliest first renewal among them.
    pub(super) earliest: Option<Instant>,
}

/// Registers the holds of the watchdog `scheduler` published in a slot whose first renewal is
/// due by `by`, and drops from the slots the holds that are gone or registered already.
pub(super) fn sweep(scheduler: u64, by: Instant) -> Sweep {
    let all = slots().all.clone();
    let mut due = Vec::new();
    let mut found = Sweep::default();
    for slot in &all {
        let mut published = slot.published();
        let Some(held) = published.as_ref().map(Weak::upgrade) else {
            continue;
        };
        match held {
            Some(held) if held.scheduler() == scheduler => {
                if !held.is_untracked() {
                    // Registered by its body (or ended): no longer this slot's concern.
                    published.take();
                } else {
                    let at = held.first_due();
                    if at <= by {
                        published.take();
                        due.push(held);
                    } else {
                        let interval = held.effective() / 3;
                        found.period = Some(found.period.map_or(interval, |p| p.min(interval)));
                        found.earliest = Some(found.earliest.map_or(at, |e| e.min(at)));
                    }
                }
            }
            // Another runtime's.
            Some(_) => {}
            None => {
                published.take();
            }
        }
    }
    // Outside the slots' locks: registering takes the watchdog's.
    for held in due {
        held.watch();
    }
    found
}
