//! `dlock watch KEY`: looks at the key every interval and prints a line when what an operator
//! cares about changed: the holder, the fence, or the TTL's whole seconds.

use std::time::Duration;

use dlock_runtime::{LockInfo, Runtime};
use tokio::time::{Instant, MissedTickBehavior};

use crate::output::{emit, json_line, watch_json, watch_line};

/// What a line is printed for.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    owner: Option<String>,
    fence: Option<u64>,
    ttl_secs: u64,
}

impl Seen {
    fn of(info: Option<&LockInfo>) -> Self {
        Self {
            owner: info.map(|i| i.owner.clone()),
            fence: info.and_then(|i| i.fence),
            ttl_secs: info.map_or(0, |i| i.ttl.as_secs()),
        }
    }
}

/// Watches `key` until Ctrl-C or `count` lines; an engine error ends it (as an error).
pub(crate) async fn watch(
    rt: &Runtime,
    key: &str,
    count: Option<u64>,
    interval: Duration,
    json: bool,
) -> Result<(), String> {
    let started = Instant::now();
    let stop = tokio::signal::ctrl_c();
    tokio::pin!(stop);
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last: Option<Seen> = None;
    let mut printed: u64 = 0;
    loop {
        tokio::select! {
            _ = &mut stop => return Ok(()),
            _ = ticks.tick() => {}
        }
        let info = rt.inspect(key).await.map_err(|e| e.to_string())?;
        let seen = Seen::of(info.as_ref());
        if last.as_ref() == Some(&seen) {
            continue;
        }
        let elapsed = started.elapsed();
        if json {
            emit(&json_line(&watch_json(elapsed, key, info.as_ref())));
        } else {
            emit(&watch_line(elapsed, key, info.as_ref()));
        }
        last = Some(seen);
        printed += 1;
        if count.is_some_and(|n| printed >= n) {
            return Ok(());
        }
    }
}
