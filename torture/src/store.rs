//! The store the critical sections work on: a redis-server of its own (never the lock engine),
//! holding one counter per key behind [`FencedRedis`], and a log (one Redis list) of what every
//! section did, with timestamps from one clock all processes on the machine share.
//!
//! A counter's value is `"<n> <section id>"`: the count and the section that wrote it, so that
//! each write names the one it read ([`Intent::prev`]) and the checker can follow the chain of
//! accepted writes back from the final value, whatever the log lost to a kill.

use std::fmt;
use std::str::FromStr;

use dlock_runtime::LockError;
use dlock_runtime::fenced::FencedRedis;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

/// The Redis list every record is appended to.
const LOG: &str = "torture:log";

/// The number of end records appended (what `--sections` waits for).
const ENDED: &str = "torture:ended";

/// How many records one `LRANGE` reads.
const READ_CHUNK: isize = 20_000;

/// Nanoseconds of `CLOCK_MONOTONIC`: the same clock in every process on this machine, and it
/// keeps counting while a process is stopped.
pub(crate) fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let ns = i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec);
    u64::try_from(ns).unwrap_or(0)
}

/// The lock key and store resource of key number `i`.
pub(crate) fn key_name(i: usize) -> String {
    format!("torture:{i}")
}

/// A counter's value: the count and the section that wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Written {
    pub(crate) n: u64,
    pub(crate) by: String,
}

impl fmt::Display for Written {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.n, self.by)
    }
}

impl FromStr for Written {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (n, by) = s
            .split_once(' ')
            .ok_or_else(|| format!("bad counter value `{s}`"))?;
        let n = n.parse().map_err(|_| format!("bad count in `{s}`"))?;
        Ok(Written { n, by: by.into() })
    }
}

/// How a section ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Its write was accepted.
    Accepted,
    /// Its write was rejected: a higher fence had been seen.
    Rejected,
    /// Its claim was rejected: it neither read nor wrote.
    ClaimRejected,
    /// The runtime cancelled the body (lease lost) before the section knew the answer.
    Cancelled,
    /// A store call failed (e.g. timed out while the worker was stopped).
    Failed,
    /// `--mode semaphore`: the permit was held for the whole section.
    Held,
    /// `--mode rw`: a reader read the counter and held the read lock for the whole section.
    Read,
}

impl Outcome {
    fn name(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Rejected => "rejected",
            Outcome::ClaimRejected => "claim-rejected",
            Outcome::Cancelled => "cancelled",
            Outcome::Failed => "failed",
            Outcome::Held => "held",
            Outcome::Read => "read",
        }
    }

    fn parse(s: &str) -> Result<Outcome, String> {
        [
            Outcome::Accepted,
            Outcome::Rejected,
            Outcome::ClaimRejected,
            Outcome::Cancelled,
            Outcome::Failed,
            Outcome::Held,
            Outcome::Read,
        ]
        .into_iter()
        .find(|o| o.name() == s)
        .ok_or_else(|| format!("bad outcome `{s}`"))
    }
}

/// Logged just before a section sends its write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Intent {
    pub(crate) id: String,
    pub(crate) key: String,
    pub(crate) fence: Option<u64>,
    /// When the section started (the lock held).
    pub(crate) start: u64,
    /// When this record was made: the section still ran then.
    pub(crate) at: u64,
    /// The count it writes.
    pub(crate) n: u64,
    /// The section whose value it read (`None`: the counter was empty).
    pub(crate) prev: Option<String>,
}

/// Logged when a section ends (also from `Drop` when its body is cancelled).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct End {
    pub(crate) id: String,
    pub(crate) key: String,
    pub(crate) fence: Option<u64>,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) outcome: Outcome,
}

/// One log entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Record {
    Intent(Intent),
    End(End),
}

fn opt<T: fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".to_owned(), T::to_string)
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Record::Intent(i) => write!(
                f,
                "W {} {} {} {} {} {} {}",
                i.id,
                i.key,
                opt(&i.fence),
                i.start,
                i.at,
                i.n,
                opt(&i.prev)
            ),
            Record::End(e) => write!(
                f,
                "E {} {} {} {} {} {}",
                e.id,
                e.key,
                opt(&e.fence),
                e.start,
                e.end,
                e.outcome.name()
            ),
        }
    }
}

