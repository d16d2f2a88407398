//! Turns at a key busy in several runtimes (as several processes would be): the order in which
//! the runtimes held it, for the engines that serve processes in line (Redis, Redlock).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_runtime::Runtime;

use crate::{HoldExt, finish_within};

/// Tasks of each runtime, and acquisitions each task makes.
const TASKS: usize = 3;
const EACH: usize = 100;

/// Three tasks of each of `runtimes` acquire `key` 100 times each, holding it 1 ms; returns
/// the runtime (its index in `runtimes`) of each turn, a run of holds by one runtime, from the
/// start until the first runtime made all its acquisitions (from then on the others contend
/// without it).
pub async fn turns(runtimes: &[Runtime], key: &'static str) -> Vec<usize> {
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (tag, rt) in runtimes.iter().enumerate() {
        for _ in 0..TASKS {
            let (rt, order) = (rt.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..EACH {
                    let guard = rt
                        .hold_within(key, Duration::from_secs(10), Duration::from_secs(60))
                        .await;
                    order.lock().unwrap().push(tag);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    guard.release().await.expect("release");
                }
            }));
        }
    }
    finish_within(tasks, Duration::from_secs(60)).await;
    let order = order.lock().unwrap().clone();
    // Up to the first runtime's last acquisition.
    let end = (0..runtimes.len())
        .filter_map(|tag| order.iter().rposition(|t| *t == tag))
        .min()
        .unwrap_or(0);
    let mut turns = order[..=end].to_vec();
    turns.dedup();
    turns
}

/// How many times in `turns` (of `runtimes` runtimes all contending) a runtime held the key
/// again before each of the others held it once since its previous turn: windows of
/// `runtimes` consecutive turns, after the first, that repeat a runtime. Zero when the
/// runtimes take turns in the order they came.
pub fn out_of_order(turns: &[usize], runtimes: usize) -> usize {
    println!("turns while all contended: {turns:?}");
    assert!(
        turns.len() >= 2 * runtimes,
        "too few turns to judge: {turns:?}"
    );
    turns[1..]
        .windows(runtimes)
        .filter(|window| {
            let mut seen = window.to_vec();
            seen.sort_unstable();
            seen.dedup();
            seen.len() < runtimes
        })
        .count()
}
