//! The hot-key contest of one process: tasks selling from one counter in Redis under one lock
//! until the counter reaches the target. Run in this process (256 tasks) and in each worker
//! process (64 tasks each); [`Tally`] is what one process reports.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use super::contender::Contender;
use crate::BoxError;
use crate::baselines::raw_conn;

/// The Redis names of one run, all derived from its id.
#[derive(Clone, Debug)]
pub(crate) struct Names {
    /// The run's id (no spaces).
    pub(crate) run: String,
    /// The lock's key.
    pub(crate) key: String,
    /// The counter the critical section reads and writes.
    pub(crate) counter: String,
    /// The list the referee pushes one item per worker process to, to start it.
    pub(crate) go: String,
    /// The list the seller of the target sale pushes to.
    pub(crate) done: String,
}

impl Names {
    pub(crate) fn new(run: &str) -> Names {
        Names {
            run: run.to_owned(),
            key: format!("{run}:stock"),
            counter: format!("{run}:counter"),
            go: format!("{run}:go"),
            done: format!("{run}:done"),
        }
    }
}

/// What the tasks of one process did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) tasks: u64,
    /// Critical sections that incremented the counter.
    pub(crate) sales: u64,
    /// Locks taken, including the last one of each task (which finds the target reached).
    pub(crate) acquisitions: u64,
    /// Tasks that made no sale.
    pub(crate) unserved: u64,
    /// The longest time from starting to wait to holding the lock, over the acquisitions that
    /// made a sale; a wait spans the waits that gave up before it.
    pub(crate) longest_wait: Duration,
    /// Waits that ended without the lock (rslock: a `lock()` call that spent its retries).
    pub(crate) gave_up: u64,
}

impl Tally {
    pub(crate) fn add(&mut self, other: &Tally) {
        self.tasks += other.tasks;
        self.sales += other.sales;
        self.acquisitions += other.acquisitions;
        self.unserved += other.unserved;
        self.longest_wait = self.longest_wait.max(other.longest_wait);
        self.gave_up += other.gave_up;
    }

    /// The line a worker process prints.
    pub(crate) fn to_line(&self) -> String {
        format!(
            "tally {} {} {} {} {} {}",
            self.tasks,
            self.sales,
            self.acquisitions,
            self.unserved,
            self.longest_wait.as_micros(),
            self.gave_up
        )
    }

    /// Reads a line of [`to_line`](Tally::to_line).
    pub(crate) fn from_line(line: &str) -> Result<Tally, BoxError> {
        let bad = || format!("expected `tally` and six numbers, got {line:?}");
        let fields = line.strip_prefix("tally ").ok_or_else(bad)?;
        let n: Vec<u64> = fields
            .split(' ')
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|_| bad())?;
        let [tasks, sales, acquisitions, unserved, wait_us, gave_up] = n[..] else {
            return Err(bad().into());
        };
        Ok(Tally {
            tasks,
            sales,
            acquisitions,
            unserved,
            longest_wait: Duration::from_micros(wait_us),
            gave_up,
        })
    }
}

/// `tasks` tasks of this process sell under `contender` until the counter of `names` (on the
/// server at `url`, over one connection they share) reaches `target`.
pub(crate) async fn contest(
    contender: &Contender,
    url: &str,
    names: &Names,
    tasks: usize,
    target: u64,
) -> Result<Tally, BoxError> {
    let data = raw_conn(url).await?;
    let ended = Arc::new(AtomicBool::new(false));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..tasks {
        let seller = Seller {
            contender: contender.clone(),
            data: data.clone(),
            names: names.clone(),
            target,
            ended: ended.clone(),
        };
        set.spawn(seller.run());
    }
    let mut tally = Tally::default();
    while let Some(r) = set.join_next().await {
        tally.add(&r??);
    }
    Ok(tally)
}

/// One task of the contest.
struct Seller {
    contender: Contender,
    data: MultiplexedConnection,
    names: Names,
    target: u64,
    /// Set once a task of this process saw the target reached.
    ended: Arc<AtomicBool>,
}

impl Seller {
    async fn run(mut self) -> Result<Tally, BoxError> {
        let mut mine = Tally {
            tasks: 1,
            ..Tally::default()
        };
        let mut waiting_since = Instant::now();
        while !self.ended.load(Ordering::Acquire) {
            let Some(held) = self.contender.acquire(&self.names.key).await? else {
                mine.gave_up += 1;
                continue;
            };
            let waited = waiting_since.elapsed();
            mine.acquisitions += 1;
            let sold = self.sell().await;
            let released = self.contender.release(held).await;
            waiting_since = Instant::now();
            let (sold, ()) = (sold?, released?);
            match sold {
                Some(counter) => {
                    mine.sales += 1;
                    mine.longest_wait = mine.longest_wait.max(waited);
                    if counter == self.target {
                        self.ended.store(true, Ordering::Release);
                        let _: i64 = redis::cmd("RPUSH")
                            .arg(&self.names.done)
                            .arg(1)
                            .query_async(&mut self.data)
                            .await?;
                    }
                }
                None => self.ended.store(true, Ordering::Release),
            }
        }
        mine.unserved = u64::from(mine.sales == 0);
        Ok(mine)
    }

    /// The critical section: `GET` the counter and, below the target, `SET` it one higher.
    /// Returns the new value, or `None` when the target was already reached.
    async fn sell(&mut self) -> Result<Option<u64>, BoxError> {
        let n: u64 = redis::cmd("GET")
            .arg(&self.names.counter)
            .query_async(&mut self.data)
            .await?;
        if n >= self.target {
            return Ok(None);
        }
        let _: () = redis::cmd("SET")
            .arg(&self.names.counter)
            .arg(n + 1)
            .query_async(&mut self.data)
            .await?;
        Ok(Some(n + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tally_survives_its_line() {
        let tally = Tally {
            tasks: 64,
            sales: 1500,
            acquisitions: 1564,
            unserved: 3,
            longest_wait: Duration::from_micros(912_345),
            gave_up: 7,
        };
        assert_eq!(Tally::from_line(&tally.to_line()).unwrap(), tally);
        assert!(Tally::from_line("tally 1 2 3").is_err());
        assert!(Tally::from_line("done 1 2 3 4 5 6").is_err());
    }

    #[test]
    fn tallies_add_up_and_keep_the_longest_wait() {
        let one = |sales, wait_ms| Tally {
            tasks: 1,
            sales,
            acquisitions: sales + 1,
            unserved: u64::from(sales == 0),
            longest_wait: Duration::from_millis(wait_ms),
            gave_up: 1,
        };
        let mut all = Tally::default();
        for t in [one(5, 10), one(0, 0), one(3, 40)] {
            all.add(&t);
        }
        assert_eq!((all.tasks, all.sales, all.acquisitions), (3, 8, 11));
        assert_eq!((all.unserved, all.gave_up), (1, 3));
        assert_eq!(all.longest_wait, Duration::from_millis(40));
    }
}
