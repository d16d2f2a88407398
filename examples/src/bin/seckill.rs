//! The classic flash sale ("seckill"): 300 buyers race for 100 units of item 42.
//!
//! Three simulated service instances of 100 buyers each (one tokio task per buyer) call
//!
//! ```text
//! #[distributed_lock(key = "stock:<id>", lease = "30s", wait = "2s")]
//! async fn buy(&self, id: u64, user: u64) -> Result<Order, ShopError>
//! ```
//!
//! whose body reads the stock, pauses (simulated work) and writes it back decremented, or
//! returns `ShopError::SoldOut`. Read and write are separate operations, so without the lock
//! many buyers would read the same stock and the item would be oversold. At the end the
//! example prints the orders accepted and rejected and checks that the final stock is
//! `initial - accepted` and never negative; it exits non-zero otherwise.
//!
//! On the embedded memory engine (the instances are task groups in this process):
//!
//! ```text
//! cargo run -p dlock-examples --bin seckill
//! ```
//!
//! On Redis, where the stock is a Redis key too (`dlock-examples:seckill:stock:42`):
//!
//! ```text
//! DLOCK_URL=redis://127.0.0.1:6379 cargo run -p dlock-examples --bin seckill
//! ```
//!
//! With `--instances-as-processes` (Redis only) the three instances are three OS processes
//! of this binary, so the lock really is the only thing they share besides the stock key:
//!
//! ```text
//! DLOCK_URL=redis://127.0.0.1:6379 cargo run -p dlock-examples --bin seckill -- --instances-as-processes
//! ```
//!
//! `RUST_LOG` filters the log on stderr (default `info`; `RUST_LOG=info,seckill=debug` also logs
//! every buyer that gave up waiting).

use std::error::Error;
use std::fmt;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use dlock_examples::store::{Store, StoreError};
use dlock_runtime::{LockError, Runtime, current_fence, distributed_lock};
use tokio::task::JoinSet;

type BoxError = Box<dyn Error + Send + Sync>;

/// The item on sale.
const ITEM: u64 = 42;
/// Units on sale.
const INITIAL_STOCK: i64 = 100;
/// Simulated service instances.
const INSTANCES: u64 = 3;
/// Buyers per instance.
const BUYERS: u64 = 100;
/// Simulated work between reading and writing the stock.
const WORK: Duration = Duration::from_millis(1);

/// A successful purchase.
#[derive(Debug, Clone, Copy)]
struct Order {
    user: u64,
    /// Stock left after this order.
    left: i64,
    /// The fencing token of the lock this order was taken under.
    fence: Option<u64>,
}

/// Why a purchase failed.
#[derive(Debug)]
enum ShopError {
    /// No stock left.
    SoldOut,
    /// The lock was not acquired within `wait` (or could not be kept).
    Busy(LockError),
    /// The stock store failed.
    Store(StoreError),
}

impl From<LockError> for ShopError {
    fn from(err: LockError) -> Self {
        ShopError::Busy(err)
    }
}

impl From<StoreError> for ShopError {
    fn from(err: StoreError) -> Self {
        ShopError::Store(err)
    }
}

impl fmt::Display for ShopError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShopError::SoldOut => f.write_str("sold out"),
            ShopError::Busy(err) => write!(f, "busy: {err}"),
            ShopError::Store(err) => err.fmt(f),
        }
    }
}

impl Error for ShopError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            ShopError::SoldOut => None,
            ShopError::Busy(err) => Some(err),
            ShopError::Store(err) => Some(err),
        }
    }
}

/// One instance's view of the shop: the shared stock store.
#[derive(Debug, Clone)]
struct Shop {
    store: Store,
}

fn stock_key(id: u64) -> String {
    format!("dlock-examples:seckill:stock:{id}")
}

impl Shop {
    /// Sells one unit of item `id` to `user`. One buyer per item at a time, across every
    /// instance sharing the lock engine.
    #[distributed_lock(key = "stock:<id>", lease = "30s", wait = "2s")]
    async fn buy(&self, id: u64, user: u64) -> Result<Order, ShopError> {
        let key = stock_key(id);
        let stock = self.store.get(&key).await?.unwrap_or(0);
        if stock <= 0 {
            return Err(ShopError::SoldOut);
        }
        // Payment, order record, ...: other buyers run meanwhile.
        tokio::time::sleep(WORK).await;
        let left = stock - 1;
        self.store.set(&key, left).await?;
        Ok(Order {
            user,
            left,
            fence: current_fence(),
        })
    }
}

