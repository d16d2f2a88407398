//! The checker: what the log and the final counters say happened, key by key.
//!
//! - **History.** Every counter value names the section that wrote it, and every write's intent
//!   record names the value it read, so the accepted writes of a key form a chain from the
//!   final value back to the empty counter. A write is accepted when it is in that chain, or
//!   its section logged it accepted. The chain must be whole: each link's count one more than
//!   the one it read, down to 1.
//! - **Lost updates**: writes logged as accepted that are not in the chain: a later write did
//!   not read them. (The final counter then falls short of the accepted writes.)
//! - **Stale fences accepted**: along the chain, a fence lower than an earlier accepted one,
//!   rechecked here without trusting the store's script.
//! - **Duplicate fences**: two sections of a key holding the same token; on an engine that gives
//!   fences every fresh acquisition must get a new, higher one.
//! - **Overlapping holders**: a section still running (by its own clock readings: start, intent,
//!   end) when another section of the same key started. Each such stale holder is counted once,
//!   as **unprotected** if it and an overlapping section both had writes accepted and one of them
//!   is missing from the chain (an update was lost), **in order** if both writes were accepted
//!   and are in the chain (the store serialized them: the later one claimed and read after the
//!   earlier one wrote), and **fenced** otherwise (a write was rejected, or never made).
//!
//! The shared modes judge a section by what it finished: from its start to its last completed
//! step (its end, unless the runtime cancelled it or a store call failed; then its intent, or
//! its start). A holder paused and then cancelled did nothing after its last step.
//!
//! - **`--mode semaphore`** (N permits): per key, the holders running at each start. A section
//!   that started while N others ran is **over the permits**; the most running at once is
//!   reported too.
//! - **`--mode rw`**: the writers' history as above (readers write nothing), plus **writer
//!   overlaps**: sections still running when another of the key started, where one of the two
//!   is a writer (each earlier section counted once); and **reader overlaps**: readers still
//!   running when another reader started (the read lock shares: a run with several tasks must
//!   have some).

use std::collections::{HashMap, HashSet};

use crate::cli::Mode;
use crate::store::{Outcome, Record, Written};
use crate::worker::READER;

/// One critical section, from its records.
#[derive(Debug, Default, Clone)]
struct Section<'a> {
    key: &'a str,
    fence: Option<u64>,
    start: u64,
    /// The last moment it is known to have run: its end, or its intent record's time.
    until: u64,
    /// The end of its last completed step: its end, unless it was cancelled or failed (then
    /// its intent record's time, or its start).
    done: u64,
    /// `(count written, section read)` from its intent record.
    intent: Option<(u64, Option<&'a str>)>,
    outcome: Option<Outcome>,
}

/// What the checker counted, over every key.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Findings {
    /// Critical sections with at least one record.
    pub(crate) sections: u64,
    /// Writes accepted (the lengths of the chains).
    pub(crate) accepted: u64,
    /// Sections whose claim or write the store rejected.
    pub(crate) rejected: u64,
    /// Sections that sent a write and never learnt the answer (killed, cancelled, failed), whose
    /// write is not in the history: it did not land, unless it was lost (see `duplicate_fences`).
    pub(crate) unresolved: u64,
    /// Stale holders: sections still running when another of the same key started.
    pub(crate) overlaps: u64,
    pub(crate) fenced: u64,
    pub(crate) in_order: u64,
    pub(crate) unprotected: u64,
    pub(crate) stale_accepted: u64,
    pub(crate) lost_updates: u64,
    pub(crate) duplicate_fences: u64,
    /// `--mode semaphore`: sections that started while the semaphore's size of others ran.
    pub(crate) over_permits: u64,
    /// The most sections of one key running at once (shared modes).
    pub(crate) peak_holders: u64,
    /// `--mode rw`: readers' sections.
    pub(crate) reads: u64,
    /// `--mode rw`: sections overlapping another where one of the two is a writer.
    pub(crate) writer_overlaps: u64,
    /// `--mode rw`: readers overlapping another reader.
    pub(crate) reader_overlaps: u64,
    /// A broken history or an inconsistent log: always a violation.
    pub(crate) problems: Vec<String>,
}

