//! One table row per engine, the verdict, and notes under the table.

use std::fmt::Write as _;
use std::time::Duration;

use crate::check::Findings;
use crate::cli::{Engine, Fault, Mode};
use crate::faults::Injected;
use crate::pool::Failure;
use crate::worker::Tally;

/// Everything one engine's run produced.
#[derive(Debug)]
pub(crate) struct Row {
    pub(crate) engine: Engine,
    /// What the sections held (one mode per run).
    pub(crate) mode: Mode,
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

/// Below this many sections (of readers, in `--mode rw`) a run proves nothing about sharing.
const SHARING_SHOWN_AFTER: u64 = 50;

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
            || self.fails_over()
    }

    /// Whether a Cluster master paused past the node timeout was failed over: its replica,
    /// promoted, may miss the last writes (a lock, the latest fence increments), so a second
    /// holder and a repeated fence are the documented result (README, "What fencing cannot
    /// give").
    fn fails_over(&self) -> bool {
        self.engine == Engine::Cluster && self.has(Fault::EnginePause)
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
        if self.engine.has_fences() && f.duplicate_fences > 0 && !self.fails_over() {
            violation(format!(
                "{} fences given to more than one holder of a key",
                f.duplicate_fences
            ));
        }
        if f.duplicate_fences > 0 && self.fails_over() {
            v.expected.push(format!(
                "{} fences given to more than one holder of a key after failovers of paused \
                 masters (the promoted replica missed the last increments); {} stale fences \
                 accepted, {} lost updates",
                f.duplicate_fences, f.stale_accepted, f.lost_updates
            ));
        }
        match self.mode {
            Mode::Exclusive => {}
            Mode::Semaphore(n) => {
                self.semaphore_verdict(n, &mut v);
                return v;
            }
            Mode::Rw => {
                self.rw_verdict(&mut v);
                return v;
            }
        }
        self.history_verdict(&mut v);
        if f.overlaps > 0 && !self.overlaps_expected() {
            v.violations.push(format!(
                "{} overlapping holders without a fault that outlives a lease",
                f.overlaps
            ));
        }
        if f.overlaps > 0 && self.overlaps_expected() {
            if self.engine == Engine::Redlock {
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

    /// The semaphore's bound: nobody over the permits but where a fault outlives a lease (a
    /// permit has no fence to protect the store), and the permits shared.
    fn semaphore_verdict(&self, permits: u32, v: &mut Verdict) {
        let f = &self.findings;
        if f.over_permits > 0 && !self.overlaps_expected() {
            v.violations.push(format!(
                "{} sections started while {permits} others held the key's permits",
                f.over_permits
            ));
        } else if f.over_permits > 0 {
            v.expected.push(format!(
                "{} sections started while {permits} others held the key's permits: a holder \
                 paused past its lease (or forgotten by a restarted engine) still finished a step",
                f.over_permits
            ));
        }
        if permits > 1 && f.sections >= SHARING_SHOWN_AFTER && f.peak_holders < 2 {
            v.violations.push(format!(
                "the {permits} permits were never held by two sections at once"
            ));
        }
    }

    /// The read-write lock: the writers' history as in the exclusive mode, no writer
    /// overlapping anyone but where a fault outlives a lease, and readers sharing.
    fn rw_verdict(&self, v: &mut Verdict) {
        let f = &self.findings;
        self.history_verdict(v);
        if f.writer_overlaps > 0 && !self.overlaps_expected() {
            v.violations.push(format!(
                "{} sections overlapped with a writer without a fault that outlives a lease",
                f.writer_overlaps
            ));
        } else if f.writer_overlaps > 0 {
            v.expected.push(format!(
                "{} sections overlapped with a writer (a holder paused past its lease, or \
                 forgotten by a restarted engine); the writes' history is whole: no update lost",
                f.writer_overlaps
            ));
        }
        if f.reads >= SHARING_SHOWN_AFTER && f.reader_overlaps == 0 {
            v.violations.push(format!(
                "no two of {} readers ever held the key together",
                f.reads
            ));
        }
    }

    /// The writes' history (exclusive and rw modes): no update lost but Redlock's documented
    /// ones.
    fn history_verdict(&self, v: &mut Verdict) {
        let f = &self.findings;
        let harmful = f.unprotected > 0 || f.lost_updates > 0;
        let redlock_expected = self.engine == Engine::Redlock && self.overlaps_expected();
        if harmful && !redlock_expected {
            v.violations.push(format!(
                "{} unprotected overlapping holders, {} lost updates",
                f.unprotected, f.lost_updates
            ));
        }
    }

    /// The network faults injected and what they cost, as a note: how long each kind lasted in
    /// all and how many sections ended meanwhile, against the run's mean rate.
    fn network_costs(&self) -> Option<String> {
        let injected = self.injected.as_ref()?;
        let mean = self.findings.sections as f64 / self.took.as_secs_f64().max(1.0);
        let parts: Vec<String> = injected
            .network
            .iter()
            .filter(|(_, cost)| cost.injected > 0)
            .map(|(fault, cost)| {
                let secs = cost.lasted.as_secs_f64();
                format!(
                    "{} x{} ({secs:.1} s in all, {} sections ended meanwhile: {:.0}/s)",
                    fault.name(),
                    cost.injected,
                    cost.sections,
                    cost.sections as f64 / secs.max(0.001)
                )
            })
            .collect();
        (!parts.is_empty()).then(|| {
            format!(
                "network faults: {}; the run's mean {mean:.0} sections/s",
                parts.join(", ")
            )
        })
    }

    fn faults_cell(&self) -> String {
        match self.injected {
            None => "n/a".into(),
            Some(i) => format!("{}/{}/{}", i.kills, i.pauses, i.restarts),
        }
    }
}

/// The Markdown table (its columns those of the run's mode), then per engine its notes:
/// violations, expected results, what the runtime reported to the workers.
pub(crate) fn render(rows: &[Row]) -> String {
    let mut out = String::new();
    let mode = rows.first().map_or(Mode::Exclusive, |row| row.mode);
    out.push_str(match mode {
        Mode::Exclusive => {
            "| engine | kill/pause/restart | sections | writes accepted | overlapping holders | fenced | in order | unprotected | stale fences accepted | lost updates | keys left | result |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|\n"
        }
        Mode::Semaphore(_) => {
            "| engine | permits | kill/pause/restart | sections | most holders at once | over the permits | duplicate fences | keys left | result |\n\
             |---|---|---|---|---|---|---|---|---|\n"
        }
        Mode::Rw => {
            "| engine | kill/pause/restart | sections | reads | writes accepted | readers overlapping | writer overlaps | unprotected | stale fences accepted | lost updates | keys left | result |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|\n"
        }
    });
    for row in rows {
        let f = &row.findings;
        let verdict = row.verdict();
        let result = if !verdict.violations.is_empty() {
            "**FAIL**"
        } else if verdict.expected.is_empty() {
            "ok"
        } else if row.engine == Engine::Redlock {
            "ok (expected, no fences)"
        } else if row.mode == Mode::Exclusive {
            "ok (fenced)"
        } else {
            "ok (expected under pauses)"
        };
        let _ = match row.mode {
            Mode::Exclusive => writeln!(
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
            ),
            Mode::Semaphore(n) => writeln!(
                out,
                "| {} | {n} | {} | {} | {} | {} | {} | {} | {result} |",
                row.engine,
                row.faults_cell(),
                f.sections,
                f.peak_holders,
                f.over_permits,
                f.duplicate_fences,
                row.keys_left.len(),
            ),
            Mode::Rw => writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {result} |",
                row.engine,
                row.faults_cell(),
                f.sections,
                f.reads,
                f.accepted,
                f.reader_overlaps,
                f.writer_overlaps,
                f.unprotected,
                f.stale_accepted,
                f.lost_updates,
                row.keys_left.len(),
            ),
        };
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
             timeouts, {} lock errors, {} store errors, {} sections that blocked their thread \
             first",
            row.engine,
            row.took,
            f.rejected,
            f.unresolved,
            t.lost,
            t.timeouts,
            t.lock_errors,
            t.store_errors,
            t.blocked
        );
        if let Some(line) = row.network_costs() {
            let _ = writeln!(out, "  - {line}");
        }
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
            mode: Mode::Exclusive,
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

    #[test]
    fn repeated_fences_after_a_cluster_failover_are_expected_and_nowhere_else() {
        let repeated = Findings {
            duplicate_fences: 3,
            ..Findings::default()
        };
        let ok = row(Engine::Cluster, &[Fault::EnginePause], repeated.clone()).verdict();
        assert!(ok.violations.is_empty(), "{ok:?}");
        assert!(ok.expected[0].contains("failovers"), "{ok:?}");
        for (engine, faults) in [
            (Engine::Cluster, &[Fault::Kill][..]),
            (Engine::Redis, &[Fault::EnginePause][..]),
        ] {
            let bad = row(engine, faults, repeated.clone()).verdict();
            assert_eq!(bad.violations.len(), 1, "{engine}: {bad:?}");
        }
    }

    #[test]
    fn network_costs_are_noted_per_fault() {
        let mut r = row(Engine::Redis, &[Fault::Partition], Findings::default());
        assert!(!render(std::slice::from_ref(&r)).contains("network faults"));
        let injected = r.injected.as_mut().unwrap();
        let partition = &mut injected.network[0].1;
        partition.injected = 2;
        partition.lasted = Duration::from_secs(4);
        partition.sections = 400;
        let notes = render(&[r]);
        assert!(
            notes.contains(
                "network faults: partition x2 (4.0 s in all, 400 sections ended meanwhile: 100/s)"
            ),
            "{notes}"
        );
    }

    #[test]
    fn holders_over_the_permits_fail_a_run_without_pauses() {
        let over = Findings {
            sections: 100,
            peak_holders: 3,
            over_permits: 2,
            ..Findings::default()
        };
        let mut r = row(Engine::Redis, &[Fault::Kill], over.clone());
        r.mode = Mode::Semaphore(2);
        assert_eq!(r.verdict().violations.len(), 1, "{:?}", r.verdict());
        assert!(render(&[r]).contains("| redis | 2 | 0/0/0 | 100 | 3 | 2 | 0 | 0 | **FAIL** |"));
        let mut r = row(Engine::Redis, &[Fault::Pause], over);
        r.mode = Mode::Semaphore(2);
        assert!(r.verdict().violations.is_empty(), "{:?}", r.verdict());
        let mut r = row(
            Engine::Etcd,
            &[],
            Findings {
                sections: 100,
                peak_holders: 1,
                ..Findings::default()
            },
        );
        r.mode = Mode::Semaphore(2);
        assert_eq!(
            r.verdict().violations.len(),
            1,
            "never shared: {:?}",
            r.verdict()
        );
    }

    #[test]
    fn rw_fails_on_a_writer_overlap_without_pauses_and_on_readers_never_sharing() {
        let mut r = row(
            Engine::Redis,
            &[Fault::Kill],
            Findings {
                sections: 100,
                reads: 80,
                reader_overlaps: 10,
                writer_overlaps: 1,
                ..Findings::default()
            },
        );
        r.mode = Mode::Rw;
        assert_eq!(r.verdict().violations.len(), 1, "{:?}", r.verdict());
        r.findings.writer_overlaps = 0;
        assert!(r.verdict().violations.is_empty(), "{:?}", r.verdict());
        r.findings.reader_overlaps = 0;
        assert_eq!(r.verdict().violations.len(), 1, "{:?}", r.verdict());
    }
}
