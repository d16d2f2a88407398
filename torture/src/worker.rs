//! A worker: tasks that take one of a few keys through the public API (`with_lock`, watchdog on,
//! `on_lost` cancel) and run the critical section on the store, in a loop until told to stop.
//!
//! The critical section: take the fence (`current_fence()`), claim it in the store, read the
//! counter, log the intent, write counter + 1 with the fence, log the outcome. Redlock gives no
//! fence: there the section writes without a claim (fence 0, always accepted).
//!
//! In `--mode semaphore` a task takes one permit of the key's semaphore and holds it for a
//! moment (0–4 ms), logging its end (`held`); in `--mode rw` a task is a reader (read lock; it
//! reads the counter, holds a moment, logs `read`; its section id ends in `r`) or, one time in
//! five, a writer running the exclusive section above under the write lock.
//!
//! With the `block` fault, one section in 200 first blocks its thread (a synchronous sleep,
//! before the body's first await) for one and a half leases, at most one task of a process at a
//! time: the runtime must keep renewing the lock meanwhile (the worker runtime has two threads).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use dlock_runtime::{LockError, Runtime, current_fence, with_lock};
use tokio::sync::Notify;

use crate::cli::{Mode, WorkerArgs};
use crate::rng::Rng;
use crate::store::{End, Intent, Outcome, Record, Store, Written, key_name, now_ns};

/// How long a new worker keeps trying to reach a lock engine that is restarting.
const CONNECT_WITHIN: Duration = Duration::from_secs(60);

/// Pause after a lock or store error before the next attempt.
const BACKOFF: Duration = Duration::from_millis(50);

/// With the `block` fault: one section in this many blocks its thread first.
const BLOCK_ONE_IN: usize = 200;

/// Whether a task of this process is blocking its thread now (one at a time: the others and
/// the runtime's own tasks keep the remaining thread).
static BLOCKING: AtomicBool = AtomicBool::new(false);

/// Set once: the tasks finish their current section and return.
#[derive(Clone, Default)]
pub(crate) struct Stop(Arc<AtomicBool>);

impl Stop {
    pub(crate) fn set(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// What one worker's tasks saw, besides what they logged.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Tally {
    /// Sections whose body ran to the end.
    pub(crate) completed: u64,
    /// `with_lock` returned `Lost`: the runtime cancelled the body.
    pub(crate) lost: u64,
    /// `with_lock` returned `Timeout`.
    pub(crate) timeouts: u64,
    /// Other lock errors (`Backend` while the engine restarts).
    pub(crate) lock_errors: u64,
    /// Store calls that failed.
    pub(crate) store_errors: u64,
    /// Sections that blocked their thread first (the `block` fault).
    pub(crate) blocked: u64,
}

impl Tally {
    /// The line a worker process prints when it stops.
    fn line(&self, id: u32) -> String {
        format!(
            "worker {id} done: {} sections, {} lost, {} timeouts, {} lock errors, {} store errors, \
             {} blocked",
            self.completed,
            self.lost,
            self.timeouts,
            self.lock_errors,
            self.store_errors,
            self.blocked
        )
    }

    /// Reads [`Tally::line`] back from a worker's log.
    pub(crate) fn from_log(log: &str) -> Option<Tally> {
        let line = log
            .lines()
            .rev()
            .find(|l| l.starts_with("worker ") && l.contains(" done: "))?;
        let numbers: Vec<u64> = line
            .split_once(" done: ")?
            .1
            .split(", ")
            .map(|part| part.split(' ').next()?.parse().ok())
            .collect::<Option<_>>()?;
        let [
            completed,
            lost,
            timeouts,
            lock_errors,
            store_errors,
            blocked,
        ] = numbers.as_slice()
        else {
            return None;
        };
        Some(Tally {
            completed: *completed,
            lost: *lost,
            timeouts: *timeouts,
            lock_errors: *lock_errors,
            store_errors: *store_errors,
            blocked: *blocked,
        })
    }

    pub(crate) fn add(&mut self, other: Tally) {
        self.completed += other.completed;
        self.lost += other.lost;
        self.timeouts += other.timeouts;
        self.lock_errors += other.lock_errors;
        self.store_errors += other.store_errors;
        self.blocked += other.blocked;
    }
}

/// One worker: its runtime, the store, and how it takes locks.
pub(crate) struct Worker {
    id: u32,
    rt: Runtime,
    store: Store,
    keys: usize,
    lease: Duration,
    wait: Duration,
    /// Whether sections take the lock (`false` only to check the checker).
    locked: bool,
    mode: Mode,
    /// How long a section blocks its thread with the `block` fault (`None`: never).
    block: Option<Duration>,
    /// Sections that blocked their thread.
    blocked: AtomicU64,
    next_section: AtomicU64,
    /// End records still being appended from `Drop` (cancelled bodies).
    pending: Arc<Pending>,
}

impl Worker {
    pub(crate) fn new(args: &WorkerArgs, rt: Runtime, store: Store) -> Worker {
        Worker {
            id: args.id,
            rt,
            store,
            keys: args.keys,
            lease: args.lease,
            wait: args.wait,
            locked: args.locked,
            mode: args.mode,
            block: args.block.then(|| args.lease + args.lease / 2),
            blocked: AtomicU64::new(0),
            next_section: AtomicU64::new(1),
            pending: Arc::default(),
        }
    }

