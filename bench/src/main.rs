//! The benchmark program: every figure next to a baseline measured in the same run.
//!
//! ```text
//! cargo run --release -p dlock-examples --bin bench            # full run, about a minute
//! cargo run --release -p dlock-examples --bin bench -- --quick # smaller counts
//! ```
//!
//! It starts its own `redis-server` (override with `DLOCK_REDIS_SERVER`) on a free loopback
//! port with no persistence, and prints one Markdown table:
//! - sequential acquire + release, against two raw `EVALSHA` round trips of a trivial script;
//! - 64 tasks on distinct keys, against the same two raw calls issued by 64 tasks;
//! - a hot key: 256 tasks in one process on one key, critical section `GET` + `SET` of a
//!   counter; sales/s, handoff latency (release sent by one holder to acquisition by the next,
//!   against one raw round trip), and Redis commands per sale from `INFO commandstats`;
//! - 10,000 locks held at once with a 3 s lease for 10 s: renewal calls per second and the
//!   process's memory per held lock;
//! - the attribute's cost: an annotated function against the same body written by hand with
//!   `lock().acquire()` + body + `release()`, on the memory backend.

use std::collections::HashMap;
use std::error::Error;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlock_runtime::{LockError, Runtime, distributed_lock, lock};
use redis::aio::MultiplexedConnection;

type BoxError = Box<dyn Error + Send + Sync>;

/// A redis-server of our own, killed on drop.
struct Server {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl Server {
    fn start() -> Result<Self, BoxError> {
        Self::start_with(&[])
    }

    /// A server with extra arguments (e.g. cluster mode).
    fn start_with(extra: &[&str]) -> Result<Self, BoxError> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let dir = std::env::temp_dir().join(format!("dlock-bench-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let bin = std::env::var("DLOCK_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let child = Command::new(&bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(extra)
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("cannot start {bin} ({e}); install it: apt-get install -y redis-server")
            })?;
        let server = Self { child, port, dir };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if started.elapsed() > Duration::from_secs(10) {
                return Err("redis-server did not start within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn us(d: Duration) -> String {
    format!("{:.0} us", d.as_secs_f64() * 1e6)
}

struct Row {
    what: String,
    figure: String,
    baseline: String,
    ratio: String,
    target: String,
}

fn row(what: &str, figure: String, baseline: String, ratio: String, target: &str) -> Row {
    Row {
        what: what.into(),
        figure,
        baseline,
        ratio,
        target: target.into(),
    }
}

async fn raw_conn(url: &str) -> Result<MultiplexedConnection, BoxError> {
    let client = redis::Client::open(format!("{url}?protocol=resp3"))?;
    Ok(client.get_multiplexed_async_connection().await?)
}

async fn commandstats(conn: &mut MultiplexedConnection) -> Result<HashMap<String, u64>, BoxError> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    let mut stats = HashMap::new();
    for line in info.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, fields)) = rest.split_once(':') else {
            continue;
        };
        let calls = fields
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        stats.insert(name.to_owned(), calls);
    }
    Ok(stats)
}

fn delta(before: &HashMap<String, u64>, after: &HashMap<String, u64>, names: &[&str]) -> u64 {
    names
        .iter()
        .map(|n| after.get(*n).copied().unwrap_or(0) - before.get(*n).copied().unwrap_or(0))
        .sum()
}

/// Commands a client sends (as opposed to the ones our scripts run inside Redis).
const CLIENT_COMMANDS: &[&str] = &[
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

/// Two raw EVALSHA round trips of a trivial script: the floor of acquire + release.
async fn raw_pairs_sequential(url: &str, n: usize) -> Result<Vec<Duration>, BoxError> {
    let mut conn = raw_conn(url).await?;
    let script = redis::Script::new("return 1");
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let t = Instant::now();
        let _: i64 = script.key("k").arg(1).invoke_async(&mut conn).await?;
        let _: i64 = script.key("k").arg(1).invoke_async(&mut conn).await?;
        if i >= n / 10 {
            lat.push(t.elapsed());
        }
    }
    lat.sort();
    Ok(lat)
}

