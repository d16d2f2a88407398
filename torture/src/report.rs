//! One table row per engine, the verdict, and notes under the table.

use std::fmt::Write as _;
use std::time::Duration;

use crate::check::Findings;
use crate::cli::{Engine, Fault};
use crate::faults::Injected;
use crate::pool::Failure;
use crate::worker::Tally;

/// Everything one engine's run produced.
#[derive(Debug)]
pub(crate) struct Row {
    pub(crate) engine: Engine,
    pub(crate) faults: Vec<Fault>,
    /// `None` where process faults do not apply (memory).
    pub(crate) injected: Option<Injected>,
    pub(crate) tally: Tally,
    pub(crate) findings: Findings,
    /// Keys not acquirable at once after everyone stopped, and how long each took to free.
    pub(crate) keys_left: Vec<(String, Option<Duration>)>,
    pub(crate) failures: Vec<Failure>,
    pub(crate) took: Duration,
}

/// Violations, and results the documentation predicts for this engine and these faults.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub(crate) violations: Vec<String>,
    pub(crate) expected: Vec<String>,
}

impl Row {
    fn has(&self, fault: Fault) -> bool {
        self.injected.is_some() && self.faults.contains(&fault)
    }

    /// Whether holders may overlap: a paused holder outlives its lease; a restart of an engine
    /// without persistence forgets the locks held (Redis, a Cluster master, a Redlock node).
    fn overlaps_expected(&self) -> bool {
        self.has(Fault::Pause)
            || (self.has(Fault::Restart)
                && matches!(
                    self.engine,
                    Engine::Redis | Engine::Cluster | Engine::Redlock
                ))
    }

    pub(crate) fn verdict(&self) -> Verdict {
        let f = &self.findings;
        let mut v = Verdict::default();
        let mut violation = |what: String| v.violations.push(what);
        for problem in &f.problems {
            violation(problem.clone());
        }
        for failure in &self.failures {
            violation(format!("worker {}: {}", failure.id, failure.what));
        }
        for (key, freed) in &self.keys_left {
            violation(match freed {
                Some(after) => {
                    format!("{key} was still locked after everyone stopped (free {after:?} later)")
                }
                None => format!("{key} was still locked after everyone stopped, and 30 s later"),
            });
        }
        if f.stale_accepted > 0 {
            violation(format!(
                "{} writes accepted with a fence lower than an earlier accepted one",
                f.stale_accepted
            ));
        }
        if self.engine.has_fences() && f.duplicate_fences > 0 {
            violation(format!(
                "{} fences given to more than one holder of a key",
                f.duplicate_fences
            ));
        }
        let harmful = f.unprotected > 0 || f.lost_updates > 0;
        let redlock_expected = self.engine == Engine::Redlock && self.overlaps_expected();
        if harmful && !redlock_expected {
            violation(format!(
                "{} unprotected overlapping holders, {} lost updates",
                f.unprotected, f.lost_updates
            ));
        }
        if f.overlaps > 0 && !self.overlaps_expected() {
            violation(format!(
                "{} overlapping holders without a fault that outlives a lease",
                f.overlaps
            ));
        }
        if f.overlaps > 0 && self.overlaps_expected() {
            if redlock_expected {
                v.expected.push(format!(
                    "Redlock has no fences: {} overlapping holders ({} unprotected) and {} lost updates, \
                     as documented for paused holders and restarted nodes",
                    f.overlaps, f.unprotected, f.lost_updates
                ));
            } else {
                v.expected.push(format!(
                    "{} overlapping holders, all fenced or in order: the store rejected every stale write",
                    f.overlaps
                ));
            }
        }
        v
    }

    fn faults_cell(&self) -> String {
        match self.injected {
            None => "n/a".into(),
            Some(i) => format!("{}/{}/{}", i.kills, i.pauses, i.restarts),
        }
    }
}

