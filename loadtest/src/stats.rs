//! Summary statistics over request timings: mean, median, std and
//! percentiles (linear interpolation between closest ranks, as numpy).

use std::time::Duration;

/// Summary of one metric, in milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub mean: f64,
    pub median: f64,
    pub std: f64,
    /// (percentile, value) pairs.
    pub percentiles: Vec<(f64, f64)>,
}

/// Summarises `values` (durations); `None` when empty.
pub fn summarize(values: &[Duration], percentiles: &[f64]) -> Option<Summary> {
    if values.is_empty() {
        return None;
    }
    let mut ms: Vec<f64> = values.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    let n = ms.len() as f64;
    let mean = ms.iter().sum::<f64>() / n;
    let std = (ms.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
    Some(Summary {
        mean,
        median: percentile(&ms, 50.0),
        std,
        percentiles: percentiles
            .iter()
            .map(|&p| (p, percentile(&ms, p)))
            .collect(),
    })
}

/// The `p`th percentile of sorted `xs`, interpolating linearly.
pub fn percentile(xs: &[f64], p: f64) -> f64 {
    let rank = (p / 100.0).clamp(0.0, 1.0) * (xs.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    xs[lo] + (xs[hi] - xs[lo]) * (rank - lo as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let xs = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&xs, 50.0), 2.5);
        assert_eq!(percentile(&xs, 0.0), 1.0);
        assert_eq!(percentile(&xs, 100.0), 4.0);
        assert!((percentile(&xs, 90.0) - 3.7).abs() < 1e-12);
    }

    #[test]
    fn summary_of_durations_is_in_milliseconds() {
        let d = [Duration::from_millis(10), Duration::from_millis(30)];
        let s = summarize(&d, &[99.0]).expect("non-empty");
        assert_eq!(s.mean, 20.0);
        assert_eq!(s.std, 10.0);
        assert!(summarize(&[], &[50.0]).is_none());
    }
}
