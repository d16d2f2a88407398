//! The fault injector: until the run's end, every 0.5–2 s one fault from the list, chosen at
//! random: SIGKILL a worker (and start a new one), SIGSTOP a worker past its lease (and its
//! ZooKeeper session) then SIGCONT it, or restart the lock engine.

use std::time::{Duration, Instant};

use crate::cli::Fault;
use crate::engine::{LockEngine, Profile};
use crate::pool::Pool;
use crate::rng::Rng;

/// How often the injector prints what it did so far.
const PROGRESS_EVERY: Duration = Duration::from_secs(30);

/// What the injector did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Injected {
    pub(crate) kills: u32,
    pub(crate) pauses: u32,
    pub(crate) restarts: u32,
    /// When the last fault ended (a dead holder's lock is free a lease after that).
    pub(crate) last: Option<Instant>,
}

/// Injects `faults` into `pool` and `engine` until `until`; also replaces any worker that
/// exited by itself (and notes it as a failure).
pub(crate) async fn inject(
    pool: &mut Pool,
    engine: &mut LockEngine,
    faults: &[Fault],
    (profile, keys): (Profile, &[String]),
    until: Instant,
    rng: &mut Rng,
) -> Result<Injected, String> {
    let mut injected = Injected::default();
    let start = Instant::now();
    let mut progress = start + PROGRESS_EVERY;
    loop {
        let gap = Duration::from_millis(500 + rng.below(1500) as u64);
        let now = Instant::now();
        if now + gap >= until {
            tokio::time::sleep(until.saturating_duration_since(now)).await;
            pool.reap_exited();
            return Ok(injected);
        }
        tokio::time::sleep(gap).await;
        pool.reap_exited();
        if faults.is_empty() {
            continue;
        }
        match faults[rng.below(faults.len())] {
            Fault::Kill => {
                pool.kill_one(rng)?;
                injected.kills += 1;
            }
            Fault::Pause => {
                pool.pause_one(rng, profile.pause()).await;
                injected.pauses += 1;
            }
            Fault::Restart => {
                engine.restart(rng, keys).await;
                injected.restarts += 1;
            }
        }
        injected.last = Some(Instant::now());
        if Instant::now() >= progress {
            progress += PROGRESS_EVERY;
            eprintln!(
                "  {:>4} s: {} kills, {} pauses, {} restarts, {} workers started",
                start.elapsed().as_secs(),
                injected.kills,
                injected.pauses,
                injected.restarts,
                pool.started()
            );
        }
    }
}
