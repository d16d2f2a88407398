//! The command line, as clap (derive) reads it.

use std::time::Duration;

use clap::{Parser, Subcommand};

/// The command line: global options, then one command.
#[derive(Debug, Parser)]
#[command(
    name = "dlock",
    version,
    about = "Inspect and operate the locks of a dlock engine",
    after_help = "Exit status: 0 found (list: at least one lock; show: held; unlock: deleted), \
                  1 not found, 2 error (bad usage, bad URL, engine unreachable)."
)]
pub(crate) struct Cli {
    /// Lock engine URL, as the runtime takes it: redis://, rediss://, redis+cluster://,
    /// redlock://, etcd://, zk:// (memory:// would see only its own process).
    #[arg(long, env = "DLOCK_URL", hide_env_values = true, global = true)]
    pub(crate) url: Option<String>,

    /// Key prefix of the runtime whose locks to see (overrides the URL's `prefix=`; default
    /// `dlock:`).
    #[arg(long, value_name = "PREFIX", global = true)]
    pub(crate) prefix: Option<String>,

    /// Machine output: one JSON document (`watch`: one per line).
    #[arg(long, global = true)]
    pub(crate) json: bool,

    #[command(subcommand)]
    pub(crate) command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// List the locks held now whose keys start with PREFIX (all when omitted), sorted by key.
    List {
        /// Start of the keys to list (the user's keys, without the runtime's prefix).
        #[arg(value_name = "PREFIX", default_value = "")]
        filter: String,
    },
    /// Show the holder of KEY: owner (redacted), TTL left, hold count, fence.
    Show {
        /// The lock's key.
        key: String,
    },
    /// Delete the lock on KEY whoever holds it (needs --force).
    Unlock {
        /// Confirms the force-unlock: the holder is not asked, it finds out at its next
        /// renewal.
        #[arg(long)]
        force: bool,
        /// The lock's key.
        key: String,
    },
    /// Print a line each time the holder, the fence or the TTL's whole seconds of KEY change,
    /// until Ctrl-C.
    Watch {
        /// The lock's key.
        key: String,
        /// Stop after this many lines.
        #[arg(long, value_name = "N")]
        count: Option<u64>,
        /// Time between two looks, e.g. 200ms, 1s.
        #[arg(long, value_name = "DURATION", default_value = "200ms", value_parser = parse_duration)]
        interval: Duration,
    },
}

/// `250ms`, `2s`, `1m`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration `{text}`: expected e.g. 200ms, 1s, 1m");
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, ""), |at| text.split_at(at));
    let n: u64 = number.parse().map_err(|_| bad())?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        _ => return Err(bad()),
    };
    if d.is_zero() {
        return Err(format!(
            "invalid duration `{text}`: must be greater than zero"
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("200ms"), Ok(Duration::from_millis(200)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("x").is_err());
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
