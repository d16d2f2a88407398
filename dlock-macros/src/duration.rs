//! Durations written as string literals: `"250ms"`, `"30s"`, `"2m"`, `"1h"`.
//!
//! The grammar is deliberately small: a non-negative decimal integer immediately
//! followed by one unit. No fractions, no signs, no spaces, no compound forms
//! such as `"1m30s"` (write `"90s"`). The value is converted to whole
//! milliseconds at compile time, so the generated code is a single
//! `Duration::from_millis(N)`.

/// Units accepted after the number, with their length in milliseconds.
///
/// `ms` comes before `s` and `m` so that the longest suffix wins.
const UNITS: [(&str, u64); 4] = [("ms", 1), ("s", 1_000), ("m", 60_000), ("h", 3_600_000)];

/// Why a duration string was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DurationError {
    /// Not `<digits><unit>`.
    Invalid,
    /// Does not fit in `u64` milliseconds.
    TooLarge,
}

impl DurationError {
    /// The compile error for `text`, the literal's value as written.
    pub(crate) fn message(&self, text: &str) -> String {
        match self {
            DurationError::Invalid => format!(
                "invalid duration {text:?}: expected a number followed by ms, s, m or h, e.g. \"30s\""
            ),
            DurationError::TooLarge => format!(
                "duration {text:?} is too large: it must fit in {} milliseconds",
                u64::MAX
            ),
        }
    }
}

/// Parses `"250ms" | "30s" | "2m" | "1h"` into milliseconds.
pub(crate) fn parse_millis(text: &str) -> Result<u64, DurationError> {
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err(DurationError::Invalid);
    }
    let per_unit = UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|&(_, millis)| millis)
        .ok_or(DurationError::Invalid)?;
    // Only ASCII digits remain, so the only way `parse` fails is overflow.
    let count: u64 = digits.parse().map_err(|_| DurationError::TooLarge)?;
    count.checked_mul(per_unit).ok_or(DurationError::TooLarge)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod tests {
    use super::{DurationError, parse_millis};

    #[test]
    fn accepts_every_unit() {
        assert_eq!(parse_millis("250ms"), Ok(250));
        assert_eq!(parse_millis("30s"), Ok(30_000));
        assert_eq!(parse_millis("2m"), Ok(120_000));
        assert_eq!(parse_millis("1h"), Ok(3_600_000));
    }

    #[test]
    fn accepts_zero_and_leading_zeros() {
        assert_eq!(parse_millis("0s"), Ok(0));
        assert_eq!(parse_millis("0ms"), Ok(0));
        assert_eq!(parse_millis("007s"), Ok(7_000));
    }

    #[test]
    fn rejects_malformed_text() {
        for text in [
            "", "30", "s", "ms", "30x", "30 s", " 30s", "30s ", "-1s", "+1s", "1.5s", "1m30s",
            "30S", "30sec", "1_000ms", "30µs", "٣s",
        ] {
            assert_eq!(parse_millis(text), Err(DurationError::Invalid), "{text:?}");
        }
    }

    #[test]
    fn rejects_overflow() {
        let max = u64::MAX;
        assert_eq!(parse_millis(&format!("{max}ms")), Ok(max));
        assert_eq!(
            parse_millis("18446744073709551616ms"),
            Err(DurationError::TooLarge)
        );
        assert_eq!(
            parse_millis(&format!("{}s", max / 1_000 + 1)),
            Err(DurationError::TooLarge)
        );
        assert_eq!(
            parse_millis("99999999999999999999999h"),
            Err(DurationError::TooLarge)
        );
        assert_eq!(
            parse_millis(&format!("{}s", max / 1_000)),
            Ok(max / 1_000 * 1_000)
        );
    }

    #[test]
    fn messages_follow_rustc_voice() {
        assert_eq!(
            DurationError::Invalid.message("30x"),
            "invalid duration \"30x\": expected a number followed by ms, s, m or h, e.g. \"30s\""
        );
        assert!(
            DurationError::TooLarge
                .message("99999999999999999999h")
                .starts_with("duration \"99999999999999999999h\" is too large")
        );
    }
}
