//! SVG plots of a run (plotters, SVG backend: text is left to the viewer,
//! so no font library is needed): the TTFT and ITL distributions as
//! histograms over a logarithmic time axis (latencies span decades: a
//! batched step and a stall in one picture) with the p50, p90 and p99
//! marked, and output tokens per second over the run.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};
use plotters::prelude::*;

use crate::client::Outcome;
use crate::metrics::{Record, percentile, tokens_per_second};

/// Writes the plots into `dir` (created if missing); returns their paths.
pub fn write_all(dir: &Path, records: &[Record]) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let ms = |d: &std::time::Duration| d.as_secs_f64() * 1e3;
    let ok = records.iter().filter_map(|r| match &r.outcome {
        Outcome::Success(x) => Some(x),
        Outcome::Rejected { .. } | Outcome::Failed(_) | Outcome::Cancelled(_) => None,
    });
    let ttft: Vec<f64> = ok.clone().map(|x| ms(&x.ttft)).collect();
    let itl: Vec<f64> = ok.flat_map(|x| x.itl.iter().map(ms)).collect();
    let tps = tokens_per_second(records);
    let paths = vec![
        dir.join("ttft.svg"),
        dir.join("itl.svg"),
        dir.join("throughput.svg"),
    ];
    histogram(&paths[0], "Time to first token", "TTFT (ms)", &ttft)?;
    histogram(&paths[1], "Inter-token latency", "ITL (ms)", &itl)?;
    over_time(&paths[2], &tps)?;
    Ok(paths)
}

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("plotting failed: {e}")
}

/// Bins of a log-scale histogram.
const BINS: usize = 40;
/// The percentiles marked on a histogram.
const MARKED: [f64; 3] = [50.0, 90.0, 99.0];

/// Log-spaced bin edges over `values`' range (at least a decade, from
/// 0.01 ms), and the count in each bin.
fn log_bins(values: &[f64]) -> (Vec<f64>, Vec<u32>) {
    let lo = values
        .iter()
        .copied()
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min)
        .max(0.01);
    let lo = if lo.is_finite() { lo } else { 0.01 };
    let hi = values.iter().copied().fold(0.0, f64::max).max(lo * 10.0);
    let step = (hi / lo).ln() / BINS as f64;
    let edges: Vec<f64> = (0..=BINS).map(|i| lo * (step * i as f64).exp()).collect();
    let mut counts = vec![0u32; BINS];
    for &v in values {
        let i = ((v.max(lo) / lo).ln() / step) as usize;
        counts[i.min(BINS - 1)] += 1;
    }
    (edges, counts)
}

/// A histogram of `values` over a log time axis, with the p50, p90 and
/// p99 drawn as lines (an empty plot when there are no values).
fn histogram(path: &Path, title: &str, x_label: &str, values: &[f64]) -> anyhow::Result<()> {
    let (edges, counts) = log_bins(values);
    let top = counts.iter().copied().max().unwrap_or(0).max(1);
    let (lo, hi) = (edges[0], edges[BINS]);
    let marks: Vec<(f64, f64)> = if values.is_empty() {
        Vec::new()
    } else {
        MARKED.iter().map(|&p| (p, percentile(values, p))).collect()
    };
    let caption = marks
        .iter()
        .map(|(p, v)| format!("p{p} {v:.1}"))
        .collect::<Vec<_>>()
        .join(", ");
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{title} ({} samples; {caption} ms)", values.len()),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((lo..hi).log_scale(), 0u32..top + top / 10 + 1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(format!("{x_label}, log scale"))
        .y_desc("requests / gaps")
        .draw()
        .map_err(err)?;
    chart
        .draw_series(counts.iter().enumerate().map(|(i, &c)| {
            Rectangle::new([(edges[i], 0), (edges[i + 1], c)], BLUE.mix(0.6).filled())
        }))
        .map_err(err)?;
    for (p, v) in marks {
        let x = v.clamp(lo, hi);
        chart
            .draw_series(LineSeries::new([(x, 0), (x, top)], RED.stroke_width(2)))
            .map_err(err)?
            .label(format!("p{p}: {v:.1} ms"));
    }
    root.present().map_err(err)
}

/// Output tokens in each second of the run.
fn over_time(path: &Path, tps: &[f64]) -> anyhow::Result<()> {
    let top = tps.iter().copied().fold(0.0, f64::max).max(1.0);
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Output throughput over time", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..(tps.len().max(1)) as f64, 0.0..top * 1.1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("time since start (s)")
        .y_desc("output tokens / s")
        .draw()
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            tps.iter().enumerate().map(|(i, &v)| (i as f64 + 0.5, v)),
            &RED,
        ))
        .map_err(err)?;
    root.present().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_bins_span_decades_and_count_every_value() {
        let values = [0.5, 1.0, 2.0, 10.0, 100.0, 5_000.0, 0.0];
        let (edges, counts) = log_bins(&values);
        assert_eq!(edges.len(), BINS + 1);
        assert!(edges.windows(2).all(|w| w[1] > w[0]), "{edges:?}");
        assert!((edges[0] - 0.5).abs() < 1e-9 && (edges[BINS] - 5_000.0).abs() < 1e-6);
        assert_eq!(counts.iter().sum::<u32>() as usize, values.len());
        let (edges, counts) = log_bins(&[]);
        assert!(edges[BINS] >= edges[0] * 10.0 && counts.iter().all(|&c| c == 0));
    }

    #[test]
    fn a_histogram_marks_its_percentiles() {
        let dir = std::env::temp_dir().join(format!("synor-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("itl.svg");
        let values: Vec<f64> = (1..=200).map(|i| i as f64 * 0.7).collect();
        histogram(&path, "Inter-token latency", "ITL (ms)", &values).expect("plot");
        let svg = std::fs::read_to_string(&path).expect("svg");
        assert!(
            svg.contains("p99") && svg.contains("log scale"),
            "the marks and the axis"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
