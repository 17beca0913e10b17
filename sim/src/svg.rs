//! The report's charts as SVG, written by hand (no plotting library):
//! utilization per processor type over virtual time for one run, and the
//! placement policies side by side (goodput and what users paid per
//! million tokens).

use std::fmt::Write;

use crate::report::Report;

const W: f64 = 720.0;
const H: f64 = 320.0;
const PAD: f64 = 48.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn frame(title: &str, y_label: &str) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"11\">\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
         <text x=\"{PAD}\" y=\"18\" font-size=\"13\">{}</text>\
         <text x=\"12\" y=\"{}\" transform=\"rotate(-90 12 {})\">{}</text>\
         <line x1=\"{PAD}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\
         <line x1=\"{PAD}\" y1=\"{PAD}\" x2=\"{PAD}\" y2=\"{}\" stroke=\"black\"/>",
        escape(title),
        H / 2.0,
        H / 2.0,
        escape(y_label),
        H - PAD,
        W - PAD,
        H - PAD,
        H - PAD,
    );
    s
}

/// Utilization (sequences over capacity, online providers) per processor
/// type over the run's hours.
pub fn utilization(r: &Report) -> String {
    let mut s = frame(
        &format!("Utilization by processor type ({})", r.policy),
        "utilization %",
    );
    let hours = r.hours.max(1e-9);
    let x = |h: f64| PAD + (W - 2.0 * PAD) * h / hours;
    let y = |u: f64| H - PAD - (H - 2.0 * PAD) * u.clamp(0.0, 1.0);
    for (i, k) in r.kinds.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points: Vec<String> = k
            .samples
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.at_h), y(p.utilization)))
            .collect();
        let _ = write!(
            s,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>\
             <text x=\"{}\" y=\"{}\" fill=\"{color}\">{}</text>",
            points.join(" "),
            W - PAD + 4.0,
            PAD + 14.0 * i as f64,
            escape(&k.kind)
        );
    }
    for t in 0..=4 {
        let f = f64::from(t) / 4.0;
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.0}</text><text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{:.1} h</text>",
            PAD - 4.0,
            y(f) + 4.0,
            f * 100.0,
            x(f * hours),
            H - PAD + 16.0,
            f * hours
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Goodput (bars) and users' cost per million tokens (labels) per policy.
pub fn policies(reports: &[Report]) -> String {
    let mut s = frame(
        "Placement policies: goodput, and what users paid per million tokens",
        "goodput %",
    );
    let n = reports.len().max(1) as f64;
    let slot = (W - 2.0 * PAD) / n;
    for (i, r) in reports.iter().enumerate() {
        let h = (H - 2.0 * PAD) * r.goodput.clamp(0.0, 1.0);
        let x0 = PAD + slot * i as f64 + slot * 0.2;
        let _ = write!(
            s,
            "<rect x=\"{x0:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{}\"/>\
             <text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{:.1}% · {:.4}/Mtok</text>",
            H - PAD - h,
            slot * 0.6,
            COLORS[i % COLORS.len()],
            x0 + slot * 0.3,
            H - PAD + 16.0,
            escape(&r.policy),
            x0 + slot * 0.3,
            H - PAD - h - 6.0,
            r.goodput * 100.0,
            r.money.user_cost_per_mtok
        );
    }
    s.push_str("</svg>\n");
    s
}
