//! The worker processes: this program re-executed with the hidden `worker` subcommand, each a
//! [`TestProcess`] (its output in a log file, signals by PID, killed on drop).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use dlock_testkit::process::{Signal, TestProcess, signal, temp_dir};

use crate::cli::{Fault, WorkerArgs};
use crate::engine::Profile;
use crate::network::Links;
use crate::rng::Rng;
use crate::worker::Tally;

/// How long the workers get to finish their current section after SIGTERM.
const STOP_WITHIN: Duration = Duration::from_secs(15);

/// A worker that did not end the way it should have.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) id: u32,
    pub(crate) what: String,
    pub(crate) log_tail: String,
}

struct Process {
    id: u32,
    process: TestProcess,
}

/// The running workers.
pub(crate) struct Pool {
    exe: PathBuf,
    template: WorkerArgs,
    next_id: u32,
    workers: Vec<Process>,
    failures: Vec<Failure>,
    /// Each worker's own links to the engine, where network faults apply (`network`);
    /// dropped after the workers stopped.
    links: Option<Links>,
    /// Every worker's log (deleted last).
    dir: tempfile::TempDir,
}

impl Pool {
    /// Starts `procs` workers like `template` (numbered from 1), each through links of its own
    /// to the engine if `links` is given.
    pub(crate) fn start(
        template: WorkerArgs,
        procs: usize,
        links: Option<Links>,
    ) -> Result<Pool, String> {
        let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
        let mut pool = Pool {
            exe,
            template,
            next_id: 1,
            workers: Vec::new(),
            failures: Vec::new(),
            links,
            dir: temp_dir("dlock-torture-"),
        };
        for _ in 0..procs {
            pool.spawn()?;
        }
        Ok(pool)
    }

    fn spawn(&mut self) -> Result<(), String> {
        let id = self.next_id;
        self.next_id += 1;
        let mut args = WorkerArgs {
            id,
            ..self.template.clone()
        };
        if let Some(links) = &mut self.links {
            args.lock_url = links.url_for(id, &args.lock_url);
        }
        let mut command = Command::new(&self.exe);
        command.args(args.to_args());
        let log = self.dir.path().join(format!("worker-{id}.log"));
        let mut process = TestProcess::new(format!("worker {id}"), command, log);
        process
            .spawn()
            .map_err(|e| format!("start worker {id}: {e:?}"))?;
        self.workers.push(Process { id, process });
        Ok(())
    }

    /// SIGKILLs a random worker and starts a new one in its place. Returns the killed id.
    pub(crate) fn kill_one(&mut self, rng: &mut Rng) -> Result<u32, String> {
        let i = rng.below(self.workers.len());
        let mut worker = self.workers.remove(i);
        worker.process.kill9();
        self.drop_links(worker.id);
        self.spawn()?;
        Ok(worker.id)
    }

    /// SIGSTOPs a random worker for `period`, then SIGCONTs it. Returns its id.
    pub(crate) async fn pause_one(&mut self, rng: &mut Rng, period: Duration) -> u32 {
        let i = rng.below(self.workers.len());
        tokio::task::block_in_place(|| self.workers[i].process.pause());
        tokio::time::sleep(period).await;
        self.workers[i].process.resume();
        self.workers[i].id
    }

    /// Applies the link fault `fault` to a random worker's links for two leases, then heals
    /// them (see `network`). Returns its id.
    pub(crate) async fn link_fault_one(
        &mut self,
        rng: &mut Rng,
        fault: Fault,
        profile: Profile,
    ) -> u32 {
        let id = self.workers[rng.below(self.workers.len())].id;
        if let Some(links) = &self.links {
            links.inject(id, fault, profile).await;
        }
        id
    }

    fn drop_links(&mut self, id: u32) {
        if let Some(links) = &mut self.links {
            links.remove(id);
        }
    }

    /// Notes every worker that exited by itself (none should before the stop).
    pub(crate) fn reap_exited(&mut self) {
        let mut i = 0;
        while i < self.workers.len() {
            if let Some(status) = self.workers[i].process.try_wait() {
                let worker = self.workers.remove(i);
                self.drop_links(worker.id);
                self.fail(&worker, format!("exited during the run with {status}"));
                if let Err(e) = self.spawn() {
                    self.failures.push(Failure {
                        id: worker.id,
                        what: e,
                        log_tail: String::new(),
                    });
                }
            } else {
                i += 1;
            }
        }
    }

    /// SIGTERMs every worker and waits until all have exited (SIGKILL after 15 s). Returns the
    /// tallies the workers printed as they stopped, and every failure of the run: workers that
    /// exited by themselves, with an error, or too late.
    pub(crate) fn stop(mut self) -> (Tally, Vec<Failure>) {
        self.reap_exited();
        for worker in &self.workers {
            signal(worker.process.pid(), Signal::Term);
        }
        let deadline = Instant::now() + STOP_WITHIN;
        let mut workers = std::mem::take(&mut self.workers);
        let mut tally = Tally::default();
        while !workers.is_empty() {
            let mut i = 0;
            while i < workers.len() {
                if let Some(status) = workers[i].process.try_wait() {
                    let worker = workers.remove(i);
                    match Tally::from_log(&worker.process.log()) {
                        Some(t) => tally.add(t),
                        None => self.fail(&worker, "printed no tally".into()),
                    }
                    if !status.success() {
                        self.fail(&worker, format!("exited with {status} after SIGTERM"));
                    }
                } else {
                    i += 1;
                }
            }
            if Instant::now() > deadline {
                for mut worker in workers.drain(..) {
                    worker.process.kill9();
                    self.fail(
                        &worker,
                        format!("still running {STOP_WITHIN:?} after SIGTERM"),
                    );
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        (tally, self.failures)
    }

    fn fail(&mut self, worker: &Process, what: String) {
        let log = worker.process.log();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        self.failures.push(Failure {
            id: worker.id,
            what,
            log_tail: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        });
    }
}
