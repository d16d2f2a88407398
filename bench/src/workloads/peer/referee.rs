//! The referee of one hot-key run: resets the counter, starts the clock, sees the target sale,
//! and reads the counter and Redis's command counters at the end.

use std::time::{Duration, Instant};

use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;

use super::contest::{Names, Tally};
use crate::BoxError;
use crate::baselines::raw_conn;
use crate::commandstats::{self, Calls};

/// How long a run may take before the referee gives up on it.
pub(crate) const RUN_LIMIT: Duration = Duration::from_secs(120);

/// A connection to the server at `url` without a response timeout, for blocking commands
/// (`BLPOP`), which get a connection of their own.
pub(crate) async fn blocking_conn(url: &str) -> Result<MultiplexedConnection, BoxError> {
    let client = redis::Client::open(format!("{url}?protocol=resp3"))?;
    let config = AsyncConnectionConfig::new().set_response_timeout(None);
    Ok(client
        .get_multiplexed_async_connection_with_config(&config)
        .await?)
}

/// Waits up to [`RUN_LIMIT`] for an item on `list`; an error naming `what` when none came.
pub(crate) async fn pop(
    blocking: &mut MultiplexedConnection,
    list: &str,
    what: &str,
) -> Result<(), BoxError> {
    let popped: Option<(String, String)> = redis::cmd("BLPOP")
        .arg(list)
        .arg(RUN_LIMIT.as_secs())
        .query_async(blocking)
        .await?;
    popped
        .map(drop)
        .ok_or_else(|| format!("{what}: nothing on {list} within {RUN_LIMIT:?}").into())
}

/// Starts the clock, sees the target sale and reads the counters of one run.
pub(crate) struct Referee {
    stats: MultiplexedConnection,
    /// For `BLPOP` (no response timeout; blocking commands get a connection of their own).
    blocking: MultiplexedConnection,
    names: Names,
    before: Calls,
    started: Instant,
}

/// What a run came to: one tally per process.
pub(crate) struct Outcome {
    /// From the start to the target sale.
    pub(crate) elapsed: Duration,
    pub(crate) per_process: Vec<Tally>,
    /// The counter at the end: equal to the sales only if no two holders overlapped.
    pub(crate) counter: u64,
    /// `SET` calls Redis counted during the run: the critical sections' and rslock's tries.
    set_calls: u64,
}

impl Referee {
    /// A referee for the run `names` on the server at `url`: the counter at 0, no list left.
    pub(crate) async fn new(url: &str, names: &Names) -> Result<Referee, BoxError> {
        let mut stats = raw_conn(url).await?;
        let blocking = blocking_conn(url).await?;
        let _: () = redis::pipe()
            .cmd("SET")
            .arg(&names.counter)
            .arg(0)
            .ignore()
            .cmd("DEL")
            .arg(&names.go)
            .arg(&names.done)
            .ignore()
            .query_async(&mut stats)
            .await?;
        Ok(Referee {
            stats,
            blocking,
            names: names.clone(),
            before: Calls::new(),
            started: Instant::now(),
        })
    }

    /// Reads Redis's command counters and starts the clock: right before the sellers start.
    pub(crate) async fn start(&mut self) -> Result<(), BoxError> {
        self.before = commandstats::read(&mut self.stats).await?;
        self.started = Instant::now();
        Ok(())
    }

    /// Starts `processes` worker processes waiting on the run's `go` list.
    pub(crate) async fn go(&mut self, processes: usize) -> Result<(), BoxError> {
        let _: i64 = redis::cmd("RPUSH")
            .arg(&self.names.go)
            .arg(vec![1; processes])
            .query_async(&mut self.stats)
            .await?;
        Ok(())
    }

    /// Waits for the target sale; the time since [`start`](Referee::start).
    pub(crate) async fn target_sold(&mut self) -> Result<Duration, BoxError> {
        pop(&mut self.blocking, &self.names.done, "the target sale").await?;
        Ok(self.started.elapsed())
    }

    /// The outcome, once every seller has ended.
    pub(crate) async fn outcome(
        mut self,
        elapsed: Duration,
        per_process: Vec<Tally>,
    ) -> Result<Outcome, BoxError> {
        let after = commandstats::read(&mut self.stats).await?;
        let counter: u64 = redis::cmd("GET")
            .arg(&self.names.counter)
            .query_async(&mut self.stats)
            .await?;
        Ok(Outcome {
            elapsed,
            per_process,
            counter,
            set_calls: commandstats::delta(&self.before, &after, &["set"]),
        })
    }
}

impl Outcome {
    /// Every process's tally added up.
    pub(crate) fn total(&self) -> Tally {
        let mut total = Tally::default();
        for t in &self.per_process {
            total.add(t);
        }
        total
    }

    pub(crate) fn sales_per_sec(&self) -> f64 {
        self.total().sales as f64 / self.elapsed.as_secs_f64()
    }

    /// The largest share of the sales one process made, 0.0 to 1.0.
    pub(crate) fn largest_share(&self) -> f64 {
        let total = self.total().sales.max(1) as f64;
        let most = self.per_process.iter().map(|t| t.sales).max().unwrap_or(0);
        most as f64 / total
    }

    /// Sales whose increment another holder overwrote: holders overlapped.
    pub(crate) fn lost_updates(&self) -> u64 {
        self.total().sales.saturating_sub(self.counter)
    }

    /// rslock's tries that found the lock taken (`SET NX` answered nil): the `SET` calls less
    /// the critical sections' and the successful tries.
    pub(crate) fn failed_tries(&self) -> u64 {
        let total = self.total();
        self.set_calls
            .saturating_sub(total.sales + total.acquisitions)
    }
}