/// Checks `records` (the whole log) against `finals` (each key's counter at the end), for
/// sections that ran in `mode`.
pub(crate) fn check(
    records: &[Record],
    finals: &[(String, Option<Written>)],
    mode: Mode,
) -> Findings {
    let mut findings = Findings::default();
    let sections = sections(records, &mut findings.problems);
    findings.sections = sections.len() as u64;
    for (key, last) in finals {
        findings.duplicate_fences += duplicate_fences(key, &sections);
        match mode {
            Mode::Exclusive => check_key(key, last.as_ref(), &sections, &mut findings),
            Mode::Semaphore(n) => check_permits(key, n, &sections, &mut findings),
            Mode::Rw => {
                let writers: HashMap<&str, Section> = sections
                    .iter()
                    .filter(|(id, _)| !is_reader(id))
                    .map(|(id, s)| (*id, s.clone()))
                    .collect();
                check_key(key, last.as_ref(), &writers, &mut findings);
                check_readers_and_writers(key, &sections, &mut findings);
            }
        }
    }
    findings
}

fn is_reader(id: &str) -> bool {
    id.ends_with(READER)
}

/// Fences held by more than one section of `key`.
fn duplicate_fences(key: &str, sections: &HashMap<&str, Section<'_>>) -> u64 {
    let mut fences: HashMap<u64, u32> = HashMap::new();
    for s in sections.values().filter(|s| s.key == key) {
        if let Some(fence) = s.fence {
            *fences.entry(fence).or_default() += 1;
        }
    }
    fences.values().filter(|&&n| n > 1).count() as u64
}

/// The sections of `key` as `(id, start, done)`, by start.
fn spans<'a>(key: &str, sections: &HashMap<&'a str, Section<'_>>) -> Vec<(&'a str, u64, u64)> {
    let mut spans: Vec<_> = sections
        .iter()
        .filter(|(_, s)| s.key == key)
        .map(|(id, s)| (*id, s.start, s.done))
        .collect();
    spans.sort_by_key(|&(id, start, _)| (start, id));
    spans
}

/// `--mode semaphore`: no section may start while `permits` others of its key still run.
fn check_permits(
    key: &str,
    permits: u32,
    sections: &HashMap<&str, Section<'_>>,
    findings: &mut Findings,
) {
    // The running sections' ends, the earliest first.
    let mut running = std::collections::BinaryHeap::new();
    for (_, start, done) in spans(key, sections) {
        while running
            .peek()
            .is_some_and(|std::cmp::Reverse(end)| *end <= start)
        {
            running.pop();
        }
        if running.len() >= permits as usize {
            findings.over_permits += 1;
        }
        running.push(std::cmp::Reverse(done));
        findings.peak_holders = findings.peak_holders.max(running.len() as u64);
    }
}

/// `--mode rw`: writers overlap nobody; readers overlap each other.
fn check_readers_and_writers(
    key: &str,
    sections: &HashMap<&str, Section<'_>>,
    findings: &mut Findings,
) {
    let spans = spans(key, sections);
    let mut running = std::collections::BinaryHeap::new();
    for (i, &(id, start, done)) in spans.iter().enumerate() {
        let reader = is_reader(id);
        findings.reads += u64::from(reader);
        let (mut with_writer, mut with_reader) = (false, false);
        for &(other, _, _) in spans[i + 1..].iter().take_while(|(_, t, _)| *t < done) {
            if reader && is_reader(other) {
                with_reader = true;
            } else {
                with_writer = true;
            }
        }
        findings.writer_overlaps += u64::from(with_writer);
        findings.reader_overlaps += u64::from(with_reader);
        while running
            .peek()
            .is_some_and(|std::cmp::Reverse(end)| *end <= start)
        {
            running.pop();
        }
        running.push(std::cmp::Reverse(done));
        findings.peak_holders = findings.peak_holders.max(running.len() as u64);
    }
}

fn sections<'a>(
    records: &'a [Record],
    problems: &mut Vec<String>,
) -> HashMap<&'a str, Section<'a>> {
    let mut sections: HashMap<&str, Section> = HashMap::new();
    for record in records {
        let (id, key, fence, start, at) = match record {
            Record::Intent(i) => (&i.id, &i.key, i.fence, i.start, i.at),
            Record::End(e) => (&e.id, &e.key, e.fence, e.start, e.end),
        };
        let section = sections.entry(id).or_insert_with(|| Section {
            key,
            fence,
            start,
            until: start,
            done: start,
            ..Section::default()
        });
        if (section.key, section.fence, section.start) != (key.as_str(), fence, start) {
            problems.push(format!(
                "section {id}: its records disagree on key, fence or start"
            ));
        }
        section.until = section.until.max(at);
        match record {
            Record::Intent(i) => {
                section.intent = Some((i.n, i.prev.as_deref()));
                section.done = section.done.max(i.at);
            }
            Record::End(e) => match section.outcome {
                Some(outcome) if outcome != e.outcome => problems.push(format!(
                    "section {id}: two end records ({outcome:?}, {:?})",
                    e.outcome
                )),
                _ => {
                    section.outcome = Some(e.outcome);
                    if !matches!(e.outcome, Outcome::Cancelled | Outcome::Failed) {
                        section.done = section.done.max(e.end);
                    }
                }
            },
        }
    }
    sections
}

