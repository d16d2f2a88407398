//! CPU time spent by a process, read from `/proc/<pid>/stat` (user + system), to tell which
//! side of a throughput figure (the client or the server) paid for it.

use std::time::Duration;

use crate::BoxError;

/// Clock ticks per second of `/proc/<pid>/stat` (USER_HZ: 100 on every Linux platform the
/// program runs on).
const TICKS_PER_SEC: u64 = 100;

/// User + system CPU time of process `pid` so far; `None` for this process.
pub(crate) fn used(pid: Option<u32>) -> Result<Duration, BoxError> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_owned(),
    };
    let stat = std::fs::read_to_string(&path)?;
    // The command name (field 2) is parenthesised and may hold spaces: fields after it.
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| format!("{path}: no `)` after the command name"))?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    let ticks = |i: usize| -> Result<u64, BoxError> {
        Ok(fields
            .get(i)
            .ok_or_else(|| format!("{path}: too few fields"))?
            .parse::<u64>()?)
    };
    let total = ticks(11)? + ticks(12)?;
    Ok(Duration::from_millis(total * 1000 / TICKS_PER_SEC))
}
