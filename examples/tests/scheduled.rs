//! The scheduled-job example as three processes on one real redis-server: over several periods,
//! the job runs exactly once in each (`hold_at_least` makes the nodes whose clocks are late
//! skip), and every node fires every period.

// In a test a panic is how a check fails.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use dlock_testkit::RedisServer;

const NODES: u32 = 3;
const PERIODS: u64 = 4;

#[test]
fn three_nodes_run_the_job_once_per_period() {
    let server = RedisServer::start();
    let children: Vec<_> = (0..NODES)
        .map(|node| {
            Command::new(env!("CARGO_BIN_EXE_scheduled"))
                .args([
                    "--node",
                    &node.to_string(),
                    "--periods",
                    &PERIODS.to_string(),
                ])
                .env("DLOCK_URL", server.url())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start the scheduled example")
        })
        .collect();
    // period -> (runs, skips)
    let mut periods: BTreeMap<u64, (Vec<u32>, Vec<u32>)> = BTreeMap::new();
    for child in children {
        let out = child.wait_with_output().expect("the example's output");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "a node failed: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        for line in stdout.lines() {
            println!("{line}");
            let (period, rest) = line
                .strip_prefix("period ")
                .and_then(|l| l.split_once(": "))
                .unwrap_or_else(|| panic!("unexpected line {line:?}"));
            let period: u64 = period.parse().expect("a period number");
            let entry = periods.entry(period).or_default();
            if let Some(node) = rest.strip_prefix("ran on node ") {
                entry.0.push(node.parse().expect("a node"));
            } else if let Some(node) = rest.strip_prefix("skipped on node ") {
                entry.1.push(node.parse().expect("a node"));
            } else {
                panic!("unexpected line {line:?}");
            }
        }
    }
    // The nodes started within a moment of each other: they cover the same periods, or one
    // more at either end when a period boundary fell between their starts.
    let fired: usize = periods.values().map(|(r, s)| r.len() + s.len()).sum();
    assert_eq!(fired, (NODES as usize) * (PERIODS as usize), "{periods:?}");
    assert!(periods.len() as u64 >= PERIODS, "{periods:?}");
    for (period, (runs, skips)) in &periods {
        assert_eq!(
            runs.len(),
            1,
            "period {period}: the job ran on nodes {runs:?} (skipped on {skips:?})"
        );
    }
}
