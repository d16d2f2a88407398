//! Section `peer`: dlock against rslock 0.10, the most used Rust Redis lock, in the same run on
//! the same server, each with its own multiplexed connection and a 10 s lease:
//! - sequential acquire + release, both against two raw `EVALSHA` round trips;
//! - Redis commands per uncontended acquire + release, those inside scripts included;
//! - 64 tasks on distinct keys;
//! - a hot key, 256 tasks in this process, critical section `GET` + `SET` of a counter on one
//!   shared connection: sales/s, tasks that never sold, longest wait;
//! - the same hot key from 4 worker processes of 64 tasks: sales/s, each process's share.
//!
//! A contended workload is short and its rate moves with whatever else the machine does, so
//! each (distinct keys, both hot keys) runs in [`ROUNDS`] rounds, the two contenders one after
//! the other in alternating order; the row gives the median of the rounds' ratios, and the
//! worst round of the service figures.
//!
//! Layout: [`contender`] puts both libraries behind one face ([`rslock`] is rslock's side),
//! [`contest`] is the hot-key tasks of one process, [`referee`] starts and ends a hot-key run
//! and reads its counters, [`worker`] runs the contest in separate processes.

mod contender;
mod contest;
mod referee;
mod rslock;
pub(crate) mod worker;

use std::time::{Duration, Instant};

use super::alternate;
use crate::report::Row;
use crate::stats::{median, p50, ratio, sorted, times, us};
use crate::{BoxError, Setup, baselines};
use crate::{commandstats, cpu};
use contender::{Contender, Kind};
use referee::{Outcome, Referee};

/// Where dlock's keys of this section live.
const PREFIX: &str = "peer:";

/// Section `peer`.
pub(crate) async fn rows(setup: &Setup) -> Result<Vec<Row>, BoxError> {
    let (url, scale) = (setup.url.as_str(), setup.options.scale());
    let dlock = Contender::connect(Kind::Dlock, url, PREFIX).await?;
    let rslock = Contender::connect(Kind::Rslock, url, PREFIX).await?;
    for contender in [&dlock, &rslock] {
        pairs(contender, "warm", 500).await?;
    }
    let both = [dlock, rslock];
    let mut rows = vec![
        sequential_row(url, &both, 10 * scale).await?,
        commands_row(url, &both, 250 * scale).await?,
    ];
    let rounds = rounds(setup);
    // 800 pairs a task a round at full scale (about half a second): a shorter round moved
    // with task start-up and with whatever else the machine did (rounds of 200 ranged from
    // 0.74x to 1.75x in one run).
    let distinct = (64, 1000 * scale, rounds);
    rows.extend(distinct_keys_row(&both, setup.server_pid, distinct).await?);
    let target = 3000 * scale as u64;
    let mut in_process = Vec::new();
    for round in 0..rounds {
        let mut outcomes = Vec::new();
        for i in alternate(round) {
            outcomes.push((i, hot_key_in_process(&both[i], url, 256, target).await?));
        }
        in_process.push(in_order(outcomes)?);
    }
    rows.extend(hot_key_rows(
        "hot key, 256 tasks in one process",
        &in_process,
    )?);
    let mut in_processes = Vec::new();
    for round in 0..rounds {
        let mut outcomes = Vec::new();
        for i in alternate(round) {
            let kind = Kind::BOTH[i];
            let outcome = worker::hot_key_in_processes(kind, url, (4, 64), target).await?;
            outcomes.push((i, outcome));
        }
        in_processes.push(in_order(outcomes)?);
    }
    rows.extend(hot_key_rows(
        "hot key, 4 processes x 64 tasks",
        &in_processes,
    )?);
    Ok(rows)
}

/// Rounds of each contended workload at full scale (one with `--quick`).
const ROUNDS: usize = 5;

fn rounds(setup: &Setup) -> usize {
    if setup.options.quick { 1 } else { ROUNDS }
}

/// The outcomes of one round, dlock's first.
fn in_order(mut outcomes: Vec<(usize, Outcome)>) -> Result<[Outcome; 2], BoxError> {
    outcomes.sort_by_key(|(i, _)| *i);
    let [(_, dlock), (_, rslock)]: [(usize, Outcome); 2] = outcomes
        .try_into()
        .map_err(|_| "one outcome per contender")?;
    Ok([dlock, rslock])
}

/// `n` acquire + release pairs of `key`, after `n / 10` unmeasured.
async fn pairs(contender: &Contender, key: &str, n: usize) -> Result<Vec<Duration>, BoxError> {
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let t = Instant::now();
        contender.pair(key).await?;
        if i >= n / 10 {
            lat.push(t.elapsed());
        }
    }
    Ok(lat)
}

