//! Percentiles of latency samples, durations in microseconds, ratios.

use std::time::Duration;

/// `samples` in ascending order, ready for [`percentile`].
pub(crate) fn sorted(mut samples: Vec<Duration>) -> Vec<Duration> {
    samples.sort();
    samples
}

/// The sample at rank `p` (0.0 to 1.0, nearest rank) of `sorted`; zero when there is none.
pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The median of `sorted`.
pub(crate) fn p50(sorted: &[Duration]) -> Duration {
    percentile(sorted, 0.5)
}

/// The median of `values` (the lower middle one of an even count); zero when empty.
pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values
        .get(values.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(0.0)
}

/// `d` in whole microseconds, e.g. `172 us`.
pub(crate) fn us(d: Duration) -> String {
    format!("{:.0} us", d.as_secs_f64() * 1e6)
}

/// How many times `base` fits in `ours`.
pub(crate) fn ratio(ours: Duration, base: Duration) -> f64 {
    ours.as_secs_f64() / base.as_secs_f64()
}

/// A ratio as the table prints it, e.g. `1.23x`.
pub(crate) fn times(ratio: f64) -> String {
    format!("{ratio:.2}x")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let ms = |n| Duration::from_millis(n);
        let samples = sorted((1..=101).rev().map(ms).collect());
        assert_eq!(p50(&samples), ms(51));
        assert_eq!(percentile(&samples, 0.99), ms(100));
        assert_eq!(percentile(&samples, 1.0), ms(101));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn figures_print_as_in_the_table() {
        assert_eq!(us(Duration::from_nanos(171_600)), "172 us");
        assert_eq!(
            times(ratio(
                Duration::from_micros(172),
                Duration::from_micros(140)
            )),
            "1.23x"
        );
    }
}