/// What one instance saw.
#[derive(Debug, Default)]
struct Tally {
    orders: Vec<Order>,
    sold_out: u64,
    busy: u64,
    failed: u64,
    /// Orders accepted by each instance.
    per_instance: Vec<(u64, u64)>,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.orders.extend(other.orders);
        self.sold_out += other.sold_out;
        self.busy += other.busy;
        self.failed += other.failed;
        self.per_instance.extend(other.per_instance);
    }

    fn accepted(&self) -> u64 {
        self.orders.len() as u64
    }
}

/// Runs `BUYERS` concurrent buyers in this process as instance `instance`.
async fn run_instance(shop: Shop, instance: u64) -> Result<Tally, BoxError> {
    let mut buyers = JoinSet::new();
    for n in 0..BUYERS {
        let shop = shop.clone();
        let user = instance * 1000 + n;
        buyers.spawn(async move { shop.buy(ITEM, user).await });
    }
    let mut tally = Tally::default();
    while let Some(result) = buyers.join_next().await {
        match result? {
            Ok(order) => tally.orders.push(order),
            Err(ShopError::SoldOut) => tally.sold_out += 1,
            Err(ShopError::Busy(err)) => {
                tracing::debug!(instance, error = %err, "buyer gave up");
                tally.busy += 1;
            }
            Err(err @ ShopError::Store(_)) => {
                tracing::error!(instance, error = %err, "buyer failed");
                tally.failed += 1;
            }
        }
    }
    tally.per_instance = vec![(instance, tally.accepted())];
    Ok(tally)
}

/// The instances as task groups of this process, sharing the installed runtime.
async fn run_in_process(shop: &Shop) -> Result<Tally, BoxError> {
    let mut instances = JoinSet::new();
    for instance in 1..=INSTANCES {
        instances.spawn(run_instance(shop.clone(), instance));
    }
    let mut total = Tally::default();
    while let Some(tally) = instances.join_next().await {
        let tally = tally??;
        total.add(tally);
    }
    Ok(total)
}

/// The instances as OS processes of this binary (`--instance N`), each with its own runtime.
async fn run_as_processes() -> Result<Tally, BoxError> {
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for instance in 1..=INSTANCES {
        let child = tokio::process::Command::new(&exe)
            .arg("--instance")
            .arg(instance.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        children.push((instance, child));
    }
    let mut total = Tally::default();
    for (instance, child) in children {
        let output = child.wait_with_output().await?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            return Err(format!("instance {instance} failed ({}): {stdout}", output.status).into());
        }
        let mut tally = parse_report(&stdout)
            .ok_or_else(|| format!("instance {instance} printed no report: {stdout:?}"))?;
        tally.per_instance = vec![(instance, tally.accepted())];
        total.add(tally);
    }
    Ok(total)
}

/// A child's report on stdout: one `order <user> <left> <fence|->` line per order, then
/// `rejected <sold_out> <busy> <failed>`.
fn print_report(tally: &Tally) {
    for order in &tally.orders {
        let fence = order.fence.map_or("-".to_owned(), |f| f.to_string());
        println!("order {} {} {fence}", order.user, order.left);
    }
    println!(
        "rejected {} {} {}",
        tally.sold_out, tally.busy, tally.failed
    );
}

fn parse_report(text: &str) -> Option<Tally> {
    let mut tally = Tally::default();
    let mut complete = false;
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["order", user, left, fence] => tally.orders.push(Order {
                user: user.parse().ok()?,
                left: left.parse().ok()?,
                fence: fence.parse().ok(),
            }),
            ["rejected", sold_out, busy, failed] => {
                tally.sold_out = sold_out.parse().ok()?;
                tally.busy = busy.parse().ok()?;
                tally.failed = failed.parse().ok()?;
                complete = true;
            }
            _ => return None,
        }
    }
    complete.then_some(tally)
}

