//! The hot key across processes: this program re-executed with the hidden `peer-worker`
//! subcommand, once per process, each running the contest with its own contender and tasks,
//! started together by the referee and reporting its tally on stdout. The processes come from
//! the test process kit ([`HolderProcess`]: stdout read line by line, stderr in a log printed if
//! the run fails, killed by PID on drop).

use std::time::Duration;

use dlock_testkit::HolderProcess;

use super::contender::{Contender, Kind};
use super::contest::{Names, Tally, contest};
use super::referee::{Outcome, RUN_LIMIT, Referee, blocking_conn, pop};
use crate::BoxError;

/// The hidden subcommand of a worker process.
pub(crate) const SUBCOMMAND: &str = "peer-worker";

/// How long a worker may take to connect and say it is ready.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// What a worker process is told: `peer-worker URL CONTENDER RUN TASKS TARGET`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct WorkerArgs {
    url: String,
    kind: Kind,
    run: String,
    tasks: usize,
    target: u64,
}

impl WorkerArgs {
    fn to_args(&self) -> Vec<String> {
        vec![
            SUBCOMMAND.to_owned(),
            self.url.clone(),
            self.kind.name().to_owned(),
            self.run.clone(),
            self.tasks.to_string(),
            self.target.to_string(),
        ]
    }

    /// Reads the arguments after the subcommand.
    fn parse(args: &[String]) -> Result<WorkerArgs, BoxError> {
        let [url, kind, run, tasks, target] = args else {
            return Err(format!("usage: {SUBCOMMAND} URL CONTENDER RUN TASKS TARGET").into());
        };
        Ok(WorkerArgs {
            url: url.clone(),
            kind: Kind::from_name(kind)?,
            run: run.clone(),
            tasks: tasks.parse()?,
            target: target.parse()?,
        })
    }
}

/// A worker process's body, given the arguments after [`SUBCOMMAND`]: connect, warm up, print
/// `ready`, wait for the referee's go, run the contest, print the tally.
pub(crate) async fn run(args: &[String]) -> Result<(), BoxError> {
    let args = WorkerArgs::parse(args)?;
    let names = Names::new(&args.run);
    let contender = Contender::connect(args.kind, &args.url, super::PREFIX).await?;
    let warm_up = format!("{}:warm:{}", names.run, std::process::id());
    for _ in 0..100 {
        contender.pair(&warm_up).await?;
    }
    let mut blocking = blocking_conn(&args.url).await?;
    println!("ready");
    pop(&mut blocking, &names.go, "the go").await?;
    let tally = contest(&contender, &args.url, &names, args.tasks, args.target).await?;
    println!("{}", tally.to_line());
    Ok(())
}

/// `processes` worker processes of `tasks` tasks each, contending with `kind` on one key of
/// the server at `url` until `target` sales.
pub(crate) async fn hot_key_in_processes(
    kind: Kind,
    url: &str,
    (processes, tasks): (usize, usize),
    target: u64,
) -> Result<Outcome, BoxError> {
    let names = Names::new(&format!("procs-{}", kind.name()));
    let mut referee = Referee::new(url, &names).await?;
    let exe = std::env::current_exe()?;
    let exe = exe.to_str().ok_or("this program's path is not UTF-8")?;
    let args = WorkerArgs {
        url: url.to_owned(),
        kind,
        run: names.run.clone(),
        tasks,
        target,
    }
    .to_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut workers: Vec<HolderProcess> = (0..processes)
        .map(|_| HolderProcess::spawn(exe, &args))
        .collect();
    for worker in &mut workers {
        let line = worker.next_line(READY_WITHIN).await;
        if line != "ready" {
            return Err(format!("worker {}: expected `ready`, got {line:?}", worker.pid()).into());
        }
    }
    referee.start().await?;
    referee.go(processes).await?;
    let elapsed = referee.target_sold().await?;
    let mut tallies = Vec::with_capacity(processes);
    for worker in &mut workers {
        tallies.push(Tally::from_line(&worker.next_line(RUN_LIMIT).await)?);
        let status = worker.wait(READY_WITHIN).await;
        if !status.success() {
            return Err(format!("worker {} exited with {status}", worker.pid()).into());
        }
    }
    referee.outcome(elapsed, tallies).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_arguments_survive_the_command_line() {
        let args = WorkerArgs {
            url: "redis://127.0.0.1:7001".into(),
            kind: Kind::Rslock,
            run: "procs-rslock".into(),
            tasks: 64,
            target: 6000,
        };
        let line = args.to_args();
        assert_eq!(line[0], SUBCOMMAND);
        assert_eq!(WorkerArgs::parse(&line[1..]).unwrap(), args);
        assert!(WorkerArgs::parse(&line[1..4]).is_err());
    }
}
