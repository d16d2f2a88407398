//! A framer for the replies of a Redis server (RESP2 and RESP3): where the first complete reply
//! in a buffer ends, found by reading only type bytes, lengths and line ends, without allocating.

use std::fmt;

/// How many aggregates (arrays, maps, sets, pushes, attributes) one reply may nest.
const MAX_DEPTH: usize = 64;

/// Why a buffer cannot hold a RESP reply (a byte that starts no RESP type, a length that is not
/// a number, a missing CRLF after a bulk payload, nesting deeper than `MAX_DEPTH`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Malformed(pub(super) &'static str);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed RESP reply: {}", self.0)
    }
}

impl std::error::Error for Malformed {}

/// A reply starts with a byte that is no RESP type.
const UNKNOWN_TYPE: Malformed = Malformed("a byte that starts no RESP type");
/// A length or count that is neither decimal digits nor `-1`.
const NOT_A_LENGTH: Malformed = Malformed("a length that is not a decimal number or -1");
/// A length or count that does not fit in memory.
const TOO_LARGE: Malformed = Malformed("a length too large");
/// `-1` (null) as the length of a type that has no null (only `$` and `*` have one).
const NO_NULL: Malformed = Malformed("a null length on a type that has no null");
/// A line whose `\n` does not follow a `\r`, or a length followed by `\r` and not `\n`.
const NO_CRLF: Malformed = Malformed("a line not ended by CRLF");
/// The two bytes after a bulk payload are not `\r\n`.
const NO_CRLF_AFTER_PAYLOAD: Malformed = Malformed("a bulk payload not followed by CRLF");
/// More than `MAX_DEPTH` aggregates nested.
const TOO_DEEP: Malformed = Malformed("aggregates nested more than 64 deep");

/// What the first byte of a reply announces.
#[derive(Clone, Copy)]
enum Kind {
    /// One line: simple string `+`, simple error `-`, integer `:`, null `_`, double `,`,
    /// boolean `#`, big number `(`.
    Line,
    /// A length line, that many bytes, then CRLF: bulk string `$`, blob error `!`, verbatim
    /// string `=`. `nullable`: a length of `-1` is a null (`$` only).
    Bulk { nullable: bool },
    /// A count line, then `per * count + extra` replies: array `*`, set `~`, push `>`
    /// (`per` 1), map `%` (`per` 2), attribute `|` (`per` 2, `extra` 1: the reply it is
    /// attached to). `nullable`: a count of `-1` is a null (`*` only).
    Aggregate {
        per: usize,
        extra: usize,
        nullable: bool,
    },
}

impl Kind {
    /// The kind a reply starting with `byte` has, if any.
    fn of(byte: u8) -> Option<Self> {
        let aggregate = |per, extra, nullable| Kind::Aggregate {
            per,
            extra,
            nullable,
        };
        Some(match byte {
            b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Kind::Line,
            b'$' => Kind::Bulk { nullable: true },
            b'!' | b'=' => Kind::Bulk { nullable: false },
            b'*' => aggregate(1, 0, true),
            b'~' | b'>' => aggregate(1, 0, false),
            b'%' => aggregate(2, 0, false),
            b'|' => aggregate(2, 1, false),
            _ => return None,
        })
    }
}

