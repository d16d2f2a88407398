//! The command line: the run's options, and the hidden `worker` subcommand the program
//! re-executes itself with.

use std::fmt;
use std::time::Duration;

/// Printed by `--help` and after a bad argument.
pub(crate) const USAGE: &str = "\
usage: torture [--engine ENGINE] [--procs P] [--tasks T] [--seconds S] [--sections N]
               [--faults LIST] [--keys K] [--seed N] [--mode MODE] [--permits N]

  --engine ENGINE  memory, redis, cluster, redlock, etcd, zookeeper, a comma-separated list of
                   them, or all (default; all and lists run one engine after another)
  --procs P        worker processes (default 3); memory runs P x T tasks in this process
  --tasks T        tasks per worker, each taking locks in a loop (default 4)
  --seconds S      how long the workers run per engine (default 20)
  --sections N     and until at least N critical sections ended (default 0)
  --faults LIST    comma-separated: kill, pause, restart, block, partition, blackhole, latency,
                   engine-pause; or none (default all); the network faults (partition,
                   blackhole, latency) apply to redis, redlock, etcd and zookeeper
  --keys K         keys the tasks contend for (default 3)
  --seed N         seed of the fault injector's choices (default: from the clock, printed)
  --mode MODE      exclusive (default): fenced read-modify-writes under the lock;
                   semaphore: sections hold one of N permits (at most N at once per key);
                   rw: 80 % readers (read the store under a read lock), 20 % writers
  --permits N      the semaphore's size in --mode semaphore (default 2)
  --no-lock        run the critical sections without the lock (or the permit), unfenced: a
                   check of the checker (the run must fail)
  -h, --help       print this

Prints one table row per engine; exits with status 1 on any violation, 2 on a bad argument.";

/// The lock engines.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Engine {
    Memory,
    Redis,
    Cluster,
    Redlock,
    Etcd,
    ZooKeeper,
}

impl Engine {
    /// Every engine, in the order `all` runs them.
    pub(crate) const ALL: [Engine; 6] = [
        Engine::Memory,
        Engine::Redis,
        Engine::Cluster,
        Engine::Redlock,
        Engine::Etcd,
        Engine::ZooKeeper,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Engine::Memory => "memory",
            Engine::Redis => "redis",
            Engine::Cluster => "cluster",
            Engine::Redlock => "redlock",
            Engine::Etcd => "etcd",
            Engine::ZooKeeper => "zookeeper",
        }
    }

    /// Whether workers can be separate processes (all but memory, which is in-process).
    pub(crate) fn has_processes(self) -> bool {
        self != Engine::Memory
    }

    /// Whether `guard.fence()` is a token (all but Redlock).
    pub(crate) fn has_fences(self) -> bool {
        self != Engine::Redlock
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the workers' sections hold: the exclusive lock, one permit of a semaphore, or a read
/// or write hold of a read-write lock.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub(crate) enum Mode {
    /// A fenced read-modify-write under the exclusive lock.
    #[default]
    Exclusive,
    /// One permit of a semaphore of this size; the section only holds it for a moment.
    Semaphore(u32),
    /// Readers (read the store under a read lock) and writers (the exclusive section under
    /// the write lock), [`Mode::READ_PERCENT`] of them readers.
    Rw,
}

impl Mode {
    /// The share of readers in `rw` mode.
    pub(crate) const READ_PERCENT: usize = 80;

    /// The default size of the semaphore (`--permits`).
    pub(crate) const PERMITS: u32 = 2;

    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Semaphore(_) => "semaphore",
            Mode::Rw => "rw",
        }
    }

    /// The worker's command-line form (`semaphore:N` carries the size).
    fn to_arg(self) -> String {
        match self {
            Mode::Semaphore(n) => format!("semaphore:{n}"),
            other => other.name().to_owned(),
        }
    }

    fn from_arg(arg: &str) -> Result<Mode, String> {
        match arg.split_once(':') {
            None if arg == "exclusive" => Ok(Mode::Exclusive),
            None if arg == "rw" => Ok(Mode::Rw),
            Some(("semaphore", n)) => n
                .parse()
                .ok()
                .filter(|&n| n > 0)
                .map(Mode::Semaphore)
                .ok_or(format!("worker: bad semaphore size `{n}`")),
            _ => Err(format!("worker: unknown mode `{arg}`")),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Semaphore(n) => write!(f, "semaphore of {n}"),
            other => f.write_str(other.name()),
        }
    }
}

