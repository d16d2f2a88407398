//! The baselines: raw Redis calls, without the lock runtime, measured in the same run as the
//! figures they stand next to. Latency series come back sorted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_runtime::testing::scripts;
use redis::aio::MultiplexedConnection;

use crate::BoxError;
use crate::stats::sorted;

/// A plain RESP3 connection to the server at `url`.
pub(crate) async fn raw_conn(url: &str) -> Result<MultiplexedConnection, BoxError> {
    let client = redis::Client::open(format!("{url}?protocol=resp3"))?;
    Ok(client.get_multiplexed_async_connection().await?)
}

/// Two raw `EVALSHA` round trips of a trivial script, `n` times after `n / 10` unmeasured:
/// the floor of acquire + release.
pub(crate) async fn evalsha_pairs(url: &str, n: usize) -> Result<Vec<Duration>, BoxError> {
    evalsha_round_trips(url, n, 2).await
}

/// `n` samples of `each` sequential `EVALSHA` round trips of a trivial script over a plain
/// multiplexed connection, after `n / 10` unmeasured.
async fn evalsha_round_trips(url: &str, n: usize, each: usize) -> Result<Vec<Duration>, BoxError> {
    let mut conn = raw_conn(url).await?;
    let script = redis::Script::new("return 1");
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let t = Instant::now();
        for _ in 0..each {
            let _: i64 = script.key("k").arg(1).invoke_async(&mut conn).await?;
        }
        if i >= n / 10 {
            lat.push(t.elapsed());
        }
    }
    Ok(sorted(lat))
}

/// One acquire + release of `key` by `owner` issued raw (no runtime), as the runtime sends
/// them: the first attempt's pipeline (`SET NX PX GET`, `INCRBY` of the fence counter, and
/// its `PEXPIRE` when `push`: the runtime leaves it out when it pushed it lately) and the
/// release script.
async fn raw_pair(
    conn: &mut redis::aio::MultiplexedConnection,
    release: &redis::Script,
    key: &str,
    owner: &str,
    push: bool,
) -> Result<(), BoxError> {
    let counter = format!("{key}:fence");
    let mut pipe = redis::pipe();
    pipe.cmd("SET")
        .arg(key)
        .arg(owner)
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .arg("GET")
        .cmd("INCRBY")
        .arg(&counter)
        .arg(scripts::FENCE_BLOCK);
    if push {
        pipe.cmd("PEXPIRE").arg(&counter).arg(630_000).ignore();
    }
    let (held, _fence): (Option<String>, i64) = pipe.query_async(conn).await?;
    if held.is_some() {
        return Err("raw acquire found the key taken".into());
    }
    let freed: i64 = release
        .key(key)
        .key(format!("{key}:turns"))
        .arg(owner)
        .arg("PUBLISH")
        .arg(50)
        .invoke_async(conn)
        .await?;
    if freed != 1 {
        return Err("raw release did not free the key".into());
    }
    Ok(())
}

/// The runtime's own acquire and release requests ([`raw_pair`]), issued raw by `tasks` tasks
/// on a key each, `per_task` pairs each. Pairs per second.
pub(crate) async fn script_pairs_parallel(
    url: &str,
    tasks: usize,
    per_task: usize,
) -> Result<f64, BoxError> {
    let conn = raw_conn(url).await?;
    let release = Arc::new(redis::Script::new(scripts::RELEASE));
    crate::workloads::pairs_per_second(tasks, per_task, |k| {
        let mut conn = conn.clone();
        let release = release.clone();
        async move {
            let owner = format!("{k:032x}");
            let key = format!("raw:{{par:{k}}}");
            for i in 0..per_task {
                raw_pair(&mut conn, &release, &key, &owner, i == 0).await?;
            }
            Ok::<(), BoxError>(())
        }
    })
    .await
}

/// `n` sequential acquire + release pairs of the runtime's own requests issued raw
/// ([`raw_pair`]) on one key, after `n / 10` unmeasured.
pub(crate) async fn raw_request_pairs(url: &str, n: usize) -> Result<Vec<Duration>, BoxError> {
    let mut conn = raw_conn(url).await?;
    let release = redis::Script::new(scripts::RELEASE);
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let t = Instant::now();
        let owner = "00000000000000000000000000000001";
        raw_pair(&mut conn, &release, "raw:{seq}", owner, i == 0).await?;
        if i >= n / 10 {
            lat.push(t.elapsed());
        }
    }
    Ok(sorted(lat))
}