    /// Runs `tasks` tasks until `stop`, then waits for the records of cancelled bodies.
    pub(crate) async fn run(self: Arc<Self>, tasks: usize, stop: Stop) -> Tally {
        let handles: Vec<_> = (0..tasks)
            .map(|task| {
                let worker = self.clone();
                let stop = stop.clone();
                tokio::spawn(async move { worker.task(task, stop).await })
            })
            .collect();
        let mut tally = Tally::default();
        for handle in handles {
            match handle.await {
                Ok(t) => tally.add(t),
                Err(e) => {
                    eprintln!("worker {}: a task failed: {e}", self.id);
                    tally.store_errors += 1;
                }
            }
        }
        self.pending.drained().await;
        tally.blocked = self.blocked.load(Ordering::Relaxed);
        tally
    }

    async fn task(&self, task: usize, stop: Stop) -> Tally {
        let mut tally = Tally::default();
        let mut rng = Rng::new(u64::from(self.id) << 16 | task as u64);
        while !stop.is_set() {
            let key = key_name(rng.below(self.keys));
            let mut id = format!(
                "w{}.{}",
                self.id,
                self.next_section.fetch_add(1, Ordering::Relaxed)
            );
            let hold_for = Duration::from_millis(rng.below(5) as u64);
            let block = self.block.filter(|_| rng.below(BLOCK_ONE_IN) == 0);
            let (lock, section) = match self.mode {
                Mode::Exclusive => (self.rt.lock(key.clone()), Section::Write),
                Mode::Semaphore(n) => (self.rt.semaphore(key.clone(), n), Section::Hold),
                Mode::Rw if rng.below(100) < Mode::READ_PERCENT => {
                    id.push(READER);
                    (self.rt.lock(key.clone()).read(), Section::Read)
                }
                Mode::Rw => (self.rt.lock(key.clone()), Section::Write),
            };
            let lock = lock.lease(self.lease).wait(self.wait);
            let body = self.section(&key, id, section, (hold_for, block));
            let outcome = if self.locked {
                with_lock(lock, body).await
            } else {
                Ok(body.await)
            };
            match outcome {
                Ok(Ok(())) => tally.completed += 1,
                Ok(Err(e)) => {
                    eprintln!("worker {}: {e}", self.id);
                    tally.store_errors += 1;
                    tokio::time::sleep(BACKOFF).await;
                }
                Err(LockError::Timeout { .. }) => tally.timeouts += 1,
                Err(LockError::Lost { .. }) => tally.lost += 1,
                Err(e) => {
                    tally.lock_errors += 1;
                    if tally.lock_errors % 100 == 1 {
                        eprintln!("worker {}: {e}", self.id);
                    }
                    tokio::time::sleep(BACKOFF).await;
                }
            }
        }
        tally
    }

    /// The critical section, run while holding `key`.
    async fn section(
        &self,
        key: &str,
        id: String,
        section: Section,
        (hold_for, block): (Duration, Option<Duration>),
    ) -> Result<(), String> {
        // In the body's first step, before any await.
        if let Some(block) = block
            && BLOCKING
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            std::thread::sleep(block);
            BLOCKING.store(false, Ordering::Release);
            self.blocked.fetch_add(1, Ordering::Relaxed);
        }
        let start = now_ns();
        let fence = current_fence();
        let mut end = EndOnDrop::new(
            self,
            End {
                id: id.clone(),
                key: key.to_owned(),
                fence,
                start,
                end: 0,
                outcome: Outcome::Cancelled,
            },
        );
        let done = match section {
            Section::Write => self.claim_read_write(key, id, fence, start).await,
            Section::Hold => {
                tokio::time::sleep(hold_for).await;
                Ok(Outcome::Held)
            }
            Section::Read => match self.store.counter(key).await {
                Ok(_) => {
                    tokio::time::sleep(hold_for).await;
                    Ok(Outcome::Read)
                }
                Err(e) => Err(e),
            },
        };
        match done {
            Ok(outcome) => end.finish(outcome).await,
            Err(e) => {
                end.fail();
                Err(e)
            }
        }
    }