/// A fault the injector applies.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Fault {
    /// SIGKILL a worker, then start a new one.
    Kill,
    /// SIGSTOP a worker past the lease (ZooKeeper: past the session), then SIGCONT.
    Pause,
    /// Restart the lock engine (or one of its nodes).
    Restart,
    /// A task blocks its thread (a synchronous sleep, no await) at the start of a section, for
    /// one and a half leases: its lock must stay renewed meanwhile. Done by the workers
    /// themselves, one section in 200, at most one task of a process at a time.
    Block,
    /// Cut one worker off its engine (every connection reset, every new one refused) for two
    /// leases, then heal (see `network`).
    Partition,
    /// Black-hole one worker's links to its engine (nothing answered, no reset) for two
    /// leases, then heal: its connections of that time stay silent for good.
    Blackhole,
    /// Delay one worker's engine traffic by about a third of the lease each way, with jitter,
    /// for two leases.
    Latency,
    /// SIGSTOP the engine's server (one node of Redlock or Cluster) past the lease, then
    /// SIGCONT.
    EnginePause,
}

impl Fault {
    pub(crate) const ALL: [Fault; 8] = [
        Fault::Kill,
        Fault::Pause,
        Fault::Restart,
        Fault::Block,
        Fault::Partition,
        Fault::Blackhole,
        Fault::Latency,
        Fault::EnginePause,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Pause => "pause",
            Fault::Restart => "restart",
            Fault::Block => "block",
            Fault::Partition => "partition",
            Fault::Blackhole => "blackhole",
            Fault::Latency => "latency",
            Fault::EnginePause => "engine-pause",
        }
    }

    /// Whether the fault goes through each worker's own links to the engine (a proxy per
    /// server: see `network`).
    pub(crate) fn is_network(self) -> bool {
        matches!(self, Fault::Partition | Fault::Blackhole | Fault::Latency)
    }
}

/// What the command line asked for.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    pub(crate) engines: Vec<Engine>,
    pub(crate) procs: usize,
    pub(crate) tasks: usize,
    pub(crate) run_for: Duration,
    /// Each engine also runs until this many sections ended (`--sections`).
    pub(crate) min_sections: u64,
    pub(crate) faults: Vec<Fault>,
    pub(crate) keys: usize,
    pub(crate) seed: Option<u64>,
    /// Sections without the lock (`--no-lock`): the checker must see violations.
    pub(crate) no_lock: bool,
    /// What the sections hold (`--mode`, `--permits`).
    pub(crate) mode: Mode,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            engines: Engine::ALL.to_vec(),
            procs: 3,
            tasks: 4,
            run_for: Duration::from_secs(20),
            min_sections: 0,
            faults: Fault::ALL.to_vec(),
            keys: 3,
            seed: None,
            no_lock: false,
            mode: Mode::Exclusive,
        }
    }
}

/// The command: a run, or one worker process of a run.
#[derive(Debug)]
pub(crate) enum Command {
    Run(Options),
    Worker(WorkerArgs),
    Help,
}

impl Command {
    /// Reads the arguments after the program name.
    pub(crate) fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
        let mut args = args.into_iter().peekable();
        if args.peek().map(String::as_str) == Some(WorkerArgs::SUBCOMMAND) {
            args.next();
            return WorkerArgs::parse(args).map(Command::Worker);
        }
        let mut options = Options::default();
        let mut mode = None;
        let mut permits = None;
        while let Some(arg) = args.next() {
            let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
            match arg.as_str() {
                "--engine" => options.engines = parse_engines(&value("--engine")?)?,
                "--sections" => {
                    let sections = value("--sections")?;
                    options.min_sections = sections
                        .parse()
                        .map_err(|_| format!("--sections: `{sections}` is not a number"))?;
                }
                "--procs" => options.procs = positive("--procs", &value("--procs")?)?,
                "--tasks" => options.tasks = positive("--tasks", &value("--tasks")?)?,
                "--keys" => options.keys = positive("--keys", &value("--keys")?)?,
                "--seconds" => {
                    let seconds = positive("--seconds", &value("--seconds")?)?;
                    options.run_for = Duration::from_secs(seconds as u64);
                }
                "--faults" => options.faults = parse_faults(&value("--faults")?)?,
                "--seed" => {
                    let seed = value("--seed")?;
                    let seed = seed
                        .parse()
                        .map_err(|_| format!("--seed: `{seed}` is not a number"))?;
                    options.seed = Some(seed);
                }
                "--no-lock" => options.no_lock = true,
                "--mode" => mode = Some(value("--mode")?),
                "--permits" => permits = Some(positive("--permits", &value("--permits")?)?),
                "-h" | "--help" => return Ok(Command::Help),
                other => return Err(format!("unknown argument `{other}`")),
            }
        }
        options.mode = match (mode.as_deref(), permits) {
            (None | Some("exclusive"), None) => Mode::Exclusive,
            (Some("rw"), None) => Mode::Rw,
            (Some("semaphore"), permits) => {
                let n = permits.map_or(Ok(Mode::PERMITS), u32::try_from);
                Mode::Semaphore(n.map_err(|_| "--permits: too large".to_owned())?)
            }
            (None | Some("exclusive" | "rw"), Some(_)) => {
                return Err("--permits applies to --mode semaphore only".into());
            }
            (Some(other), _) => {
                return Err(format!(
                    "unknown mode `{other}`; expected exclusive, semaphore or rw"
                ));
            }
        };
        Ok(Command::Run(options))
    }
}