/// `n` raw `PING` round trips.
pub(crate) async fn ping_round_trips(url: &str, n: usize) -> Result<Vec<Duration>, BoxError> {
    let mut conn = raw_conn(url).await?;
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        lat.push(t.elapsed());
    }
    Ok(sorted(lat))
}

/// The floor of a fan-out on this machine, `n` times: one trivial `EVALSHA` to the first of
/// `urls` alone, the same call to all of them at once, and the same again answered once a
/// majority of them did (the rest finishing on a task of their own, as a Redlock call leaves
/// them). Returns (to one, to all, to a majority).
pub(crate) async fn fan_out_floor(urls: &[String], n: usize) -> Result<FanOutFloor, BoxError> {
    let mut conns = Vec::new();
    for url in urls {
        conns.push(raw_conn(url).await?);
    }
    let script = redis::Script::new("return 1");
    let call = |c: &redis::aio::MultiplexedConnection| {
        let (mut c, script) = (c.clone(), script.clone());
        async move { script.key("k").invoke_async::<i64>(&mut c).await }
    };
    let majority = urls.len() / 2 + 1;
    let mut floor = FanOutFloor::default();
    for _ in 0..n {
        let t = Instant::now();
        call(&conns[0]).await?;
        floor.one.push(t.elapsed());
        let t = Instant::now();
        let answers = futures_util::future::join_all(conns.iter().map(call)).await;
        floor.all.push(t.elapsed());
        for answer in answers {
            answer?;
        }
        let t = Instant::now();
        let mut out: futures_util::stream::FuturesUnordered<_> = conns.iter().map(call).collect();
        for _ in 0..majority {
            if let Some(answer) = futures_util::StreamExt::next(&mut out).await {
                answer?;
            }
        }
        floor.majority.push(t.elapsed());
        tokio::spawn(
            async move { while futures_util::StreamExt::next(&mut out).await.is_some() {} },
        );
    }
    floor.one = sorted(floor.one);
    floor.all = sorted(floor.all);
    floor.majority = sorted(floor.majority);
    Ok(floor)
}

/// See [`fan_out_floor`].
#[derive(Default)]
pub(crate) struct FanOutFloor {
    pub(crate) one: Vec<Duration>,
    pub(crate) all: Vec<Duration>,
    pub(crate) majority: Vec<Duration>,
}

/// One `EVALSHA` of the trivial script written to a plain socket and its reply read by the
/// calling task itself, `n` times after `n / 10` unmeasured: a round trip below any client
/// library (no connection task, no request queue). The server at `url` must take plain
/// connections without a password.
pub(crate) async fn socket_evalsha(url: &str, n: usize) -> Result<Vec<Duration>, BoxError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let address = url
        .strip_prefix("redis://")
        .and_then(|rest| rest.split('/').next())
        .ok_or_else(|| format!("expected redis://host:port, got {url}"))?;
    let mut socket = tokio::net::TcpStream::connect(address).await?;
    socket.set_nodelay(true)?;
    let script = redis::Script::new("return 1");
    // Loaded the way the client does it, so that the call below runs the same cached script.
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return 1")
        .query_async(&mut raw_conn(url).await?)
        .await?;
    let call = redis::cmd("EVALSHA")
        .arg(script.get_hash())
        .arg(1)
        .arg("k")
        .arg(1)
        .get_packed_command();
    let mut reply = [0u8; 4];
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let t = Instant::now();
        socket.write_all(&call).await?;
        socket.read_exact(&mut reply).await?;
        if i >= n / 10 {
            lat.push(t.elapsed());
        }
        if &reply != b":1\r\n" {
            return Err(format!("unexpected reply {:?}", String::from_utf8_lossy(&reply)).into());
        }
    }
    Ok(sorted(lat))
}

/// `n` single `EVALSHA` round trips of the trivial script over a plain multiplexed
/// connection, after `n / 10` unmeasured (the client library's round trip, against
/// [`socket_evalsha`]).
pub(crate) async fn client_evalsha(url: &str, n: usize) -> Result<Vec<Duration>, BoxError> {
    evalsha_round_trips(url, n, 1).await
}
