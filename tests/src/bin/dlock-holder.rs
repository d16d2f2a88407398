//! `dlock-holder`: takes dlock locks from a separate OS process, for the end-to-end tests.
//!
//! ```text
//! dlock-holder --url URL --key KEY --mode counter --iterations N [--counter REDIS_KEY]
//!     [--counter-url redis://...]   (where the counter lives; default: URL, which must then be
//!                                    a plain redis:// URL; needed for cluster and redlock URLs)
//!     N times: acquire KEY, GET the counter, sleep 1 ms, SET it to the value + 1, release.
//!     The increment is not atomic, so the final count is exact only under mutual exclusion.
//!     Prints "done N" at the end.
//! dlock-holder --url URL --key KEY --mode attr-counter --iterations N [--counter REDIS_KEY]
//!     The same increment as `counter`, but inside an `async fn` annotated with
//!     `#[distributed_lock(key = "{key}", lease = "30s", wait = "60s")]`, run on the runtime for
//!     URL installed as the process default. Prints "done N" at the end.
//! dlock-holder --url URL --key KEY --mode hold --lease-ms L [--watchdog false]
//!     [--report-ms R] [--fair true] [--wait-ms W]
//!     Acquires KEY with lease L (a fair lock with `--fair true`, waiting up to W ms, default
//!     30 s), prints "acquired <fence>" ("acquired none" without a fence) and holds it until
//!     killed; prints "lost" and exits 3 if the lease is lost. With R, also
//!     prints "valid <ms> <unix ms>" every R ms: the guard's `valid_for()` and the wall clock.
//!     With `--permits P`, holds one permit of the semaphore KEY of P instead; with `--read`,
//!     a read lock.
//! ```

use std::error::Error;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use dlock_runtime::{Runtime, distributed_lock};
use dlock_tests::racy_increment;

type BoxError = Box<dyn Error + Send + Sync>;

#[derive(Debug)]
enum Mode {
    Counter {
        iterations: u64,
        counter: String,
    },
    AttrCounter {
        iterations: u64,
        counter: String,
    },
    Hold {
        lease: Duration,
        watchdog: bool,
        report: Option<Duration>,
        permits: Option<u32>,
        read: bool,
        fair: bool,
        wait: Duration,
    },
}

#[derive(Debug)]
struct Args {
    url: String,
    /// Where the counter lives (a plain `redis://` URL); defaults to `url`.
    counter_url: String,
    key: String,
    mode: Mode,
}

fn parse_args() -> Result<Args, BoxError> {
    let mut url = None;
    let mut key = None;
    let mut mode = None;
    let mut iterations = 100u64;
    let mut counter = None;
    let mut counter_url = None;
    let mut lease_ms = 30_000u64;
    let mut watchdog = true;
    let mut report = None;
    let mut permits = None;
    let mut read = false;
    let mut fair = false;
    let mut wait_ms = 30_000u64;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => url = Some(value()?),
            "--counter-url" => counter_url = Some(value()?),
            "--key" => key = Some(value()?),
            "--mode" => mode = Some(value()?),
            "--iterations" => iterations = value()?.parse()?,
            "--counter" => counter = Some(value()?),
            "--lease-ms" => lease_ms = value()?.parse()?,
            "--watchdog" => watchdog = value()?.parse()?,
            "--permits" => permits = Some(value()?.parse()?),
            "--read" => read = true,
            "--report-ms" => report = Some(Duration::from_millis(value()?.parse()?)),
            "--fair" => fair = value()?.parse()?,
            "--wait-ms" => wait_ms = value()?.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let url: String = url.ok_or("--url is required")?;
    let counter_url = counter_url.unwrap_or_else(|| url.clone());
    let key = key.ok_or("--key is required")?;
    let mode = match mode.as_deref() {
        Some("counter") => Mode::Counter {
            iterations,
            counter: counter.unwrap_or_else(|| format!("counter:{key}")),
        },
        Some("attr-counter") => Mode::AttrCounter {
            iterations,
            counter: counter.unwrap_or_else(|| format!("counter:{key}")),
        },
        Some("hold") => Mode::Hold {
            lease: Duration::from_millis(lease_ms),
            watchdog,
            report,
            permits,
            read,
            fair,
            wait: Duration::from_millis(wait_ms),
        },
        other => {
            return Err(
                format!("--mode must be counter, attr-counter or hold, got {other:?}").into(),
            );
        }
    };
    Ok(Args {
        url,
        counter_url,
        key,
        mode,
    })
}

async fn run(args: Args) -> Result<ExitCode, BoxError> {
    let rt = Runtime::from_url(&args.url).await?;
    match args.mode {
        Mode::Counter {
            iterations,
            counter,
        } => {
            let mut conn = redis::Client::open(args.counter_url.as_str())?
                .get_multiplexed_async_connection()
                .await?;
            for _ in 0..iterations {
                let guard = rt
                    .lock(args.key.as_str())
                    .wait(Duration::from_secs(60))
                    .acquire()
                    .await?;
                racy_increment(&counter, &mut conn).await?;
                guard.release().await?;
            }
            println!("done {iterations}");
            Ok(ExitCode::SUCCESS)
        }
        Mode::AttrCounter {
            iterations,
            counter,
        } => {
            rt.install()?;
            let mut conn = redis::Client::open(args.counter_url.as_str())?
                .get_multiplexed_async_connection()
                .await?;
            for _ in 0..iterations {
                attr_increment(&args.key, &counter, &mut conn).await?;
            }
            println!("done {iterations}");
            Ok(ExitCode::SUCCESS)
        }
        Mode::Hold {
            lease,
            watchdog,
            report,
            permits,
            read,
            fair,
            wait,
        } => {
            let builder = match permits {
                Some(permits) => rt.semaphore(args.key.as_str(), permits),
                None if read => rt.lock(args.key.as_str()).read(),
                None => rt.lock(args.key.as_str()),
            };
            let guard = builder
                .lease(lease)
                .watchdog(watchdog)
                .fair(fair)
                .wait(wait)
                .acquire()
                .await?;
            match guard.fence() {
                Some(fence) => println!("acquired {fence}"),
                None => println!("acquired none"),
            }
            std::io::stdout().flush()?;
            match report {
                None => guard.lost().await,
                Some(every) => {
                    let reports = async {
                        loop {
                            let now = std::time::SystemTime::now()
                                .duration_since(std::time::UNIX_EPOCH)
                                .unwrap_or_default();
                            println!(
                                "valid {} {}",
                                guard.valid_for().as_millis(),
                                now.as_millis()
                            );
                            tokio::time::sleep(every).await;
                        }
                    };
                    tokio::select! {
                        () = guard.lost() => {}
                        () = reports => {}
                    }
                }
            }
            println!("lost");
            Ok(ExitCode::from(3))
        }
    }
}

/// [`racy_increment`] of the counter: exact only under mutual exclusion, which here comes from
/// the attribute alone (on the installed runtime).
#[distributed_lock(key = "{key}", lease = "30s", wait = "60s")]
async fn attr_increment(
    key: &str,
    counter: &str,
    conn: &mut redis::aio::MultiplexedConnection,
) -> Result<(), BoxError> {
    Ok(racy_increment(counter, conn).await?)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("dlock-holder: {e}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("dlock-holder: {e}");
            ExitCode::FAILURE
        }
    }
}
