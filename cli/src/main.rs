//! `dlock`: list, show, watch and force-unlock the locks of a dlock engine.
//!
//! ```text
//! dlock --url redis://127.0.0.1:6379 list stock:     # table of the locks on stock:*
//! dlock --json show stock:42                          # one JSON document
//! dlock unlock --force stock:42                       # delete it whoever holds it
//! DLOCK_URL=etcd://127.0.0.1:2379 dlock watch job:nightly
//! ```
//!
//! Exit status: 0 found (list: at least one lock; show: held; unlock: deleted), 1 not found,
//! 2 error, with a one-line message on standard error that never shows a password.

mod args;
mod output;
mod redact;
mod watch;

use std::process::ExitCode;

use clap::Parser;
use dlock_runtime::Runtime;
use serde_json::json;

use crate::args::{Cli, Command};
use crate::output::{details, emit, json_line, lock_json, table};
use crate::redact::redact;

/// What a command found.
enum Found {
    Yes,
    No,
}

/// Exit status when nothing was found.
const NOT_FOUND: u8 = 1;
/// Exit status of an error (clap's own for usage errors, too).
const ERROR: u8 = 2;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version: exit 0, to standard output; usage errors: clap's 2.
            let text = redact(&e.render().to_string());
            let code = e.exit_code();
            if code == 0 {
                emit(&text);
            } else {
                eprint!("{text}");
            }
            return ExitCode::from(u8::try_from(code).unwrap_or(ERROR));
        }
    };
    let tokio = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(tokio) => tokio,
        Err(e) => return fail(&format!("cannot start the async runtime: {e}")),
    };
    match tokio.block_on(run(cli)) {
        Ok(Found::Yes) => ExitCode::SUCCESS,
        Ok(Found::No) => ExitCode::from(NOT_FOUND),
        Err(message) => fail(&message),
    }
}

/// Prints `message` as one line on standard error (passwords redacted) and exits with 2.
fn fail(message: &str) -> ExitCode {
    let line = redact(message).replace(['\n', '\r'], " ");
    eprintln!("dlock: error: {line}");
    ExitCode::from(ERROR)
}

async fn run(cli: Cli) -> Result<Found, String> {
    if let Command::Unlock { force: false, key } = &cli.command {
        return Err(format!(
            "refusing to unlock `{key}` without --force: it deletes the lock whoever holds it \
             (run `dlock unlock --force {key}`)"
        ));
    }
    let url = cli
        .url
        .as_deref()
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .ok_or("no lock engine: pass --url URL or set DLOCK_URL")?;
    let mut builder = Runtime::builder().url(url).map_err(|e| e.to_string())?;
    if let Some(prefix) = &cli.prefix {
        builder = builder.key_prefix(prefix.as_str());
    }
    let rt = builder.build().await.map_err(|e| e.to_string())?;
    match &cli.command {
        Command::List { filter } => {
            let locks = rt.list(filter).await.map_err(|e| e.to_string())?;
            if cli.json {
                let all: Vec<_> = locks.iter().map(lock_json).collect();
                emit(&json_line(&json!(all)));
            } else if !locks.is_empty() {
                emit(&table(&locks));
            }
            Ok(if locks.is_empty() {
                Found::No
            } else {
                Found::Yes
            })
        }
        Command::Show { key } => {
            let info = rt.inspect(key).await.map_err(|e| e.to_string())?;
            match (&info, cli.json) {
                (Some(info), true) => emit(&json_line(&lock_json(info))),
                (None, true) => emit(&json_line(&serde_json::Value::Null)),
                (Some(info), false) => emit(&details(info)),
                (None, false) => emit(&format!("{key}: not locked\n")),
            }
            Ok(if info.is_some() {
                Found::Yes
            } else {
                Found::No
            })
        }
        Command::Unlock { key, .. } => {
            let deleted = rt.force_unlock(key).await.map_err(|e| e.to_string())?;
            if cli.json {
                emit(&json_line(&json!({ "key": key, "unlocked": deleted })));
            } else if deleted {
                emit(&format!("{key}: force-unlocked\n"));
            } else {
                emit(&format!("{key}: not locked\n"));
            }
            Ok(if deleted { Found::Yes } else { Found::No })
        }
        Command::Watch {
            key,
            count,
            interval,
        } => {
            watch::watch(&rt, key, *count, *interval, cli.json).await?;
            Ok(Found::Yes)
        }
    }
}