/// Sequential p50 of both against two raw `EVALSHA`, in `rounds` interleaved rounds of 100.
async fn sequential_row(url: &str, both: &[Contender; 2], rounds: usize) -> Result<Row, BoxError> {
    let (mut floor, mut lat) = (Vec::new(), [Vec::new(), Vec::new()]);
    for _ in 0..rounds {
        floor.extend(baselines::evalsha_pairs(url, 100).await?);
        for (contender, lat) in both.iter().zip(&mut lat) {
            lat.extend(pairs(contender, "seq", 100).await?);
        }
    }
    let floor = p50(&sorted(floor));
    let [d, r] = lat.map(|l| p50(&sorted(l)));
    let (dx, rx) = (times(ratio(d, floor)), times(ratio(r, floor)));
    Ok(Row::new(
        "peer: sequential acquire+release p50, vs 2 raw EVALSHA",
        format!("{} = {dx}", us(d)),
        format!("rslock {} = {rx}; 2 raw EVALSHA {}", us(r), us(floor)),
        format!("dlock {dx}, rslock {rx} raw"),
        "<= 1.1x 2 raw EVALSHA",
    ))
}

/// Commands Redis ran per uncontended acquire + release (`INFO commandstats`, scripts'
/// commands included), over `n` pairs of each.
async fn commands_row(url: &str, both: &[Contender; 2], n: usize) -> Result<Row, BoxError> {
    let mut stats = baselines::raw_conn(url).await?;
    let mut per_pair = [0.0; 2];
    for (contender, per_pair) in both.iter().zip(&mut per_pair) {
        let before = commandstats::read(&mut stats).await?;
        pairs(contender, "cmds", n).await?;
        let after = commandstats::read(&mut stats).await?;
        *per_pair = commandstats::delta_all(&before, &after) as f64 / (n + n / 10) as f64;
    }
    let [d, r] = per_pair;
    Ok(Row::new(
        "peer: Redis commands per uncontended acquire+release, scripts included",
        format!("{d:.2}"),
        format!("rslock {r:.2}"),
        format!("{:.2}x rslock", d / r),
        "<= 6",
    ))
}

/// `tasks` tasks on a key each, `per_task` pairs each: both contenders in `rounds` rounds of
/// an equal share of the pairs, one after the other in alternating order, so drift hits both
/// alike; the row gives the median of the rounds' ratios.
async fn distinct_keys_row(
    both: &[Contender; 2],
    server_pid: u32,
    (tasks, per_task, rounds): (usize, usize, usize),
) -> Result<Vec<Row>, BoxError> {
    let per_round = (per_task / rounds).max(1);
    // Pairs per second of each round, per contender.
    let mut rates = [Vec::new(), Vec::new()];
    // CPU time of this process and of the server, for each contender.
    let mut client_cpu = [Duration::ZERO; 2];
    let mut server_cpu = [Duration::ZERO; 2];
    for round in 0..rounds {
        for i in alternate(round) {
            let contender = &both[i];
            let (client0, server0) = (cpu::used(None)?, cpu::used(Some(server_pid))?);
            let rate = super::pairs_per_second(tasks, per_round, |k| {
                let contender = contender.clone();
                async move {
                    let key = format!("par:{k}");
                    for _ in 0..per_round {
                        contender.pair(&key).await?;
                    }
                    Ok::<_, BoxError>(())
                }
            })
            .await?;
            rates[i].push(rate);
            client_cpu[i] += cpu::used(None)?.saturating_sub(client0);
            server_cpu[i] += cpu::used(Some(server_pid))?.saturating_sub(server0);
        }
    }
    let n = (tasks * per_round * rounds) as f64;
    let ratios: Vec<f64> = rates[0].iter().zip(&rates[1]).map(|(d, r)| d / r).collect();
    let listed: Vec<String> = ratios.iter().map(|&x| times(x)).collect();
    let [d, r] = rates.map(median);
    let per_pair = |cpu: Duration| cpu.as_secs_f64() * 1e6 / n;
    let cpu = |i: usize| {
        format!(
            "client {:.1} us + server {:.1} us CPU a pair",
            per_pair(client_cpu[i]),
            per_pair(server_cpu[i])
        )
    };
    Ok(vec![
        Row::new(
            format!("peer: {tasks} tasks, distinct keys"),
            format!("{d:.0} pairs/s (median of {rounds} rounds)"),
            format!("rslock {r:.0} pairs/s"),
            format!(
                "{} rslock (rounds {})",
                times(median(ratios)),
                listed.join(", ")
            ),
            ">= 1.0x rslock",
        ),
        Row::new(
            format!("peer: {tasks} tasks, distinct keys: CPU time a pair"),
            cpu(0),
            format!("rslock {}", cpu(1)),
            format!(
                "client {:.2}x, server {:.2}x rslock",
                per_pair(client_cpu[0]) / per_pair(client_cpu[1]),
                per_pair(server_cpu[0]) / per_pair(server_cpu[1])
            ),
            "",
        ),
    ])
}

