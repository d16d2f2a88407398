//! The torture program end to end on the in-process memory engine (its store is a real
//! redis-server): a run with the lock passes, and the same run without the lock must fail, so
//! the checker demonstrably catches overlapping holders and lost updates.

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
