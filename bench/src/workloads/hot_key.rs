//! Contention: many tasks selling from one counter guarded by one hot key.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlock_runtime::Runtime;

use crate::baselines::{ping_round_trips, raw_conn};
use crate::commandstats::{self, CLIENT_COMMANDS};
use crate::report::Row;
use crate::stats::{p50, percentile, ratio, sorted, us};
use crate::{BoxError, Setup};

/// The outcome of one hot-key run.
pub(crate) struct HotKey {
    sales_per_sec: f64,
    /// Release sent by one holder to acquisition by the next, sorted.
    handoff: Vec<Duration>,
    client_cmds_per_sale: f64,
    all_cmds_per_sale: f64,
    /// Whether the counter equals the sales: no two holders overlapped.
    exact: bool,
    sales: u64,
}

impl HotKey {
    /// Whether the counter equals the sales: no two holders overlapped.
    pub(crate) fn exact(&self) -> bool {
        self.exact
    }

    /// The median handoff.
    pub(crate) fn handoff_p50(&self) -> Duration {
        p50(&self.handoff)
    }
}

/// `tasks` tasks selling `sales` on one key, critical section `GET` + `SET` of a counter; the
/// counter (and the command statistics) live on the standalone server at `url`, the lock on
/// `rt`.
pub(crate) async fn run(
    rt: Runtime,
    url: &str,
    tasks: usize,
    sales: u64,
) -> Result<HotKey, BoxError> {
    let mut stats_conn = raw_conn(url).await?;
    let data = raw_conn(url).await?;
    let _: () = redis::cmd("SET")
        .arg("hot:counter")
        .arg(0)
        .query_async(&mut stats_conn.clone())
        .await?;
    let before = commandstats::read(&mut stats_conn).await?;
    let sold = Arc::new(AtomicU64::new(0));
    // Instant the last holder sent its release, as nanoseconds since `origin` (0: none yet).
    let origin = Instant::now();
    let released_at = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..tasks {
        let rt = rt.clone();
        let sold = sold.clone();
        let released_at = released_at.clone();
        let mut data = data.clone();
        set.spawn(async move {
            let mut handoffs = Vec::new();
            loop {
                let guard = rt
                    .lock("stock")
                    .wait(Duration::from_secs(60))
                    .acquire()
                    .await?;
                let acquired = origin.elapsed().as_nanos() as u64;
                let prev = released_at.swap(0, Ordering::AcqRel);
                if prev != 0 {
                    handoffs.push(Duration::from_nanos(acquired - prev));
                }
                if sold.load(Ordering::Acquire) >= sales {
                    guard.release().await?;
                    return Ok::<_, BoxError>(handoffs);
                }
                let n: u64 = redis::cmd("GET")
                    .arg("hot:counter")
                    .query_async(&mut data)
                    .await?;
                let _: () = redis::cmd("SET")
                    .arg("hot:counter")
                    .arg(n + 1)
                    .query_async(&mut data)
                    .await?;
                sold.fetch_add(1, Ordering::AcqRel);
                released_at.store(origin.elapsed().as_nanos() as u64, Ordering::Release);
                guard.release().await?;
            }
        });
    }
    let mut handoff = Vec::new();
    while let Some(r) = set.join_next().await {
        handoff.extend(r??);
    }
    let elapsed = t.elapsed();
    let after = commandstats::read(&mut stats_conn).await?;
    let counter: u64 = redis::cmd("GET")
        .arg("hot:counter")
        .query_async(&mut stats_conn)
        .await?;
    let sold = sold.load(Ordering::Acquire);
    if std::env::var_os("DLOCK_BENCH_SHOW_COMMANDS").is_some() {
        let mut names: Vec<_> = after.keys().collect();
        names.sort();
        for name in names {
            let n = after[name] - before.get(name).copied().unwrap_or(0);
            if n > 0 {
                eprintln!("{name}: {n} ({:.3} a sale)", n as f64 / sold as f64);
            }
        }
    }
    let client = commandstats::delta(&before, &after, CLIENT_COMMANDS) as f64;
    let all = commandstats::delta_all(&before, &after) as f64;
    Ok(HotKey {
        sales_per_sec: sold as f64 / elapsed.as_secs_f64(),
        handoff: sorted(handoff),
        client_cmds_per_sale: client / sold as f64,
        all_cmds_per_sale: all / sold as f64,
        exact: counter == sold,
        sales: sold,
    })
}

/// Section `hot`: 256 tasks on one key; sales/s, handoff against one raw `PING` round trip
/// (sampled right before and right after the run), and commands per sale.
pub(crate) async fn rows(setup: &Setup) -> Result<Vec<Row>, BoxError> {
    let url = &setup.url;
    let mut rtt = ping_round_trips(url, 1000).await?;
    let hot_rt = super::redis_runtime(url, "hot:").await?;
    let hot = run(hot_rt, url, 256, 1500 * setup.options.scale() as u64).await?;
    rtt.extend(ping_round_trips(url, 1000).await?);
    let rtt = sorted(rtt);
    let rtt50 = p50(&rtt);
    let round_trips = |d| format!("{:.2} round trips", ratio(d, rtt50));
    let (h50, h99) = (hot.handoff_p50(), percentile(&hot.handoff, 0.99));
    let sold = if hot.exact {
        format!("counter exact ({} sales)", hot.sales)
    } else {
        "COUNTER WRONG".into()
    };
    Ok(vec![
        Row::new(
            "hot key, 256 tasks, GET+SET inside",
            format!("{:.0} sales/s", hot.sales_per_sec),
            "",
            sold,
            "counter exact",
        ),
        Row::new(
            "hot key handoff (release sent -> next holder), p50",
            us(h50),
            format!("{} (1 raw PING round trip)", us(rtt50)),
            round_trips(h50),
            "<= 3 round trips",
        ),
        Row::new(
            "hot key handoff, p99",
            us(h99),
            format!("{} (raw PING p99)", us(percentile(&rtt, 0.99))),
            round_trips(h99),
            "",
        ),
        Row::new(
            "hot key, Redis commands per sale",
            format!("{:.2} sent by clients", hot.client_cmds_per_sale),
            "4 = acquire + GET + SET + release",
            format!("{:.2} incl. those inside scripts", hot.all_cmds_per_sale),
            "<= 8 sent",
        ),
    ])
}