    /// Claims the fence, reads the counter, logs the intent and writes counter + 1.
    async fn claim_read_write(
        &self,
        key: &str,
        id: String,
        fence: Option<u64>,
        start: u64,
    ) -> Result<Outcome, String> {
        let fenced = self.store.fenced();
        if let Some(fence) = fence {
            let claimed = fenced.claim(key, fence).await.map_err(|e| e.to_string())?;
            if !claimed {
                return Ok(Outcome::ClaimRejected);
            }
        }
        let prev = self.store.counter(key).await?;
        let next = Written {
            n: prev.as_ref().map_or(0, |w| w.n) + 1,
            by: id.clone(),
        };
        let intent = Intent {
            id,
            key: key.to_owned(),
            fence,
            start,
            at: now_ns(),
            n: next.n,
            prev: prev.map(|w| w.by),
        };
        self.store.append(&Record::Intent(intent)).await?;
        let accepted = fenced
            .write(key, &next.to_string(), fence.unwrap_or(0))
            .await
            .map_err(|e| e.to_string())?;
        Ok(if accepted {
            Outcome::Accepted
        } else {
            Outcome::Rejected
        })
    }
}

/// The suffix of a reader's section id (`--mode rw`): the checker tells readers by it, even
/// when a cancelled reader's end record says only `cancelled`.
pub(crate) const READER: char = 'r';

/// What a section does while it holds its key.
#[derive(Clone, Copy, Debug)]
enum Section {
    /// The fenced read-modify-write (the exclusive lock, a writer).
    Write,
    /// Holds a permit for a moment.
    Hold,
    /// Reads the counter and holds the read lock for a moment.
    Read,
}

/// The end record of a section: appended by [`finish`](EndOnDrop::finish), or from `Drop` if the
/// body was cancelled or failed first (outcome `Cancelled`, or `Failed` after a store error).
struct EndOnDrop {
    record: Option<End>,
    store: Store,
    pending: Arc<Pending>,
}

impl EndOnDrop {
    fn new(worker: &Worker, record: End) -> EndOnDrop {
        EndOnDrop {
            record: Some(record),
            store: worker.store.clone(),
            pending: worker.pending.clone(),
        }
    }

    /// A store call failed: `Drop` appends the record with outcome `Failed`.
    fn fail(&mut self) {
        if let Some(record) = self.record.as_mut() {
            record.outcome = Outcome::Failed;
        }
    }

    async fn finish(&mut self, outcome: Outcome) -> Result<(), String> {
        let Some(record) = self.record.as_mut() else {
            return Ok(());
        };
        record.outcome = outcome;
        record.end = now_ns();
        let record = Record::End(record.clone());
        self.store.append(&record).await?;
        self.record = None;
        Ok(())
    }
}

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        let Some(mut record) = self.record.take() else {
            return;
        };
        // Non-zero when `finish` was cut short while appending: its outcome and time stand.
        if record.end == 0 {
            record.end = now_ns();
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.store.clone();
        let pending = self.pending.clone();
        pending.start();
        runtime.spawn(async move {
            if let Err(e) = store.append(&Record::End(record)).await {
                eprintln!("{e}");
            }
            pending.done();
        });
    }
}

/// Appends in flight from `Drop`.
#[derive(Default)]
struct Pending {
    count: AtomicUsize,
    zero: Notify,
}

impl Pending {
    fn start(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
    }

    fn done(&self) {
        if self.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.zero.notify_waiters();
        }
    }

    async fn drained(&self) {
        loop {
            let notified = self.zero.notified();
            if self.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// A worker process: connects, runs until SIGTERM, prints its tally.
pub(crate) async fn run_process(args: WorkerArgs) -> Result<(), String> {
    let rt = connect_lock(&args.lock_url).await?;
    let store = Store::connect(&args.store_url).await?;
    let worker = Arc::new(Worker::new(&args, rt, store));
    let stop = Stop::default();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("listen for SIGTERM: {e}"))?;
    let on_term = stop.clone();
    tokio::spawn(async move {
        term.recv().await;
        on_term.set();
    });
    let tally = worker.run(args.tasks, stop).await;
    println!("{}", tally.line(args.id));
    Ok(())
}

/// A runtime on `url`, retrying while the engine is down (a restart in progress).
async fn connect_lock(url: &str) -> Result<Runtime, String> {
    let deadline = tokio::time::Instant::now() + CONNECT_WITHIN;
    loop {
        match Runtime::from_url(url).await {
            Ok(rt) => return Ok(rt),
            Err(e) if e.is_backend() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(format!("connect to the lock engine: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tally_line_reads_back() {
        let tally = Tally {
            completed: 10,
            lost: 2,
            timeouts: 3,
            lock_errors: 4,
            store_errors: 5,
            blocked: 6,
        };
        let log = format!("some warning\n{}\n", tally.line(7));
        let read = Tally::from_log(&log).expect("a tally");
        assert_eq!(
            (
                read.completed,
                read.lost,
                read.timeouts,
                read.lock_errors,
                read.store_errors,
                read.blocked
            ),
            (10, 2, 3, 4, 5, 6)
        );
        assert!(Tally::from_log("worker 7 crashed").is_none());
    }
}