/// The Markdown table, then per engine its notes: violations, expected results, what the
/// runtime reported to the workers.
pub(crate) fn render(rows: &[Row]) -> String {
    let mut out = String::new();
    out.push_str(
        "| engine | kill/pause/restart | sections | writes accepted | overlapping holders | fenced | in order | unprotected | stale fences accepted | lost updates | keys left | result |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        let f = &row.findings;
        let verdict = row.verdict();
        let result = if !verdict.violations.is_empty() {
            "**FAIL**"
        } else if verdict.expected.is_empty() {
            "ok"
        } else if row.engine == Engine::Redlock {
            "ok (expected, no fences)"
        } else {
            "ok (fenced)"
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {result} |",
            row.engine,
            row.faults_cell(),
            f.sections,
            f.accepted,
            f.overlaps,
            f.fenced,
            f.in_order,
            f.unprotected,
            f.stale_accepted,
            f.lost_updates,
            row.keys_left.len(),
        );
    }
    out.push('\n');
    for row in rows {
        let verdict = row.verdict();
        let f = &row.findings;
        let t = &row.tally;
        let _ = writeln!(
            out,
            "- {} ({:.0?}): {} rejected claims or writes, {} writes that never learnt their answer \
             (not in the history); the workers still running at the end saw {} leases lost, {} \
             timeouts, {} lock errors, {} store errors",
            row.engine,
            row.took,
            f.rejected,
            f.unresolved,
            t.lost,
            t.timeouts,
            t.lock_errors,
            t.store_errors
        );
        for expected in &verdict.expected {
            let _ = writeln!(out, "  - expected: {expected}");
        }
        for violation in &verdict.violations {
            let _ = writeln!(out, "  - VIOLATION: {violation}");
        }
        for failure in &row.failures {
            if !failure.log_tail.is_empty() {
                let _ = writeln!(out, "  - worker {} log:\n{}", failure.id, failure.log_tail);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(engine: Engine, faults: &[Fault], findings: Findings) -> Row {
        Row {
            engine,
            faults: faults.to_vec(),
            injected: Some(Injected::default()),
            tally: Tally::default(),
            findings,
            keys_left: Vec::new(),
            failures: Vec::new(),
            took: Duration::from_secs(20),
        }
    }

    fn overlapping(unprotected: u64, lost_updates: u64) -> Findings {
        Findings {
            sections: 100,
            overlaps: 3,
            fenced: 3 - unprotected,
            unprotected,
            lost_updates,
            ..Findings::default()
        }
    }

    #[test]
    fn fenced_overlaps_are_expected_only_under_faults_that_outlive_a_lease() {
        let ok = row(Engine::Redis, &[Fault::Pause], overlapping(0, 0)).verdict();
        assert!(ok.violations.is_empty() && ok.expected.len() == 1, "{ok:?}");
        let ok = row(Engine::Redis, &[Fault::Restart], overlapping(0, 0)).verdict();
        assert!(ok.violations.is_empty(), "{ok:?}");
        for engine in [Engine::Etcd, Engine::ZooKeeper] {
            let bad = row(engine, &[Fault::Kill, Fault::Restart], overlapping(0, 0)).verdict();
            assert_eq!(bad.violations.len(), 1, "{engine}: {bad:?}");
        }
        let bad = row(Engine::Redis, &[Fault::Pause], overlapping(1, 1)).verdict();
        assert_eq!(bad.violations.len(), 1, "{bad:?}");
    }

    #[test]
    fn redlock_overlaps_are_expected_under_pauses_and_a_failure_without() {
        let ok = row(Engine::Redlock, &[Fault::Pause], overlapping(2, 2)).verdict();
        assert!(ok.violations.is_empty(), "{ok:?}");
        assert!(ok.expected[0].contains("no fences"), "{ok:?}");
        let bad = row(Engine::Redlock, &[Fault::Kill], overlapping(2, 2)).verdict();
        assert_eq!(bad.violations.len(), 2, "{bad:?}");
    }

    #[test]
    fn keys_left_and_duplicate_fences_are_violations() {
        let mut r = row(Engine::Etcd, &[], Findings::default());
        r.keys_left
            .push(("torture:0".into(), Some(Duration::from_secs(2))));
        assert_eq!(r.verdict().violations.len(), 1);
        let r = row(
            Engine::Redis,
            &[],
            Findings {
                duplicate_fences: 1,
                ..Findings::default()
            },
        );
        assert_eq!(r.verdict().violations.len(), 1);
        let r = row(
            Engine::Redlock,
            &[],
            Findings {
                duplicate_fences: 1,
                ..Findings::default()
            },
        );
        assert!(r.verdict().violations.is_empty());
        let table = render(&[r]);
        assert!(table.contains("| redlock | 0/0/0 | 0 |"), "{table}");
    }
}