fn positive(name: &str, value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{name}: expected a positive number, got `{value}`")),
    }
}

fn parse_engines(list: &str) -> Result<Vec<Engine>, String> {
    if list == "all" {
        return Ok(Engine::ALL.to_vec());
    }
    let mut engines = Vec::new();
    for name in list.split(',') {
        let engine = Engine::ALL
            .into_iter()
            .find(|e| e.name() == name)
            .ok_or(format!("unknown engine `{name}`"))?;
        if !engines.contains(&engine) {
            engines.push(engine);
        }
    }
    Ok(engines)
}

fn parse_faults(list: &str) -> Result<Vec<Fault>, String> {
    if list == "none" {
        return Ok(Vec::new());
    }
    let mut faults = Vec::new();
    for name in list.split(',') {
        let fault = Fault::ALL
            .into_iter()
            .find(|f| f.name() == name)
            .ok_or(format!(
                "unknown fault `{name}`; expected kill, pause, restart, block, partition, \
                 blackhole, latency, engine-pause or none"
            ))?;
        if !faults.contains(&fault) {
            faults.push(fault);
        }
    }
    Ok(faults)
}

/// The arguments of one worker process (`torture worker ...`), set by the parent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WorkerArgs {
    /// Numbers this worker's sections (`w<id>.<seq>`); a replacement gets a new one.
    pub(crate) id: u32,
    pub(crate) lock_url: String,
    pub(crate) store_url: String,
    pub(crate) tasks: usize,
    pub(crate) keys: usize,
    pub(crate) lease: Duration,
    pub(crate) wait: Duration,
    /// Whether sections take the lock (`false` only for `--no-lock`).
    pub(crate) locked: bool,
    pub(crate) mode: Mode,
    /// Whether tasks sometimes block their thread in a section (`Fault::Block`).
    pub(crate) block: bool,
}

impl WorkerArgs {
    pub(crate) const SUBCOMMAND: &'static str = "worker";

    /// The command line that [`WorkerArgs::parse`] reads back.
    pub(crate) fn to_args(&self) -> Vec<String> {
        vec![
            Self::SUBCOMMAND.into(),
            self.id.to_string(),
            self.lock_url.clone(),
            self.store_url.clone(),
            self.tasks.to_string(),
            self.keys.to_string(),
            self.lease.as_millis().to_string(),
            self.wait.as_millis().to_string(),
            if self.locked { "locked" } else { "unlocked" }.into(),
            self.mode.to_arg(),
            if self.block { "block" } else { "noblock" }.into(),
        ]
    }