async fn lock_pairs_sequential(rt: &Runtime, n: usize) -> Result<Vec<Duration>, BoxError> {
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let t = Instant::now();
        let guard = rt.lock("bench:seq").acquire().await?;
        guard.release().await?;
        if i >= n / 10 {
            lat.push(t.elapsed());
        }
    }
    lat.sort();
    Ok(lat)
}

/// The runtime's own acquire and release scripts, issued raw (no runtime) by `tasks` tasks.
async fn raw_pairs_parallel(url: &str, tasks: usize, per_task: usize) -> Result<f64, BoxError> {
    let conn = raw_conn(url).await?;
    let acquire = Arc::new(redis::Script::new(dlock_runtime::testing::scripts::ACQUIRE));
    let release = Arc::new(redis::Script::new(dlock_runtime::testing::scripts::RELEASE));
    let t = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for k in 0..tasks {
        let mut conn = conn.clone();
        let (acquire, release) = (acquire.clone(), release.clone());
        set.spawn(async move {
            let owner = format!("{k:032x}");
            for _ in 0..per_task {
                let key = format!("raw:{{par:{k}}}");
                let _: i64 = acquire
                    .key(&key)
                    .key(format!("{key}:fence"))
                    .arg(&owner)
                    .arg(30_000)
                    .arg(630_000)
                    .invoke_async(&mut conn)
                    .await?;
                let freed: i64 = release
                    .key(&key)
                    .arg(&owner)
                    .arg(format!("{key}:released"))
                    .arg("raw")
                    .arg("PUBLISH")
                    .invoke_async(&mut conn)
                    .await?;
                if freed != 1 {
                    return Err::<(), BoxError>("raw release did not free the key".into());
                }
            }
            Ok(())
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok((tasks * per_task) as f64 / t.elapsed().as_secs_f64())
}

async fn lock_pairs_parallel(rt: &Runtime, tasks: usize, per_task: usize) -> Result<f64, BoxError> {
    let t = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for k in 0..tasks {
        let rt = rt.clone();
        set.spawn(async move {
            let key = format!("bench:par:{k}");
            for _ in 0..per_task {
                let guard = rt.lock(key.as_str()).acquire().await?;
                guard.release().await?;
            }
            Ok::<_, BoxError>(())
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok((tasks * per_task) as f64 / t.elapsed().as_secs_f64())
}

struct HotKey {
    sales_per_sec: f64,
    handoff: Vec<Duration>,
    client_cmds_per_sale: f64,
    all_cmds_per_sale: f64,
    exact: bool,
    sales: u64,
}

/// 256 tasks selling on one key; the counter (and the command statistics) live on the
/// standalone server at `url`, the lock on `rt`.
async fn hot_key(rt: Runtime, url: &str, tasks: usize, sales: u64) -> Result<HotKey, BoxError> {
    let mut stats_conn = raw_conn(url).await?;
    let data = raw_conn(url).await?;
    let _: () = redis::cmd("SET")
        .arg("hot:counter")
        .arg(0)
        .query_async(&mut stats_conn.clone())
        .await?;
    let before = commandstats(&mut stats_conn).await?;
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
    let after = commandstats(&mut stats_conn).await?;
    let counter: u64 = redis::cmd("GET")
        .arg("hot:counter")
        .query_async(&mut stats_conn)
        .await?;
    let sold = sold.load(Ordering::Acquire);
    let client = delta(&before, &after, CLIENT_COMMANDS) as f64;
    let all: u64 = after
        .iter()
        .filter(|(name, _)| !matches!(name.as_str(), "info"))
        .map(|(name, calls)| calls - before.get(name).copied().unwrap_or(0))
        .sum();
    handoff.sort();
    Ok(HotKey {
        sales_per_sec: sold as f64 / elapsed.as_secs_f64(),
        handoff,
        client_cmds_per_sale: client / sold as f64,
        all_cmds_per_sale: all as f64 / sold as f64,
        exact: counter == sold,
        sales: sold,
    })
}

async fn raw_round_trips(url: &str, n: usize) -> Result<Vec<Duration>, BoxError> {
    let mut conn = raw_conn(url).await?;
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        lat.push(t.elapsed());
    }
    lat.sort();
    Ok(lat)
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map_or(0, |pages| pages * 4096)
}

struct ManyHeld {
    held: usize,
    renew_calls_per_sec: f64,
    bytes_per_lock: f64,
    all_alive: bool,
}

async fn many_held(url: &str, count: usize, hold: Duration) -> Result<ManyHeld, BoxError> {
    let rt = Runtime::builder()
        .redis(url)
        .key_prefix("many:")
        .build()
        .await?;
    let mut stats_conn = raw_conn(url).await?;
    let rss_before = rss_bytes();
    let mut set = tokio::task::JoinSet::new();
    let per_task = count / 64;
    for t in 0..64 {
        let rt = rt.clone();
        set.spawn(async move {
            let mut guards = Vec::with_capacity(per_task);
            for i in 0..per_task {
                guards.push(
                    rt.lock(format!("lock:{t}:{i}"))
                        .lease(Duration::from_secs(3))
                        .acquire()
                        .await?,
                );
            }
            Ok::<_, LockError>(guards)
        });
    }
    let mut guards = Vec::with_capacity(count);
    while let Some(r) = set.join_next().await {
        guards.extend(r??);
    }
    let rss_held = rss_bytes();
    let before = commandstats(&mut stats_conn).await?;
    tokio::time::sleep(hold).await;
    let after = commandstats(&mut stats_conn).await?;
    let renew_calls = delta(&before, &after, &["evalsha", "eval"]);
    let all_alive = guards.iter().all(|g| !g.is_lost());
    let dbsize: u64 = redis::cmd("DBSIZE").query_async(&mut stats_conn).await?;
    let held = guards.len();
    for g in guards {
        g.release().await?;
    }
    Ok(ManyHeld {
        held,
        renew_calls_per_sec: renew_calls as f64 / hold.as_secs_f64(),
        bytes_per_lock: rss_held.saturating_sub(rss_before) as f64 / held as f64,
        // every lock hash and its fence counter still present after the hold
        all_alive: all_alive && dbsize >= 2 * held as u64,
    })
}

#[distributed_lock(key = "bench:{i}")]
async fn annotated(i: u64) -> Result<u64, LockError> {
    Ok(std::hint::black_box(i) + 1)
}

async fn by_hand(i: u64) -> Result<u64, LockError> {
    let guard = lock(format!("bench:{i}")).acquire().await?;
    let out = std::hint::black_box(i) + 1;
    guard.release().await?;
    Ok(out)
}

/// The attribute against the same body by hand: many short interleaved rounds on a
/// single-threaded runtime; returns (best annotated ns/call, best by-hand ns/call, median of
/// the per-round ratios).
fn macro_cost(url: &str, rounds: usize, per_round: u64) -> Result<(f64, f64, f64), BoxError> {
    let tokio_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    tokio_rt.block_on(async {
        let rt = Runtime::from_url(url).await?;
        rt.scope(async {
            let mut best = (f64::MAX, f64::MAX);
            let mut ratios = Vec::with_capacity(rounds);
            for round in 0..rounds + 2 {
                let t = Instant::now();
                for i in 0..per_round {
                    annotated(i % 64).await?;
                }
                let a = t.elapsed().as_secs_f64() * 1e9 / per_round as f64;
                let t = Instant::now();
                for i in 0..per_round {
                    by_hand(i % 64).await?;
                }
                let h = t.elapsed().as_secs_f64() * 1e9 / per_round as f64;
                if round >= 2 {
                    best = (best.0.min(a), best.1.min(h));
                    ratios.push(a / h);
                }
            }
            ratios.sort_by(f64::total_cmp);
            Ok::<_, BoxError>((best.0, best.1, ratios[ratios.len() / 2]))
        })
        .await
    })
}

/// etcd and ZooKeeper rows: each engine's sequential acquire + release and hot-key handoff,
/// against the engine's own round trips measured in the same run.
#[cfg(feature = "cp-engines")]
mod cp {
    use super::*;

    /// A child process killed (and its directory removed) on drop.
    struct Proc(Child, std::path::PathBuf);

    impl Drop for Proc {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }

    fn free_port() -> Result<u16, BoxError> {
        Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
    }

    fn temp_dir(name: &str) -> Result<std::path::PathBuf, BoxError> {
        let dir = std::env::temp_dir().join(format!("dlock-bench-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    async fn wait_for_port(port: u16) -> Result<(), BoxError> {
        let started = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            if started.elapsed() > Duration::from_secs(30) {
                return Err(format!("nothing listens on {port} after 30 s").into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    async fn start_etcd() -> Result<(Proc, String), BoxError> {
        let (client, peer) = (free_port()?, free_port()?);
        let dir = temp_dir("etcd")?;
        let child = Command::new(std::env::var("DLOCK_ETCD").unwrap_or_else(|_| "etcd".into()))
            .args(["--name", "n0", "--data-dir"])
            .arg(dir.join("data"))
            .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
            ))
            .arg(format!("--initial-cluster=n0=http://127.0.0.1:{peer}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start etcd ({e}); apt-get install -y etcd-server"))?;
        let proc = Proc(child, dir);
        wait_for_port(client).await?;
        Ok((proc, format!("http://127.0.0.1:{client}")))
    }

    async fn start_zookeeper() -> Result<(Proc, String), BoxError> {
        let port = free_port()?;
        let dir = temp_dir("zk")?;
        std::fs::write(
            dir.join("zoo.cfg"),
            format!(
                "tickTime=200\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\nmaxSessionTimeout=60000\nforceSync=no\n",
                dir.join("data").display()
            ),
        )?;
        let classpath = std::env::var("DLOCK_ZOOKEEPER_CLASSPATH").unwrap_or_else(|_| {
            "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar".into()
        });
        let child = Command::new("java")
            .args(["-XX:+UseSerialGC", "-cp", &classpath])
            .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
            .arg(dir.join("zoo.cfg"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start ZooKeeper ({e}); apt-get install -y zookeeper"))?;
        let proc = Proc(child, dir);
        wait_for_port(port).await?;
        // The port opens before requests are served: wait for a real session.
        let started = Instant::now();
        let connect = format!("127.0.0.1:{port}");
        while zookeeper_client::Client::connect(&connect).await.is_err() {
            if started.elapsed() > Duration::from_secs(30) {
                return Err("ZooKeeper did not serve within 30 s".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok((proc, connect))
    }

    /// Sequential acquire + release of `rt` against `raw_pair` (the engine's own round trips),
    /// in interleaved rounds, and the hot-key handoff against the same baseline.
    async fn engine_rows(
        name: &str,
        rt: Runtime,
        raw_label: &str,
        mut raw_pair: impl AsyncFnMut() -> Result<(), BoxError>,
        redis_url: &str,
        scale: usize,
    ) -> Result<Vec<Row>, BoxError> {
        lock_pairs_sequential(&rt, 50).await?;
        let (mut base, mut ours) = (Vec::new(), Vec::new());
        for _ in 0..4 * scale {
            for _ in 0..50 {
                let t = Instant::now();
                raw_pair().await?;
                base.push(t.elapsed());
            }
            ours.extend(lock_pairs_sequential(&rt, 50).await?);
        }
        base.sort();
        ours.sort();
        let (b50, o50) = (percentile(&base, 0.5), percentile(&ours, 0.5));
        let baseline = format!("{} ({raw_label})", us(b50));
        let mut rows = vec![row(
            &format!("{name}: sequential acquire+release, p50"),
            us(o50),
            baseline.clone(),
            format!("{:.2}x", o50.as_secs_f64() / b50.as_secs_f64()),
            "",
        )];
        let hot = hot_key(rt, redis_url, 16, 100 * scale as u64).await?;
        let h50 = percentile(&hot.handoff, 0.5);
        rows.push(row(
            &format!("{name}: hot key handoff, p50 (16 tasks)"),
            us(h50),
            baseline,
            format!(
                "{:.2}x{}",
                h50.as_secs_f64() / b50.as_secs_f64(),
                if hot.exact { "" } else { "; COUNTER WRONG" }
            ),
            "",
        ));
        Ok(rows)
    }

    pub(super) async fn rows(redis_url: &str, scale: usize) -> Result<Vec<Row>, BoxError> {
        let (_etcd, endpoint) = start_etcd().await?;
        let etcd_rt = Runtime::builder().etcd([endpoint.as_str()]).build().await?;
        let mut etcd = etcd_client::Client::connect([endpoint.as_str()], None).await?;
        let mut rows = engine_rows(
            "etcd",
            etcd_rt,
            "raw put + delete",
            async || {
                etcd.put("bench-raw", "x", None).await?;
                etcd.delete("bench-raw", None).await?;
                Ok(())
            },
            redis_url,
            scale,
        )
        .await?;

        let (_zk, connect) = start_zookeeper().await?;
        let zk_rt = Runtime::builder()
            .zookeeper(connect.as_str())
            .build()
            .await?;
        let zk = zookeeper_client::Client::connect(&connect).await?;
        let persistent = zookeeper_client::CreateMode::Persistent
            .with_acls(zookeeper_client::Acls::anyone_all());
        rows.extend(
            engine_rows(
                "ZooKeeper",
                zk_rt,
                "raw create + delete",
                async || {
                    zk.create("/bench-raw", b"x", &persistent).await?;
                    zk.delete("/bench-raw", None).await?;
                    Ok(())
                },
                redis_url,
                scale,
            )
            .await?,
        );
        Ok(rows)
    }
}

/// A three-master Redis Cluster (no replicas) of our own.
async fn start_cluster() -> Result<Vec<Server>, BoxError> {
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(Server::start_with(&[
            "--cluster-enabled",
            "yes",
            "--cluster-node-timeout",
            "2000",
        ])?);
    }
    let addrs: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let status = Command::new("redis-cli")
        .arg("--cluster")
        .arg("create")
        .args(&addrs)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if !status.success() {
        return Err("redis-cli --cluster create failed".into());
    }
    let started = Instant::now();
    loop {
        let mut ok = true;
        for n in &nodes {
            let mut conn = raw_conn(&n.url()).await?;
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async(&mut conn)
                .await?;
            ok &= info.contains("cluster_state:ok");
        }
        if ok {
            return Ok(nodes);
        }
        if started.elapsed() > Duration::from_secs(20) {
            return Err("cluster did not reach cluster_state:ok within 20 s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Redlock (3 and 5 nodes) and Cluster rows: sequential latency against standalone in
/// interleaved rounds, and hot-key handoff against standalone.
async fn multi_node(url: &str, standalone: &Runtime, scale: usize) -> Result<Vec<Row>, BoxError> {
    let mut rows = Vec::new();
    let three: Vec<Server> = (0..3).map(|_| Server::start()).collect::<Result<_, _>>()?;
    let five: Vec<Server> = (0..5).map(|_| Server::start()).collect::<Result<_, _>>()?;
    let cluster = start_cluster().await?;
    let urls = |servers: &[Server]| servers.iter().map(Server::url).collect::<Vec<_>>();
    let engines = [
        (
            "Redlock, 3 nodes",
            Runtime::builder().redlock(urls(&three)).build().await?,
            "<= 1.3x",
        ),
        (
            "Redlock, 5 nodes",
            Runtime::builder().redlock(urls(&five)).build().await?,
            "",
        ),
        (
            "Cluster, 3 masters",
            Runtime::builder()
                .redis_cluster(urls(&cluster))
                .build()
                .await?,
            "",
        ),
    ];
    // The floor of a fan-out on this machine: one trivial EVALSHA sent to N servers at once,
    // against the same call to one server.
    for servers in [&three, &five] {
        let mut conns = Vec::new();
        for server in servers.iter() {
            conns.push(raw_conn(&server.url()).await?);
        }
        let script = redis::Script::new("return 1");
        let (mut one, mut all) = (Vec::new(), Vec::new());
        for _ in 0..1000 * scale {
            let t = Instant::now();
            let _: i64 = script.key("k").invoke_async(&mut conns[0].clone()).await?;
            one.push(t.elapsed());
            let t = Instant::now();
            let answers = futures_util::future::join_all(conns.iter().map(|c| {
                let mut c = c.clone();
                let script = &script;
                async move { script.key("k").invoke_async::<i64>(&mut c).await }
            }))
            .await;
            all.push(t.elapsed());
            for answer in answers {
                answer?;
            }
        }
        one.sort();
        all.sort();
        let (o50, a50) = (percentile(&one, 0.5), percentile(&all, 0.5));
        rows.push(row(
            &format!(
                "fan-out floor: 1 raw EVALSHA to {} servers at once, p50",
                servers.len()
            ),
            us(a50),
            format!("{} (to 1 server)", us(o50)),
            format!("{:.2}x", a50.as_secs_f64() / o50.as_secs_f64()),
            "",
        ));
    }
    for (name, rt, target) in &engines {
        lock_pairs_sequential(rt, 200).await?;
        let (mut base, mut ours) = (Vec::new(), Vec::new());
        for _ in 0..5 * scale {
            base.extend(lock_pairs_sequential(standalone, 100).await?);
            ours.extend(lock_pairs_sequential(rt, 100).await?);
        }
        base.sort();
        ours.sort();
        let (b50, o50) = (percentile(&base, 0.5), percentile(&ours, 0.5));
        rows.push(row(
            &format!("{name}: sequential acquire+release, p50"),
            us(o50),
            format!("{} (standalone Redis)", us(b50)),
            format!("{:.2}x", o50.as_secs_f64() / b50.as_secs_f64()),
            target,
        ));
    }
    let standalone_hot = Runtime::builder()
        .redis(url)
        .key_prefix("hot1:")
        .build()
        .await?;
    let base = hot_key(standalone_hot, url, 64, 500 * scale as u64).await?;
    let b50 = percentile(&base.handoff, 0.5);
    for (name, rt, _) in engines {
        let hot = hot_key(rt, url, 64, 500 * scale as u64).await?;
        let h50 = percentile(&hot.handoff, 0.5);
        rows.push(row(
            &format!("{name}: hot key handoff, p50 (64 tasks)"),
            us(h50),
            format!("{} (standalone Redis, 64 tasks)", us(b50)),
            format!(
                "{:.2}x{}",
                h50.as_secs_f64() / b50.as_secs_f64(),
                if hot.exact { "" } else { "; COUNTER WRONG" }
            ),
            "",
        ));
    }
    Ok(rows)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    // `--only seq,par,hot,many,macro` runs just those sections.
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1).cloned());
    let want = |section: &str| {
        only.as_ref()
            .is_none_or(|o| o.split(',').any(|s| s == section))
    };
    let scale = if quick { 1 } else { 4 };
    let server = Server::start()?;
    let url = server.url();
    let rt = Runtime::builder().redis(&url).build().await?;
    let mut rows = Vec::new();

    // Warm up connections, scripts and the allocator.
    lock_pairs_sequential(&rt, 500).await?;
    raw_pairs_sequential(&url, 500).await?;

    if want("seq") {
        // Interleaved rounds of 100 pairs each, so that drift on this shared machine hits
        // both series alike.
        let (mut floor, mut ours) = (Vec::new(), Vec::new());
        for _ in 0..10 * scale {
            floor.extend(raw_pairs_sequential(&url, 100).await?);
            ours.extend(lock_pairs_sequential(&rt, 100).await?);
        }
        floor.sort();
        ours.sort();
        let (f50, o50) = (percentile(&floor, 0.5), percentile(&ours, 0.5));
        rows.push(row(
            "sequential acquire+release, p50",
            us(o50),
            format!("{} (2 raw EVALSHA)", us(f50)),
            format!("{:.2}x", o50.as_secs_f64() / f50.as_secs_f64()),
            "<= 1.15x",
        ));
        let (f99, o99) = (percentile(&floor, 0.99), percentile(&ours, 0.99));
        rows.push(row(
            "sequential acquire+release, p99",
            us(o99),
            format!("{} (2 raw EVALSHA)", us(f99)),
            format!("{:.2}x", o99.as_secs_f64() / f99.as_secs_f64()),
            "",
        ));
    }
    if want("par") {
        let per_task = 250 * scale;
        let raw = raw_pairs_parallel(&url, 64, per_task).await?;
        let par = lock_pairs_parallel(&rt, 64, per_task).await?;
        rows.push(row(
            "64 tasks, distinct keys",
            format!("{par:.0} pairs/s"),
            format!("{raw:.0} pairs/s (same 2 scripts, raw)"),
            format!("{:.2}x", par / raw),
            ">= 0.8x",
        ));
    }
    if want("hot") {
        // The round-trip baseline is sampled right before and right after the hot-key run.
        let mut rtt = raw_round_trips(&url, 1000).await?;
        let hot_rt = Runtime::builder()
            .redis(&url)
            .key_prefix("hot:")
            .build()
            .await?;
        let hot = hot_key(hot_rt, &url, 256, 1500 * scale as u64).await?;
        rtt.extend(raw_round_trips(&url, 1000).await?);
        rtt.sort();
        let rtt50 = percentile(&rtt, 0.5);
        rows.push(row(
            "hot key, 256 tasks, GET+SET inside",
            format!("{:.0} sales/s", hot.sales_per_sec),
            "".into(),
            if hot.exact {
                format!("counter exact ({} sales)", hot.sales)
            } else {
                "COUNTER WRONG".into()
            },
            "counter exact",
        ));
        let h50 = percentile(&hot.handoff, 0.5);
        rows.push(row(
            "hot key handoff (release sent -> next holder), p50",
            us(h50),
            format!("{} (1 raw PING round trip)", us(rtt50)),
            format!("{:.2} round trips", h50.as_secs_f64() / rtt50.as_secs_f64()),
            "<= 3 round trips",
        ));
        let h99 = percentile(&hot.handoff, 0.99);
        rows.push(row(
            "hot key handoff, p99",
            us(h99),
            format!("{} (raw PING p99)", us(percentile(&rtt, 0.99))),
            format!("{:.2} round trips", h99.as_secs_f64() / rtt50.as_secs_f64()),
            "",
        ));
        rows.push(row(
            "hot key, Redis commands per sale",
            format!("{:.2} sent by clients", hot.client_cmds_per_sale),
            "4 = acquire + GET + SET + release".into(),
            format!("{:.2} incl. those inside scripts", hot.all_cmds_per_sale),
            "<= 8 sent",
        ));
    }
    if want("many") {
        let count = if quick { 2_000 } else { 10_000 };
        let hold = Duration::from_secs(if quick { 4 } else { 10 });
        let many = many_held(&url, count, hold).await?;
        rows.push(row(
            &format!("{} locks held, 3 s lease, {} s", many.held, hold.as_secs()),
            format!("{:.1} renewal calls/s", many.renew_calls_per_sec),
            format!("{} held locks", many.held),
            format!(
                "1/{:.0} of held{}",
                many.held as f64 / many.renew_calls_per_sec.max(f64::MIN_POSITIVE),
                if many.all_alive { "" } else { "; SOME LOST" }
            ),
            "<= 1/50 of held",
        ));
        rows.push(row(
            "memory per held lock",
            format!("{:.0} bytes", many.bytes_per_lock),
            "".into(),
            "".into(),
            "",
        ));
    }
    if want("macro") {
        for (engine, url, per_round) in [
            ("memory", "memory://".to_owned(), 2_000 * scale as u64),
            ("redis", url.clone(), 100 * scale as u64),
        ] {
            let (annotated, hand, ratio) =
                tokio::task::spawn_blocking(move || macro_cost(&url, 40, per_round)).await??;
            rows.push(row(
                &format!("#[distributed_lock] call ({engine} backend)"),
                format!("{annotated:.0} ns (best round)"),
                format!("{hand:.0} ns (lock().acquire() + body + release() by hand, best round)"),
                format!(
                    "{:+.1}% (median of 40 interleaved rounds)",
                    (ratio - 1.0) * 100.0
                ),
                "<= +2%",
            ));
        }
    }

    if want("multi") {
        rows.extend(multi_node(&url, &rt, scale).await?);
    }
    if want("cp") {
        #[cfg(feature = "cp-engines")]
        rows.extend(cp::rows(&url, scale).await?);
        #[cfg(not(feature = "cp-engines"))]
        eprintln!("etcd and ZooKeeper rows: run with --features cp-engines");
    }

    println!("| measure | dlock | baseline (same run) | ratio | target |");
    println!("|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} |",
            r.what, r.figure, r.baseline, r.ratio, r.target
        );
    }
    drop(server);
    Ok(())
}