/// Checks the sale: returns the problems found, none when the lock did its job.
fn check(tally: &Tally, initial: i64, final_stock: i64) -> Vec<String> {
    let mut problems = Vec::new();
    let accepted = i64::try_from(tally.accepted()).unwrap_or(i64::MAX);
    if final_stock < 0 {
        problems.push(format!("final stock is negative: {final_stock}"));
    }
    if final_stock != initial - accepted {
        problems.push(format!(
            "oversold: {accepted} orders accepted but the stock went from {initial} to {final_stock}"
        ));
    }
    // Under mutual exclusion every order saw a different stock level...
    let mut lefts: Vec<i64> = tally.orders.iter().map(|o| o.left).collect();
    lefts.sort_unstable();
    lefts.dedup();
    if lefts.len() != tally.orders.len() {
        problems.push(format!(
            "{} orders were taken from the same stock level",
            tally.orders.len() - lefts.len()
        ));
    }
    // ...and the later an order (the less stock it left), the higher its lock's fence.
    let mut fenced: Vec<(i64, u64)> = tally
        .orders
        .iter()
        .filter_map(|o| Some((o.left, o.fence?)))
        .collect();
    fenced.sort_unstable_by_key(|&(left, _)| std::cmp::Reverse(left));
    if fenced.windows(2).any(|w| w[0].1 >= w[1].1) {
        problems.push("fencing tokens do not increase in the order the stock was taken".into());
    }
    if tally.failed > 0 {
        problems.push(format!(
            "{} buyers failed with store errors; see the log",
            tally.failed
        ));
    }
    problems
}

enum Mode {
    InProcess,
    Processes,
    Child(u64),
}

fn parse_args() -> Result<Mode, BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => Ok(Mode::InProcess),
        ["--instances-as-processes"] => Ok(Mode::Processes),
        ["--instance", n] => Ok(Mode::Child(n.parse()?)),
        _ => Err(format!("usage: seckill [--instances-as-processes]   (got {args:?})").into()),
    }
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    dlock_examples::init_logging();
    let mode = parse_args()?;

    // DLOCK_URL, or the in-process memory:// engine (with a warning) when unset.
    let runtime = Runtime::from_env().await?;
    runtime.clone().install()?;
    let store = Store::from_env().await?;
    let shop = Shop { store };

    if let Mode::Child(instance) = mode {
        let tally = run_instance(shop, instance).await?;
        print_report(&tally);
        return Ok(ExitCode::SUCCESS);
    }
    if matches!(mode, Mode::Processes) && shop.store.kind() != "redis" {
        return Err(
            "--instances-as-processes needs a shared engine: set DLOCK_URL=redis://host:port"
                .into(),
        );
    }

    shop.store.set(&stock_key(ITEM), INITIAL_STOCK).await?;
    let how = match mode {
        Mode::Processes => "OS processes",
        _ => "task groups",
    };
    println!(
        "seckill: {} units of item {ITEM}, {INSTANCES} instances ({how}) x {BUYERS} buyers; locks on {}, stock in {}",
        INITIAL_STOCK,
        runtime.engine(),
        shop.store.kind(),
    );

    let started = Instant::now();
    let tally = match mode {
        Mode::Processes => run_as_processes().await?,
        _ => run_in_process(&shop).await?,
    };
    let elapsed = started.elapsed();
    let final_stock = shop.store.get(&stock_key(ITEM)).await?.unwrap_or(0);

    let mut per_instance = tally.per_instance.clone();
    per_instance.sort_unstable();
    let per_instance: Vec<String> = per_instance
        .iter()
        .map(|(instance, accepted)| format!("#{instance}: {accepted}"))
        .collect();
    println!(
        "orders accepted:            {} ({})",
        tally.accepted(),
        per_instance.join(", ")
    );
    println!(
        "orders rejected:            {} (sold out {}, busy {}, failed {})",
        tally.sold_out + tally.busy + tally.failed,
        tally.sold_out,
        tally.busy,
        tally.failed
    );
    println!("stock: initial {INITIAL_STOCK}, final {final_stock}");
    println!("took {elapsed:.2?}");

    let problems = check(&tally, INITIAL_STOCK, final_stock);
    if problems.is_empty() {
        println!(
            "OK: final stock = initial - accepted = {}, never below zero",
            final_stock
        );
        Ok(ExitCode::SUCCESS)
    } else {
        for problem in &problems {
            eprintln!("FAILED: {problem}");
        }
        Ok(ExitCode::FAILURE)
    }
}
