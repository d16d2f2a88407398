//! The fault injector: until the run's end (a time, and a number of sections), every 0.5–2 s
//! one fault from the list, dealt from a shuffled deck of it (each fault once a round): SIGKILL a worker (and start a new one), SIGSTOP a worker past its lease (and its
//! ZooKeeper session) then SIGCONT it, or restart the lock engine; and the network faults
//! (`network`): cut, black-hole or slow down one worker's links, or SIGSTOP the engine.

use std::time::{Duration, Instant};

use crate::cli::Fault;
use crate::engine::{LockEngine, Profile};
use crate::network::{self, Cost};
use crate::pool::Pool;
use crate::rng::Rng;
use crate::store::Store;

/// How often the injector prints what it did so far.
const PROGRESS_EVERY: Duration = Duration::from_secs(30);

/// When a run ends: at `at`, once at least `sections` sections ended.
pub(crate) struct RunEnd {
    pub(crate) at: Instant,
    pub(crate) sections: u64,
    pub(crate) store: Store,
}

impl RunEnd {
    pub(crate) async fn ended(&self) -> Result<u64, String> {
        self.store.ended().await
    }

    pub(crate) async fn reached(&self) -> Result<bool, String> {
        Ok(Instant::now() >= self.at && self.ended().await? >= self.sections)
    }
}

/// What the injector did.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Injected {
    pub(crate) kills: u32,
    pub(crate) pauses: u32,
    pub(crate) restarts: u32,
    /// When the last fault ended (a dead holder's lock is free a lease after that).
    pub(crate) last: Option<Instant>,
    /// When the last engine restart ended (some engines extend leases then).
    pub(crate) last_restart: Option<Instant>,
    /// The network faults (partition, blackhole, latency, engine-pause) and what they cost.
    pub(crate) network: [(Fault, Cost); 4],
}

impl Default for Injected {
    fn default() -> Self {
        Injected {
            kills: 0,
            pauses: 0,
            restarts: 0,
            last: None,
            last_restart: None,
            network: [
                Fault::Partition,
                Fault::Blackhole,
                Fault::Latency,
                Fault::EnginePause,
            ]
            .map(|f| (f, Cost::default())),
        }
    }
}

impl Injected {
    /// Counts one network fault that lasted from `started` to now, `sections` ended meanwhile.
    fn record(&mut self, fault: Fault, started: Instant, sections: u64) {
        if let Some((_, cost)) = self.network.iter_mut().find(|(f, _)| *f == fault) {
            cost.add(started, sections);
        }
    }
}

/// Injects `faults` into `pool` and `engine` until `end`; also replaces any worker that exited
/// by itself (and notes it as a failure).
pub(crate) async fn inject(
    pool: &mut Pool,
    engine: &mut LockEngine,
    faults: &[Fault],
    (profile, keys): (Profile, &[String]),
    end: &RunEnd,
    rng: &mut Rng,
) -> Result<Injected, String> {
    let mut injected = Injected::default();
    let start = Instant::now();
    let mut progress = start + PROGRESS_EVERY;
    let mut deck = Vec::new();
    loop {
        let gap = Duration::from_millis(500 + rng.below(1500) as u64);
        let left = end.at.saturating_duration_since(Instant::now());
        tokio::time::sleep(if left.is_zero() { gap } else { gap.min(left) }).await;
        pool.reap_exited();
        if end.reached().await? {
            return Ok(injected);
        }
        if Instant::now() >= progress {
            progress += PROGRESS_EVERY;
            eprintln!(
                "  {:>4} s: {} sections ended; {} kills, {} pauses, {} restarts",
                start.elapsed().as_secs(),
                end.ended().await?,
                injected.kills,
                injected.pauses,
                injected.restarts,
            );
        }
        // A blocked thread is the workers' own doing (see `worker`); a link fault needs the
        // workers' own links.
        let from_here: Vec<Fault> = faults
            .iter()
            .copied()
            .filter(|&f| f != Fault::Block && network::applies(f, network::kind(engine)))
            .collect();
        let Some(fault) = draw(&mut deck, &from_here, rng) else {
            continue;
        };
        match fault {
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
                injected.last_restart = Some(Instant::now());
            }
            Fault::Block => continue,
            fault @ (Fault::Partition | Fault::Blackhole | Fault::Latency) => {
                let (started, before) = (Instant::now(), end.ended().await?);
                pool.link_fault_one(rng, fault, profile).await;
                let during = end.ended().await?.saturating_sub(before);
                injected.record(fault, started, during);
            }
            Fault::EnginePause => {
                let (started, before) = (Instant::now(), end.ended().await?);
                network::pause_engine(engine, rng, keys, profile.pause()).await;
                let during = end.ended().await?.saturating_sub(before);
                injected.record(Fault::EnginePause, started, during);
            }
        }
        injected.last = Some(Instant::now());
    }
}

/// The next fault of `deck`, which is dealt again from `faults` in a random order whenever it
/// runs out: every fault comes once in each round of the list, so a short run sees each of
/// them (independent draws left some out of a 10 s run). `None` when `faults` is empty.
fn draw(deck: &mut Vec<Fault>, faults: &[Fault], rng: &mut Rng) -> Option<Fault> {
    if deck.is_empty() {
        deck.extend_from_slice(faults);
        for i in (1..deck.len()).rev() {
            deck.swap(i, rng.below(i + 1));
        }
    }
    deck.pop()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_round_of_draws_deals_every_fault_once() {
        let faults = [Fault::Kill, Fault::Pause, Fault::Partition, Fault::Latency];
        let (mut deck, mut rng) = (Vec::new(), Rng::new(7));
        let mut orders = std::collections::HashSet::new();
        for _ in 0..20 {
            let mut round: Vec<Fault> = (0..faults.len())
                .map(|_| draw(&mut deck, &faults, &mut rng).expect("a fault"))
                .collect();
            orders.insert(format!("{round:?}"));
            round.sort_by_key(|f| format!("{f:?}"));
            let mut all = faults.to_vec();
            all.sort_by_key(|f| format!("{f:?}"));
            assert_eq!(round, all);
        }
        assert!(orders.len() > 1, "the order changes from round to round");
        assert_eq!(draw(&mut Vec::new(), &[], &mut rng), None);
    }
}