impl FromStr for Record {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let fields: Vec<&str> = s.split(' ').collect();
        let bad = || format!("bad log record `{s}`");
        let number = |f: &str| f.parse::<u64>().map_err(|_| bad());
        let fence = |f: &str| match f {
            "-" => Ok(None),
            f => number(f).map(Some),
        };
        match fields.as_slice() {
            ["W", id, key, f, start, at, n, prev] => Ok(Record::Intent(Intent {
                id: (*id).into(),
                key: (*key).into(),
                fence: fence(f)?,
                start: number(start)?,
                at: number(at)?,
                n: number(n)?,
                prev: (*prev != "-").then(|| (*prev).to_owned()),
            })),
            ["E", id, key, f, start, end, outcome] => Ok(Record::End(End {
                id: (*id).into(),
                key: (*key).into(),
                fence: fence(f)?,
                start: number(start)?,
                end: number(end)?,
                outcome: Outcome::parse(outcome)?,
            })),
            _ => Err(bad()),
        }
    }
}

/// The store: fenced counters and the log.
#[derive(Clone)]
pub(crate) struct Store {
    fenced: FencedRedis,
    log: MultiplexedConnection,
}

impl Store {
    /// Connects to the store server at `url` (`redis://host:port`).
    pub(crate) async fn connect(url: &str) -> Result<Store, String> {
        // Generous: a call in flight while its worker is stopped must not time out on SIGCONT.
        let fenced = FencedRedis::connect(&format!("{url}?timeout=30s"))
            .await
            .map_err(|e| format!("connect to the store: {e}"))?;
        let client = redis::Client::open(url).map_err(|e| format!("store url: {e}"))?;
        let log = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("connect to the store's log: {e}"))?;
        Ok(Store { fenced, log })
    }

    pub(crate) fn fenced(&self) -> &FencedRedis {
        &self.fenced
    }

    /// The counter of `key`: `None` before the first accepted write.
    pub(crate) async fn counter(&self, key: &str) -> Result<Option<Written>, String> {
        match self
            .fenced
            .read(key)
            .await
            .map_err(|e: LockError| e.to_string())?
        {
            Some(current) => current.value.parse().map(Some),
            None => Ok(None),
        }
    }

    /// Appends `record` to the log (an end record also counts one more ended section).
    pub(crate) async fn append(&self, record: &Record) -> Result<(), String> {
        let mut log = self.log.clone();
        let mut pipe = redis::pipe();
        pipe.atomic().rpush(LOG, record.to_string()).ignore();
        if let Record::End(_) = record {
            pipe.incr(ENDED, 1).ignore();
        }
        pipe.query_async::<()>(&mut log)
            .await
            .map_err(|e| format!("append to the log: {e}"))
    }

    /// How many sections ended so far (end records appended).
    pub(crate) async fn ended(&self) -> Result<u64, String> {
        let mut log = self.log.clone();
        let ended: Option<u64> = log
            .get(ENDED)
            .await
            .map_err(|e| format!("read the count of sections: {e}"))?;
        Ok(ended.unwrap_or(0))
    }

    /// Every record, in the order the store received them.
    pub(crate) async fn records(&self) -> Result<Vec<Record>, String> {
        let mut log = self.log.clone();
        let mut records = Vec::new();
        let mut from: isize = 0;
        loop {
            let chunk: Vec<String> = log
                .lrange(LOG, from, from + READ_CHUNK - 1)
                .await
                .map_err(|e| format!("read the log: {e}"))?;
            for line in &chunk {
                records.push(line.parse()?);
            }
            if chunk.len() < READ_CHUNK as usize {
                return Ok(records);
            }
            from += READ_CHUNK;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_values_round_trip() {
        let records = [
            Record::Intent(Intent {
                id: "w1.7".into(),
                key: "torture:0".into(),
                fence: Some(42),
                start: 10,
                at: 12,
                n: 5,
                prev: Some("w2.3".into()),
            }),
            Record::Intent(Intent {
                id: "w1.8".into(),
                key: "torture:1".into(),
                fence: None,
                start: 10,
                at: 12,
                n: 1,
                prev: None,
            }),
            Record::End(End {
                id: "w1.7".into(),
                key: "torture:0".into(),
                fence: Some(42),
                start: 10,
                end: 20,
                outcome: Outcome::ClaimRejected,
            }),
        ];
        for record in records {
            assert_eq!(record.to_string().parse::<Record>(), Ok(record));
        }
        let written = Written {
            n: 9,
            by: "w3.1".into(),
        };
        assert_eq!(written.to_string().parse::<Written>(), Ok(written));
        assert!("W w1 torture:0".parse::<Record>().is_err());
    }

    #[test]
    fn the_clock_runs_forward() {
        let a = now_ns();
        let b = now_ns();
        assert!(a > 0 && b >= a);
    }
}
