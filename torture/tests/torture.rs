//! The torture program end to end on the in-process memory engine (its store is a real
//! redis-server): a run with the lock passes, and the same run without the lock must fail, so
//! the checker demonstrably catches overlapping holders and lost updates. The semaphore and
//! read-write modes run on memory and on a real redis-server (worker processes, kill faults),
//! and a semaphore whose permits are not taken must fail.

// Test code: a panic is how a check fails.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::process::{Command, Output};

fn torture(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_torture"))
        .args(args)
        .output()
        .expect("run the torture binary")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

const SHORT_RUN: [&str; 10] = [
    "--engine",
    "memory",
    "--procs",
    "2",
    "--tasks",
    "3",
    "--seconds",
    "2",
    "--faults",
    "none",
];

#[test]
fn a_run_with_the_lock_passes_with_no_overlap_and_no_lost_update() {
    let output = torture(&SHORT_RUN);
    let text = text(&output);
    assert!(output.status.success(), "{text}");
    let row = text
        .lines()
        .find(|l| l.starts_with("| memory | n/a |"))
        .unwrap_or_else(|| panic!("no memory row in:\n{text}"));
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    // | engine | faults | sections | accepted | overlaps | fenced | in order | unprotected |
    // stale | lost | keys left | result |
    let sections: u64 = cells[3].parse().expect("a count of sections");
    assert!(sections > 0, "{row}");
    assert_eq!(cells[4], cells[3], "every section's write accepted: {row}");
    assert_eq!(&cells[5..12], ["0", "0", "0", "0", "0", "0", "0"], "{row}");
    assert_eq!(cells[12], "ok", "{row}");
}

#[test]
fn the_same_run_without_the_lock_fails_with_lost_updates() {
    let mut args = SHORT_RUN.to_vec();
    args.push("--no-lock");
    let output = torture(&args);
    let text = text(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains("**FAIL**"), "{text}");
    assert!(text.contains("VIOLATION"), "{text}");
    assert!(text.contains("lost updates"), "{text}");
}

#[test]
fn a_bad_argument_exits_with_2_and_the_usage() {
    let output = torture(&["--engine", "mongo"]);
    assert_eq!(output.status.code(), Some(2));
    let text = text(&output);
    assert!(text.contains("unknown engine `mongo`"), "{text}");
    assert!(text.contains("usage: torture"), "{text}");
}

/// Table rows of `engine` in a run's output, split into cells.
fn rows<'a>(text: &'a str, engine: &str) -> Vec<Vec<&'a str>> {
    text.lines()
        .filter(|l| l.starts_with(&format!("| {engine} |")))
        .map(|l| l.split('|').map(str::trim).collect())
        .collect()
}

fn shared_mode_run(mode: &[&str]) -> (Output, String) {
    let mut args = vec![
        "--engine",
        "memory,redis",
        "--procs",
        "2",
        "--tasks",
        "3",
        "--seconds",
        "3",
        "--faults",
        "kill",
    ];
    args.extend_from_slice(mode);
    let output = torture(&args);
    let text = text(&output);
    (output, text)
}

#[test]
fn semaphore_mode_passes_on_memory_and_redis_with_permits_shared_and_never_exceeded() {
    let (output, text) = shared_mode_run(&["--mode", "semaphore", "--permits", "3"]);
    assert!(output.status.success(), "{text}");
    for engine in ["memory", "redis"] {
        let row = rows(&text, engine)
            .pop()
            .unwrap_or_else(|| panic!("{engine}: {text}"));
        // | engine | permits | faults | sections | most at once | over | duplicates | keys left | result |
        assert_eq!(row[2], "3", "{row:?}");
        assert!(row[4].parse::<u64>().expect("sections") > 0, "{row:?}");
        let peak: u64 = row[5].parse().expect("most holders at once");
        assert!((2..=3).contains(&peak), "{row:?}");
        assert_eq!(&row[6..10], ["0", "0", "0", "ok"], "{row:?}");
    }
}

#[test]
fn rw_mode_passes_on_memory_and_redis_with_readers_overlapping_and_writers_alone() {
    let (output, text) = shared_mode_run(&["--mode", "rw"]);
    assert!(output.status.success(), "{text}");
    for engine in ["memory", "redis"] {
        let row = rows(&text, engine)
            .pop()
            .unwrap_or_else(|| panic!("{engine}: {text}"));
        // | engine | faults | sections | reads | writes accepted | readers overlapping |
        // writer overlaps | unprotected | stale | lost | keys left | result |
        let reads: u64 = row[4].parse().expect("reads");
        let writes: u64 = row[5].parse().expect("writes accepted");
        assert!(reads > writes && writes > 0, "about 80 % readers: {row:?}");
        assert!(
            row[6].parse::<u64>().expect("readers overlapping") > 0,
            "{row:?}"
        );
        assert_eq!(&row[7..13], ["0", "0", "0", "0", "0", "ok"], "{row:?}");
    }
}

#[test]
fn a_semaphore_whose_permits_are_not_taken_is_reported_over_its_permits() {
    let mut args = SHORT_RUN.to_vec();
    args.extend_from_slice(&["--mode", "semaphore", "--no-lock"]);
    let output = torture(&args);
    let text = text(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    let row = rows(&text, "memory")
        .pop()
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        row[6].parse::<u64>().expect("over the permits") > 0,
        "{row:?}"
    );
    assert_eq!(row[9], "**FAIL**", "{row:?}");
    assert!(text.contains("others held the key's permits"), "{text}");
}