/// The length of the first complete reply in `buf`: `Ok(Some(len))`, `Ok(None)` when more bytes
/// are needed, `Err` when `buf` cannot start a RESP reply.
///
/// An attribute (`|`) and the reply it is attached to are one reply. Aggregates are walked
/// iteratively: `open` counts, for each aggregate not yet complete, the replies it still lacks.
pub(super) fn reply_len(buf: &[u8]) -> Result<Option<usize>, Malformed> {
    let mut open = [0usize; MAX_DEPTH];
    let mut depth = 0;
    let mut pos = 0;
    loop {
        let Some(&first) = buf.get(pos) else {
            return Ok(None);
        };
        let kind = Kind::of(first).ok_or(UNKNOWN_TYPE)?;
        let header = pos + 1;
        let (end, members) = match kind {
            Kind::Line => match line_end(buf, header)? {
                Some(end) => (end, 0),
                None => return Ok(None),
            },
            Kind::Bulk { nullable } => match length(buf, header)? {
                None => return Ok(None),
                Some((None, after)) if nullable => (after, 0),
                Some((None, _)) => return Err(NO_NULL),
                Some((Some(len), after)) => match payload_end(buf, after, len)? {
                    Some(end) => (end, 0),
                    None => return Ok(None),
                },
            },
            Kind::Aggregate {
                per,
                extra,
                nullable,
            } => match length(buf, header)? {
                None => return Ok(None),
                Some((None, after)) if nullable => (after, 0),
                Some((None, _)) => return Err(NO_NULL),
                Some((Some(count), after)) => {
                    if depth == MAX_DEPTH {
                        return Err(TOO_DEEP);
                    }
                    let members = count
                        .checked_mul(per)
                        .and_then(|n| n.checked_add(extra))
                        .ok_or(TOO_LARGE)?;
                    (after, members)
                }
            },
        };
        pos = end;
        if members > 0 {
            // Only an aggregate has members, and it checked `depth < MAX_DEPTH`.
            open[depth] = members;
            depth += 1;
            continue;
        }
        // A reply is complete: it completes each open aggregate whose last member it was.
        loop {
            let Some(top) = depth.checked_sub(1) else {
                return Ok(Some(pos));
            };
            open[top] -= 1;
            if open[top] > 0 {
                break;
            }
            depth = top;
        }
    }
}

/// The index past the CRLF of the line that starts at `at`, `None` if `buf` ends before it.
pub(super) fn line_end(buf: &[u8], at: usize) -> Result<Option<usize>, Malformed> {
    let rest = buf.get(at..).unwrap_or_default();
    match rest.iter().position(|&b| b == b'\n') {
        None => Ok(None),
        Some(lf) if lf > 0 && rest[lf - 1] == b'\r' => Ok(Some(at + lf + 1)),
        Some(_) => Err(NO_CRLF),
    }
}

/// The length or count whose line starts at `at` (`None` for `-1`) and the index past its CRLF;
/// `None` if `buf` ends before it. Errors as soon as a byte shows the line is no length.
pub(super) fn length(buf: &[u8], at: usize) -> Result<Option<(Option<usize>, usize)>, Malformed> {
    let rest = buf.get(at..).unwrap_or_default();
    let negative = rest.first() == Some(&b'-');
    let digits = usize::from(negative);
    let mut value = 0usize;
    let mut i = digits;
    loop {
        match rest.get(i) {
            None => return Ok(None),
            Some(&d) if d.is_ascii_digit() => {
                // The only negative length is -1.
                if negative && (i > digits || d != b'1') {
                    return Err(NOT_A_LENGTH);
                }
                value = value
                    .checked_mul(10)
                    .and_then(|v| v.checked_add(usize::from(d - b'0')))
                    .ok_or(TOO_LARGE)?;
                i += 1;
            }
            Some(b'\r') if i > digits => break,
            Some(_) => return Err(NOT_A_LENGTH),
        }
    }
    match rest.get(i + 1) {
        None => Ok(None),
        Some(b'\n') => Ok(Some(((!negative).then_some(value), at + i + 2))),
        Some(_) => Err(NO_CRLF),
    }
}

/// The index past the CRLF that must follow the `len` bytes of payload starting at `at`;
/// `None` if `buf` ends before it.
fn payload_end(buf: &[u8], at: usize, len: usize) -> Result<Option<usize>, Malformed> {
    let end = at.checked_add(len).ok_or(TOO_LARGE)?;
    match buf.get(end) {
        None => return Ok(None),
        Some(b'\r') => {}
        Some(_) => return Err(NO_CRLF_AFTER_PAYLOAD),
    }
    match buf.get(end + 1) {
        None => Ok(None),
        Some(b'\n') => Ok(Some(end + 2)),
        Some(_) => Err(NO_CRLF_AFTER_PAYLOAD),
    }
}

#[cfg(test)]
mod tests;