fn check_key(
    key: &str,
    last: Option<&Written>,
    sections: &HashMap<&str, Section<'_>>,
    findings: &mut Findings,
) {
    let chain = history(key, last, sections, &mut findings.problems);
    let in_chain: HashSet<&str> = chain.iter().copied().collect();
    findings.accepted += chain.len() as u64;

    let mut highest = None;
    for id in &chain {
        let fence = sections[id].fence;
        if fence.is_some() && fence < highest {
            findings.stale_accepted += 1;
        }
        highest = highest.max(fence);
    }

    let mut of_key: Vec<(&str, &Section)> = sections
        .iter()
        .filter(|(_, s)| s.key == key)
        .map(|(id, s)| (*id, s))
        .collect();
    for (id, s) in &of_key {
        match s.outcome {
            Some(Outcome::Accepted) if !in_chain.contains(id) => findings.lost_updates += 1,
            Some(Outcome::Rejected | Outcome::ClaimRejected) if in_chain.contains(id) => {
                findings.problems.push(format!(
                    "{key}: the write of {id} was applied although it was rejected"
                ))
            }
            Some(Outcome::Rejected | Outcome::ClaimRejected) => findings.rejected += 1,
            Some(Outcome::Accepted | Outcome::Held | Outcome::Read) => {}
            Some(Outcome::Cancelled | Outcome::Failed) | None => {
                if s.intent.is_some() && !in_chain.contains(id) {
                    findings.unresolved += 1;
                }
            }
        }
    }

    let accepted =
        |id: &str, s: &Section| in_chain.contains(id) || s.outcome == Some(Outcome::Accepted);
    of_key.sort_by_key(|(id, s)| (s.start, *id));
    for (i, (id, s)) in of_key.iter().enumerate() {
        let mut worst = None;
        for (other, t) in of_key[i + 1..]
            .iter()
            .take_while(|(_, t)| t.start < s.until)
        {
            let kind = if accepted(id, s) && accepted(other, t) {
                if in_chain.contains(id) && in_chain.contains(other) {
                    Overlap::InOrder
                } else {
                    Overlap::Unprotected
                }
            } else {
                Overlap::Fenced
            };
            worst = worst.max(Some(kind));
        }
        match worst {
            None => continue,
            Some(Overlap::Fenced) => findings.fenced += 1,
            Some(Overlap::InOrder) => findings.in_order += 1,
            Some(Overlap::Unprotected) => findings.unprotected += 1,
        }
        findings.overlaps += 1;
    }
}

/// How two overlapping holders' writes went, from harmless to harmful.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Overlap {
    Fenced,
    InOrder,
    Unprotected,
}

