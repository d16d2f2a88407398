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

use std::collections::{HashMap, HashSet};

use crate::store::{Outcome, Record, Written};

/// One critical section, from its records.
#[derive(Debug, Default)]
struct Section<'a> {
    key: &'a str,
    fence: Option<u64>,
    start: u64,
    /// The last moment it is known to have run: its end, or its intent record's time.
    until: u64,
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
    /// A broken history or an inconsistent log: always a violation.
    pub(crate) problems: Vec<String>,
}

/// Checks `records` (the whole log) against `finals` (each key's counter at the end).
pub(crate) fn check(records: &[Record], finals: &[(String, Option<Written>)]) -> Findings {
    let mut findings = Findings::default();
    let sections = sections(records, &mut findings.problems);
    findings.sections = sections.len() as u64;
    for (key, last) in finals {
        check_key(key, last.as_ref(), &sections, &mut findings);
    }
    findings
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
            ..Section::default()
        });
        if (section.key, section.fence, section.start) != (key.as_str(), fence, start) {
            problems.push(format!(
                "section {id}: its records disagree on key, fence or start"
            ));
        }
        section.until = section.until.max(at);
        match record {
            Record::Intent(i) => section.intent = Some((i.n, i.prev.as_deref())),
            Record::End(e) => match section.outcome {
                Some(outcome) if outcome != e.outcome => problems.push(format!(
                    "section {id}: two end records ({outcome:?}, {:?})",
                    e.outcome
                )),
                _ => section.outcome = Some(e.outcome),
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
    let mut fences: HashMap<u64, u32> = HashMap::new();
    for (id, s) in &of_key {
        match s.outcome {
            Some(Outcome::Accepted) if !in_chain.contains(id) => findings.lost_updates += 1,
            Some(Outcome::Rejected | Outcome::ClaimRejected) if in_chain.contains(id) => {
                findings.problems.push(format!(
                    "{key}: the write of {id} was applied although it was rejected"
                ))
            }
            Some(Outcome::Rejected | Outcome::ClaimRejected) => findings.rejected += 1,
            Some(Outcome::Accepted) => {}
            Some(Outcome::Cancelled | Outcome::Failed) | None => {
                if s.intent.is_some() && !in_chain.contains(id) {
                    findings.unresolved += 1;
                }
            }
        }
        if let Some(fence) = s.fence {
            *fences.entry(fence).or_default() += 1;
        }
    }
    findings.duplicate_fences += fences.values().filter(|&&n| n > 1).count() as u64;

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
        check(&log(specs), &[(KEY.to_owned(), last)])
    }

    use Outcome::{Accepted, Cancelled, ClaimRejected, Rejected};

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
