//! SVG plots of a run (plotters, SVG backend: text is left to the viewer,
//! so no font library is needed): the TTFT and ITL distributions as
//! histograms, and output tokens per second over the run.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};
use plotters::prelude::*;

use crate::client::Outcome;
use crate::metrics::{Record, tokens_per_second};

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

/// A 40-bin histogram of `values` (an empty plot when there are none).
fn histogram(path: &Path, title: &str, x_label: &str, values: &[f64]) -> anyhow::Result<()> {
    const BINS: usize = 40;
    let max = values.iter().copied().fold(0.0, f64::max).max(1e-3);
    let width = max / BINS as f64;
    let mut counts = [0u32; BINS];
    for &v in values {
        counts[((v / width) as usize).min(BINS - 1)] += 1;
    }
    let top = counts.iter().copied().max().unwrap_or(0).max(1);
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{title} ({} samples)", values.len()),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..max * 1.02, 0u32..top + top / 10 + 1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("requests / gaps")
        .draw()
        .map_err(err)?;
    chart
        .draw_series(counts.iter().enumerate().map(|(i, &c)| {
            let x0 = i as f64 * width;
            Rectangle::new([(x0, 0), (x0 + width, c)], BLUE.mix(0.6).filled())
        }))
        .map_err(err)?;
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
