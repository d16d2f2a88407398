//! The lease watchdog: a lock with a 3 s lease held for 10 s, and the same job without it.
//!
//! ```text
//! #[distributed_lock(key = "report:nightly", lease = "3s")]
//! async fn nightly_report(..)            // works for 10 s
//!
//! #[distributed_lock(key = "report:capped", lease = "3s", watchdog = false)]
//! async fn capped_report(..)             // tries to work for 6 s
//! ```
//!
//! The lease is the TTL the engine keeps the lock for if its holder stops renewing it (the
//! process died). While the body runs, the runtime's watchdog renews it every `lease / 3`, so
//! the first job keeps the lock for all 10 s. Each second it prints the lock's state:
//!
//! - on Redis, the remaining TTL (`PTTL dlock:{report:nightly}` on a raw connection), which
//!   climbs back to about 3 s after each renewal instead of running out;
//! - on the memory engine, which has no TTL to show, whether the key is locked
//!   (`Runtime::is_locked`): still locked long after the 3 s lease.
//!
//! The second job turns the watchdog off, which makes the lease a hard cap: after 3 s the lock
//! expires, the runtime counts it as lost, and (with the default `on_lost = "cancel"`) drops the
//! body and returns `LockError::Lost`.
//!
//! ```text
//! cargo run -p dlock-examples --bin watchdog
//! DLOCK_URL=redis://127.0.0.1:6379 cargo run -p dlock-examples --bin watchdog
//! ```

use std::error::Error;
use std::time::{Duration, Instant};

use dlock_examples::store::without_runtime_params;
use dlock_runtime::{LockError, Runtime, current_fence, distributed_lock};

type BoxError = Box<dyn Error + Send + Sync>;

/// How long the first job holds its lock.
const HOLD_SECS: u64 = 10;
/// How long the capped job would like to run.
const CAPPED_SECS: u64 = 6;

/// Looks at a lock from the outside.
enum Probe {
    /// A raw Redis connection to read the lock hash's TTL.
    Redis {
        conn: redis::aio::MultiplexedConnection,
        prefix: String,
    },
    /// The memory engine has no TTL to show: ask whether the key is locked.
    Memory(Runtime),
}

impl Probe {
    async fn new(runtime: &Runtime) -> Result<Probe, BoxError> {
        match std::env::var("DLOCK_URL") {
            Ok(url) if runtime.engine() == "redis" => {
                let client = redis::Client::open(without_runtime_params(url.trim()))?;
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(3)))
                    .set_response_timeout(Some(Duration::from_secs(3)));
                let conn = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                Ok(Probe::Redis {
                    conn,
                    prefix: runtime.key_prefix().to_owned(),
                })
            }
            _ => Ok(Probe::Memory(runtime.clone())),
        }
    }

    /// One line about `key`'s lock.
    async fn describe(&self, key: &str) -> Result<String, BoxError> {
        match self {
            Probe::Redis { conn, prefix } => {
                // The lock hash of `key` is `<prefix>{<key>}`, and its TTL is the lease.
                let name = format!("{prefix}{{{key}}}");
                let pttl: i64 = redis::cmd("PTTL")
                    .arg(&name)
                    .query_async(&mut conn.clone())
                    .await?;
                Ok(match pttl {
                    -2 => format!("PTTL {name}: no such key (unlocked)"),
                    -1 => format!("PTTL {name}: no expiry (?)"),
                    ms => format!("PTTL {name}: {:.2} s left", ms as f64 / 1000.0),
                })
            }
            Probe::Memory(runtime) => Ok(if runtime.is_locked(key).await? {
                format!("{key}: locked")
            } else {
                format!("{key}: unlocked")
            }),
        }
    }
}

/// Holds `report:nightly` for `HOLD_SECS`, more than three times its lease.
#[distributed_lock(key = "report:nightly", lease = "3s")]
async fn nightly_report(probe: &Probe) -> Result<(), BoxError> {
    println!(
        "acquired report:nightly (fence {:?}) with a 3 s lease; working for {HOLD_SECS} s",
        current_fence()
    );
    for second in 1..=HOLD_SECS {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let note = if second >= 3 {
            "past the 3 s lease: renewed by the watchdog"
        } else {
            "the watchdog renews every 1 s"
        };
        println!(
            "  t = {second:>2} s  {}  ({note})",
            probe.describe("report:nightly").await?
        );
    }
    Ok(())
}

/// Would hold `report:capped` for `CAPPED_SECS`, but the lease is a hard cap of 3 s.
#[distributed_lock(key = "report:capped", lease = "3s", watchdog = false)]
async fn capped_report(probe: &Probe) -> Result<(), BoxError> {
    println!(
        "acquired report:capped with a 3 s lease and no watchdog; working for {CAPPED_SECS} s"
    );
    for second in 1..=CAPPED_SECS {
        tokio::time::sleep(Duration::from_secs(1)).await;
        println!(
            "  t = {second:>2} s  {}",
            probe.describe("report:capped").await?
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    dlock_examples::init_logging();

    // DLOCK_URL, or the in-process memory:// engine (with a warning) when unset.
    let runtime = Runtime::from_env().await?;
    runtime.clone().install()?;
    let probe = Probe::new(&runtime).await?;
    println!("locks on {}", runtime.engine());

    println!("\n1. watchdog on (default)");
    nightly_report(&probe).await?;
    println!(
        "done and released: {}",
        probe.describe("report:nightly").await?
    );

    println!("\n2. watchdog = false: the lease is a hard cap");
    let started = Instant::now();
    match capped_report(&probe).await {
        Ok(()) => {
            return Err("the capped job ran to completion past its 3 s lease".into());
        }
        Err(err) => match err.downcast_ref::<LockError>() {
            Some(lost @ LockError::Lost { .. }) => println!(
                "cancelled after {:.1?}: {lost}; {}",
                started.elapsed(),
                probe.describe("report:capped").await?
            ),
            _ => return Err(err),
        },
    }
    Ok(())
}
