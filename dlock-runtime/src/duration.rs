//! Durations written as in the attribute: `250ms`, `30s`, `2m`, `1h`.

use std::time::Duration;

/// Parses a whole number followed by `ms`, `s`, `m` or `h`; `None` for anything else or on
/// overflow.
pub(crate) fn parse(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let ms_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return None,
    };
    n.checked_mul(ms_per_unit).map(Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_four_units() {
        assert_eq!(parse("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse("0s"), Some(Duration::ZERO));
    }

    #[test]
    fn rejects_the_rest() {
        for bad in [
            "",
            "30",
            "s",
            "30x",
            "-1s",
            "1.5s",
            "30 s",
            "99999999999999999999h",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
