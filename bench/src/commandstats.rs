//! Redis's per-command call counters (`INFO commandstats`), read before and after a workload.

use std::collections::HashMap;

use redis::aio::MultiplexedConnection;

use crate::BoxError;

/// Calls per command name since the server started.
pub(crate) type Calls = HashMap<String, u64>;

/// Commands a client sends (as opposed to the ones our scripts run inside Redis).
pub(crate) const CLIENT_COMMANDS: &[&str] = &[
    "evalsha",
    "eval",
    "script|load",
    "get",
    "set",
    "subscribe",
    "unsubscribe",
    "ping",
    "hello",
];

/// The server's counters now.
pub(crate) async fn read(conn: &mut MultiplexedConnection) -> Result<Calls, BoxError> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    Ok(parse(&info))
}

fn parse(info: &str) -> Calls {
    let mut calls = HashMap::new();
    for line in info.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, fields)) = rest.split_once(':') else {
            continue;
        };
        let n = fields
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        calls.insert(name.to_owned(), n);
    }
    calls
}

/// Calls of `names` between `before` and `after`.
pub(crate) fn delta(before: &Calls, after: &Calls, names: &[&str]) -> u64 {
    names
        .iter()
        .map(|n| after.get(*n).copied().unwrap_or(0) - before.get(*n).copied().unwrap_or(0))
        .sum()
}

/// Calls of every command but `INFO` between `before` and `after`.
pub(crate) fn delta_all(before: &Calls, after: &Calls) -> u64 {
    after
        .iter()
        .filter(|(name, _)| !matches!(name.as_str(), "info"))
        .map(|(name, calls)| calls - before.get(name).copied().unwrap_or(0))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_calls_per_command() {
        let before = parse("# Commandstats\r\ncmdstat_get:calls=2,usec=5\r\n");
        let after = parse(
            "# Commandstats\r\ncmdstat_get:calls=7,usec=9\r\ncmdstat_info:calls=3,usec=1\r\n\
             cmdstat_script|load:calls=1,usec=2\r\n",
        );
        assert_eq!(delta(&before, &after, &["get", "script|load", "set"]), 6);
        assert_eq!(delta_all(&before, &after), 6);
    }
}