/// The accepted writes of `key`, oldest first: the chain from the final value back through
/// the value each write read. A break is a problem.
fn history<'a>(
    key: &str,
    last: Option<&Written>,
    sections: &HashMap<&'a str, Section<'a>>,
    problems: &mut Vec<String>,
) -> Vec<&'a str> {
    let mut chain = Vec::new();
    let Some(last) = last else {
        return chain;
    };
    let mut next = Some((last.n, last.by.as_str()));
    while let Some((n, by)) = next {
        let Some((&id, section)) = sections.get_key_value(by) else {
            problems.push(format!(
                "{key}: count {n} was written by {by}, which logged nothing"
            ));
            break;
        };
        let Some((written, read)) = section.intent else {
            problems.push(format!(
                "{key}: count {n} was written by {by}, which logged no intent"
            ));
            break;
        };
        if written != n || section.key != key || chain.len() as u64 > last.n {
            problems.push(format!(
                "{key}: broken history at {by} (count {n}, its intent says {written} on {})",
                section.key
            ));
            break;
        }
        chain.push(id);
        next = match (read, n) {
            (Some(read), 2..) => Some((n - 1, read)),
            (None, 1) => None,
            _ => {
                problems.push(format!(
                    "{key}: broken history at {by}: count {n} read {}",
                    read.unwrap_or("an empty counter")
                ));
                None
            }
        };
    }
    chain.reverse();
    chain
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{End, Intent};

    const KEY: &str = "torture:0";

    /// A section on `KEY`: `(id, fence, start, end, count written, read, outcome)`; no intent
    /// when the count is 0, no end record when the outcome is `None`.
    type Spec<'a> = (
        &'a str,
        u64,
        u64,
        u64,
        u64,
        Option<&'a str>,
        Option<Outcome>,
    );

    fn log(specs: &[Spec]) -> Vec<Record> {
        let mut records = Vec::new();
        for &(id, fence, start, end, n, prev, outcome) in specs {
            if n > 0 {
                records.push(Record::Intent(Intent {
                    id: id.into(),
                    key: KEY.into(),
                    fence: Some(fence),
                    start,
                    at: start + 1,
                    n,
                    prev: prev.map(str::to_owned),
                }));
            }
            if let Some(outcome) = outcome {
                records.push(Record::End(End {
                    id: id.into(),
                    key: KEY.into(),
                    fence: Some(fence),
                    start,
                    end,
                    outcome,
                }));
            }
        }
        records
    }

    fn run(specs: &[Spec], last: Option<(u64, &str)>) -> Findings {
        let last = last.map(|(n, by)| Written { n, by: by.into() });
        check(&log(specs), &[(KEY.to_owned(), last)], Mode::Exclusive)
    }

    /// Sections on `KEY` that only log their end: `(id, fence, start, end, outcome)`.
    fn ends(specs: &[(&str, u64, u64, u64, Outcome)]) -> Vec<Record> {
        specs
            .iter()
            .map(|&(id, fence, start, end, outcome)| {
                Record::End(End {
                    id: id.into(),
                    key: KEY.into(),
                    fence: Some(fence),
                    start,
                    end,
                    outcome,
                })
            })
            .collect()
    }

    #[test]
    fn a_semaphore_counts_holders_over_its_permits() {
        let finals = [(KEY.to_owned(), None)];
        // Two at once at most: within a semaphore of 2.
        let two = ends(&[
            ("a", 1, 0, 10, Held),
            ("b", 2, 5, 20, Held),
            ("c", 3, 10, 30, Held),
            ("d", 4, 20, 40, Held),
        ]);
        let findings = check(&two, &finals, Mode::Semaphore(2));
        assert_eq!((findings.over_permits, findings.peak_holders), (0, 2));
        // c starts while a and b still run: one over a semaphore of 2, none over 3.
        let three = ends(&[
            ("a", 1, 0, 15, Held),
            ("b", 2, 5, 20, Held),
            ("c", 3, 10, 30, Held),
        ]);
        let findings = check(&three, &finals, Mode::Semaphore(2));
        assert_eq!((findings.over_permits, findings.peak_holders), (1, 3));
        assert_eq!(check(&three, &finals, Mode::Semaphore(3)).over_permits, 0);
        // A holder the runtime cancelled finished nothing after its start.
        let cancelled = ends(&[
            ("a", 1, 0, 100, Cancelled),
            ("b", 2, 5, 20, Held),
            ("c", 3, 10, 30, Held),
        ]);
        assert_eq!(
            check(&cancelled, &finals, Mode::Semaphore(2)).over_permits,
            0
        );
    }

    #[test]
    fn rw_counts_writers_overlapping_anyone_and_readers_overlapping_readers() {
        let finals = [(KEY.to_owned(), None)];
        let readers = ends(&[
            ("a.1r", 1, 0, 10, Read),
            ("a.2r", 2, 5, 20, Read),
            ("a.3r", 3, 30, 40, Read),
        ]);
        let findings = check(&readers, &finals, Mode::Rw);
        assert_eq!(findings.reads, 3);
        assert_eq!((findings.reader_overlaps, findings.writer_overlaps), (1, 0));
        // A writer (no `r`) that starts while a reader runs, and a reader inside a writer.
        let mixed = ends(&[
            ("a.1r", 1, 0, 10, Read),
            ("a.2", 2, 5, 20, ClaimRejected),
            ("a.3r", 3, 15, 25, Read),
        ]);
        let findings = check(&mixed, &finals, Mode::Rw);
        assert_eq!((findings.reader_overlaps, findings.writer_overlaps), (0, 2));
        assert_eq!(findings.overlaps, 0, "no two writers overlapped");
    }

    use Outcome::{Accepted, Cancelled, ClaimRejected, Held, Read, Rejected};

    #[test]
    fn a_clean_history_has_no_findings() {
        let findings = run(
            &[
                ("a", 1, 0, 10, 1, None, Some(Accepted)),
                ("b", 2, 20, 30, 2, Some("a"), Some(Accepted)),
                ("c", 3, 40, 50, 3, Some("b"), Some(Accepted)),
            ],
            Some((3, "c")),
        );
        assert_eq!(
            findings,
            Findings {
                sections: 3,
                accepted: 3,
                ..Findings::default()
            }
        );
    }

    #[test]
    fn a_stale_holders_rejected_write_is_a_fenced_overlap() {
        // a is paused from 5 to 100; b claims fence 2 and writes; a's late write is rejected.
        let findings = run(
            &[
                ("a", 1, 0, 100, 1, None, Some(Rejected)),
                ("b", 2, 20, 30, 1, None, Some(Accepted)),
                ("c", 3, 40, 50, 0, None, Some(ClaimRejected)),
            ],
            Some((1, "b")),
        );
        assert_eq!((findings.overlaps, findings.fenced), (1, 1));
        assert_eq!((findings.unprotected, findings.lost_updates), (0, 0));
        assert_eq!(findings.rejected, 2);
        assert!(findings.problems.is_empty(), "{:?}", findings.problems);
    }

    #[test]
    fn both_writes_accepted_without_reading_each_other_is_unprotected_and_a_lost_update() {
        // a and b both read the empty counter and both writes were accepted: b overwrote a.
        let findings = run(
            &[
                ("a", 1, 0, 100, 1, None, Some(Accepted)),
                ("b", 2, 20, 30, 1, None, Some(Accepted)),
            ],
            Some((1, "b")),
        );
        assert_eq!((findings.overlaps, findings.unprotected), (1, 1));
        assert_eq!(findings.lost_updates, 1);
    }

    #[test]
    fn an_overlap_whose_writes_the_store_serialized_is_in_order() {
        // a wrote before b claimed; a then stalled past b's start: b read a's write.
        let findings = run(
            &[
                ("a", 1, 0, 100, 1, None, Some(Accepted)),
                ("b", 2, 20, 30, 2, Some("a"), Some(Accepted)),
            ],
            Some((2, "b")),
        );
        assert_eq!((findings.overlaps, findings.in_order), (1, 1));
        assert_eq!((findings.unprotected, findings.lost_updates), (0, 0));
    }

    #[test]
    fn fences_going_down_along_the_history_are_stale_writes_accepted() {
        let findings = run(
            &[
                ("a", 5, 0, 10, 1, None, Some(Accepted)),
                ("b", 4, 20, 30, 2, Some("a"), Some(Accepted)),
                ("c", 4, 40, 50, 3, Some("b"), Some(Accepted)),
            ],
            Some((3, "c")),
        );
        assert_eq!(findings.stale_accepted, 2);
        assert_eq!(findings.duplicate_fences, 1);
    }

    #[test]
    fn a_killed_writer_is_judged_by_the_history() {
        // a was killed after its intent: its write landed (b read it). c was killed after its
        // intent too, but nobody read its write and it is not the final value.
        let findings = run(
            &[
                ("a", 1, 0, 10, 1, None, None),
                ("b", 2, 20, 30, 2, Some("a"), Some(Accepted)),
                ("c", 3, 40, 50, 3, Some("b"), Some(Cancelled)),
                ("d", 4, 60, 70, 3, Some("b"), Some(Accepted)),
            ],
            Some((3, "d")),
        );
        assert_eq!(findings.accepted, 3);
        assert_eq!(findings.unresolved, 1);
        assert_eq!(findings.lost_updates, 0);
        assert!(findings.problems.is_empty(), "{:?}", findings.problems);
    }

    #[test]
    fn a_broken_history_or_a_rejected_write_that_landed_is_a_problem() {
        let findings = run(&[("a", 1, 0, 10, 2, None, Some(Accepted))], Some((2, "a")));
        assert_eq!(findings.problems.len(), 1, "{:?}", findings.problems);
        let findings = run(&[("a", 1, 0, 10, 1, None, Some(Rejected))], Some((1, "a")));
        assert_eq!(findings.problems.len(), 1, "{:?}", findings.problems);
        let findings = run(&[], Some((1, "ghost")));
        assert_eq!(findings.problems.len(), 1, "{:?}", findings.problems);
    }
}