    fn parse(args: impl Iterator<Item = String>) -> Result<WorkerArgs, String> {
        let args: Vec<String> = args.collect();
        let [
            id,
            lock_url,
            store_url,
            tasks,
            keys,
            lease_ms,
            wait_ms,
            locked,
            mode,
            block,
        ] = args.as_slice()
        else {
            return Err(format!(
                "worker: expected id, lock url, store url, tasks, keys, lease ms, wait ms, \
                 locked or unlocked, the mode, and block or noblock; got {} arguments",
                args.len()
            ));
        };
        let number = |what: &str, text: &str| {
            text.parse::<u64>()
                .map_err(|_| format!("worker: {what} `{text}` is not a number"))
        };
        Ok(WorkerArgs {
            id: u32::try_from(number("id", id)?).map_err(|e| format!("worker: id: {e}"))?,
            lock_url: lock_url.clone(),
            store_url: store_url.clone(),
            tasks: number("tasks", tasks)? as usize,
            keys: number("keys", keys)? as usize,
            lease: Duration::from_millis(number("lease", lease_ms)?),
            wait: Duration::from_millis(number("wait", wait_ms)?),
            locked: match locked.as_str() {
                "locked" => true,
                "unlocked" => false,
                other => return Err(format!("worker: `{other}` is not locked or unlocked")),
            },
            mode: Mode::from_arg(mode)?,
            block: match block.as_str() {
                "block" => true,
                "noblock" => false,
                other => return Err(format!("worker: `{other}` is not block or noblock")),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, String> {
        Command::parse(args.iter().map(|a| a.to_string()))
    }

    #[test]
    fn defaults_run_every_engine_with_every_fault() {
        let Ok(Command::Run(options)) = parse(&[]) else {
            panic!("a run");
        };
        assert_eq!(options.engines, Engine::ALL);
        assert_eq!(options.faults, Fault::ALL);
        assert_eq!((options.procs, options.tasks, options.keys), (3, 4, 3));
    }

    #[test]
    fn options_are_read() {
        let Ok(Command::Run(options)) = parse(&[
            "--engine",
            "etcd",
            "--procs",
            "2",
            "--tasks",
            "8",
            "--seconds",
            "5",
            "--faults",
            "pause,kill,pause",
            "--seed",
            "7",
        ]) else {
            panic!("a run");
        };
        assert_eq!(options.engines, [Engine::Etcd]);
        assert_eq!((options.procs, options.tasks), (2, 8));
        assert_eq!(options.run_for, Duration::from_secs(5));
        assert_eq!(options.faults, [Fault::Pause, Fault::Kill]);
        assert_eq!(options.seed, Some(7));
        let Ok(Command::Run(options)) = parse(&[
            "--faults",
            "none",
            "--engine",
            "redis,zookeeper",
            "--sections",
            "100000",
        ]) else {
            panic!("a run");
        };
        assert!(options.faults.is_empty());
        assert_eq!(options.engines, [Engine::Redis, Engine::ZooKeeper]);
        assert_eq!(options.min_sections, 100_000);
        let Ok(Command::Run(options)) =
            parse(&["--faults", "partition,blackhole,latency,engine-pause"])
        else {
            panic!("a run");
        };
        assert_eq!(
            options.faults,
            [
                Fault::Partition,
                Fault::Blackhole,
                Fault::Latency,
                Fault::EnginePause
            ]
        );
        assert!(options.faults[..3].iter().all(|f| f.is_network()));
    }

    #[test]
    fn bad_arguments_are_named() {
        for (args, message) in [
            (&["--engine", "mongo"][..], "unknown engine `mongo`"),
            (&["--engine", "redis,"][..], "unknown engine ``"),
            (&["--procs", "0"][..], "--procs: expected a positive number"),
            (&["--faults", "kill,nap"][..], "unknown fault `nap`"),
            (&["--seconds"][..], "--seconds needs a value"),
            (&["--verbose"][..], "unknown argument `--verbose`"),
            (&["--mode", "fair"][..], "unknown mode `fair`"),
            (
                &["--permits", "3"][..],
                "--permits applies to --mode semaphore only",
            ),
            (
                &["--mode", "semaphore", "--permits", "0"][..],
                "--permits: expected a positive",
            ),
        ] {
            let err = parse(args).expect_err(message);
            assert!(err.contains(message), "{args:?}: {err}");
        }
    }

    #[test]
    fn worker_arguments_round_trip() {
        let args = WorkerArgs {
            id: 12,
            lock_url: "redis://127.0.0.1:1".into(),
            store_url: "redis://127.0.0.1:2?timeout=10s".into(),
            tasks: 4,
            keys: 3,
            lease: Duration::from_millis(1500),
            wait: Duration::from_secs(2),
            locked: true,
            mode: Mode::Exclusive,
            block: false,
        };
        for (mode, block) in [
            (Mode::Exclusive, false),
            (Mode::Semaphore(3), true),
            (Mode::Rw, false),
        ] {
            let args = WorkerArgs {
                mode,
                block,
                ..args.clone()
            };
            match Command::parse(args.to_args()) {
                Ok(Command::Worker(parsed)) => assert_eq!(parsed, args),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn modes_are_read() {
        let mode = |args: &[&str]| match parse(args) {
            Ok(Command::Run(options)) => options.mode,
            other => panic!("{other:?}"),
        };
        assert_eq!(mode(&[]), Mode::Exclusive);
        assert_eq!(mode(&["--mode", "semaphore"]), Mode::Semaphore(2));
        assert_eq!(
            mode(&["--permits", "5", "--mode", "semaphore"]),
            Mode::Semaphore(5)
        );
        assert_eq!(mode(&["--mode", "rw"]), Mode::Rw);
    }
}
