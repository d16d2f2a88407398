//! The table: one row per measure, its figure next to the baseline measured in the same run.

use std::time::Duration;

use crate::stats::{ratio, times, us};

/// One line of the table.
pub(crate) struct Row {
    what: String,
    figure: String,
    baseline: String,
    ratio: String,
    target: String,
}

impl Row {
    pub(crate) fn new(
        what: impl Into<String>,
        figure: impl Into<String>,
        baseline: impl Into<String>,
        ratio: impl Into<String>,
        target: &str,
    ) -> Row {
        Row {
            what: what.into(),
            figure: figure.into(),
            baseline: baseline.into(),
            ratio: ratio.into(),
            target: target.into(),
        }
    }

    /// A latency against a baseline latency: `ours`, `base (label)`, `ours/base` as `1.23x`.
    pub(crate) fn versus(
        what: impl Into<String>,
        ours: Duration,
        base: Duration,
        label: &str,
        target: &str,
    ) -> Row {
        let baseline = format!("{} ({label})", us(base));
        Row::new(what, us(ours), baseline, times(ratio(ours, base)), target)
    }

    /// Appends `; COUNTER WRONG` to the ratio unless the protected counter came out exact.
    pub(crate) fn counter_checked(mut self, exact: bool) -> Row {
        if !exact {
            self.ratio.push_str("; COUNTER WRONG");
        }
        self
    }
}

/// Prints `rows` as one Markdown table on stdout.
pub(crate) fn print(rows: &[Row]) {
    println!("| measure | dlock | baseline (same run) | ratio | target |");
    println!("|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} |",
            r.what, r.figure, r.baseline, r.ratio, r.target
        );
    }
}