/// `tasks` tasks of this process contending with `contender` until `target` sales.
async fn hot_key_in_process(
    contender: &Contender,
    url: &str,
    tasks: usize,
    target: u64,
) -> Result<Outcome, BoxError> {
    let names = contest::Names::new(&format!("hot-{}", contender.kind().name()));
    let mut referee = Referee::new(url, &names).await?;
    referee.start().await?;
    let (tally, elapsed) = tokio::try_join!(
        contest::contest(contender, url, &names, tasks, target),
        referee.target_sold()
    )?;
    referee.outcome(elapsed, vec![tally]).await
}

/// The rows of one hot-key workload over its rounds, dlock's outcome first in each: the
/// median of the rounds' rates and ratios (each round's ratio listed), and the worst round's
/// service figures. A dlock counter that is not exact is an error; rslock's lost updates are
/// reported.
fn hot_key_rows(what: &str, rounds: &[[Outcome; 2]]) -> Result<Vec<Row>, BoxError> {
    for [dlock, _] in rounds {
        let d = dlock.total();
        if dlock.counter != d.sales {
            return Err(format!(
                "dlock, {what}: counter {} after {} sales: holders overlapped",
                dlock.counter, d.sales
            )
            .into());
        }
    }
    let rate = |i: usize| median(rounds.iter().map(|r| r[i].sales_per_sec()).collect());
    let ratios: Vec<f64> = rounds
        .iter()
        .map(|[d, r]| d.sales_per_sec() / r.sales_per_sec())
        .collect();
    let listed: Vec<String> = ratios.iter().map(|&x| times(x)).collect();
    let lost: u64 = rounds.iter().map(|[_, r]| r.lost_updates()).sum();
    let lost = match lost {
        0 => String::new(),
        n => format!(", {n} LOST UPDATES"),
    };
    let sales: u64 = rounds.iter().map(|[d, _]| d.total().sales).sum();
    let mut rows = vec![Row::new(
        format!("peer: {what}, sales/s"),
        format!(
            "{:.0} sales/s (median of {} rounds; counter exact, {sales} sales)",
            rate(0),
            rounds.len()
        ),
        format!("rslock {:.0} sales/s{lost}", rate(1)),
        format!("{} (rounds {})", times(median(ratios)), listed.join(", ")),
        ">= 1.5x rslock",
    )];
    // The worst round of each contender: most tasks never served, longest wait.
    let worst = |i: usize| {
        let unserved = rounds.iter().map(|r| r[i].total().unserved).max();
        let wait = rounds.iter().map(|r| r[i].total().longest_wait).max();
        let tasks = rounds.first().map(|r| r[i].total().tasks);
        (
            unserved.unwrap_or(0),
            tasks.unwrap_or(0),
            wait.unwrap_or_default(),
        )
    };
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1e3);
    let gave_up: u64 = rounds.iter().map(|[_, r]| r.total().gave_up).sum();
    let failed: u64 = rounds.iter().map(|[_, r]| r.failed_tries()).sum();
    let gave_up = format!(
        "; retry {}: {gave_up} lock() calls out of retries, {failed} failed tries",
        rslock::retry_label()?,
    );
    let ((du, dt, dw), (ru, rt, rw)) = (worst(0), worst(1));
    rows.push(Row::new(
        format!("peer: {what}: tasks that never sold / longest wait (worst round)"),
        format!("{du} of {dt} / {}", ms(dw)),
        format!("rslock {ru} of {rt} / {}{gave_up}", ms(rw)),
        "",
        "0 / <= rslock's",
    ));
    if rounds.iter().any(|[d, _]| d.per_process.len() > 1) {
        let shares = |i: usize| {
            let each: Vec<String> = rounds
                .iter()
                .map(|r| format!("{:.0}%", 100.0 * r[i].largest_share()))
                .collect();
            let most = rounds
                .iter()
                .map(|r| r[i].largest_share())
                .fold(0.0, f64::max);
            format!("{:.0}% (rounds {})", 100.0 * most, each.join(", "))
        };
        rows.push(Row::new(
            format!("peer: {what}: largest share of sales one process took (worst round)"),
            shares(0),
            format!("rslock {}", shares(1)),
            "",
            "<= 40%",
        ));
    }
    Ok(rows)
}
