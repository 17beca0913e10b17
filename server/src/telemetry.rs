//! The server's Prometheus metrics, on the `prometheus` crate. Two kinds
//! of family, one exposition:
//!
//! - **recorded where events happen**: counters and histograms a part of
//!   the server owns and increments at the event (a request answered, a
//!   worker lost, a cache lookup); the same values are read back by the
//!   console and the admin API, so nothing is counted twice;
//! - **read when scraped** (`Scraped`): gauges and totals that live state
//!   already holds (the connected workers, each engine's queues, KV and
//!   latency histograms, a cache's sizes), built fresh for each scrape, so
//!   a worker that left or a model that was unloaded leaves no series.
//!
//! `expose` gathers both, sorted by name, in the Prometheus text format
//! 0.0.4. Each server's metrics are its own values, never a process-global
//! registry: two servers in one process (the in-process tests) count apart.
//! The names, types and labels are pinned by `docs/reference/metrics.md`
//! (`server/tests/api/metrics_reference.rs`).

use prometheus::proto::{self, MetricType};
use prometheus::{HistogramOpts, Opts, TextEncoder};

pub use prometheus::core::Collector;
pub use prometheus::proto::MetricFamily;
pub use prometheus::{Counter, CounterVec, Gauge, Histogram, IntCounter, IntCounterVec};

/// A counter of events (the name is a literal: a bad one is a bug that
/// every test that builds the owner finds).
pub fn int_counter(name: &str, help: &str) -> IntCounter {
    IntCounter::with_opts(Opts::new(name, help)).expect("a valid metric name and help")
}

/// A counter of events by `labels`.
pub fn int_counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("a valid metric name and labels")
}

/// A counter of an amount that is not whole (seconds).
pub fn counter(name: &str, help: &str) -> Counter {
    Counter::with_opts(Opts::new(name, help)).expect("a valid metric name and help")
}

/// A counter of an amount that is not whole, by `labels`.
pub fn counter_vec(name: &str, help: &str, labels: &[&str]) -> CounterVec {
    CounterVec::new(Opts::new(name, help), labels).expect("a valid metric name and labels")
}

/// A value set where it changes.
pub fn gauge(name: &str, help: &str) -> Gauge {
    Gauge::with_opts(Opts::new(name, help)).expect("a valid metric name and help")
}

/// A distribution over fixed bucket bounds.
pub fn histogram(name: &str, help: &str, buckets: &[f64]) -> Histogram {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
        .expect("a valid metric name and increasing buckets")
}

/// The families of everything `parts` collect, as one exposition: empty
/// families left out, families of one name merged, sorted by name.
pub fn expose(parts: impl IntoIterator<Item = Vec<MetricFamily>>) -> String {
    let mut by_name: std::collections::BTreeMap<String, MetricFamily> = Default::default();
    for mut f in parts.into_iter().flatten() {
        if f.get_metric().is_empty() {
            continue;
        }
        match by_name.get_mut(f.name()) {
            Some(into) => into.mut_metric().extend(f.take_metric()),
            None => {
                by_name.insert(f.name().to_string(), f);
            }
        }
    }
    let families: Vec<MetricFamily> = by_name.into_values().collect();
    TextEncoder::new()
        .encode_to_string(&families)
        .unwrap_or_else(|e| format!("# the exposition failed: {e}\n"))
}

/// `families` with each series' labels in `order` (the crate sorts them
/// by name; an exposition keeps the order it always had).
pub fn in_order(mut families: Vec<MetricFamily>, order: &[&str]) -> Vec<MetricFamily> {
    let rank = |name: &str| order.iter().position(|o| *o == name).unwrap_or(order.len());
    for f in &mut families {
        for m in f.mut_metric() {
            let mut labels = m.take_label();
            labels.sort_by_key(|l| rank(l.name()));
            m.set_label(labels);
        }
    }
    families
}

/// What collectors give: every family of each.
pub fn collect(parts: &[&dyn Collector]) -> Vec<MetricFamily> {
    parts.iter().flat_map(|c| c.collect()).collect()
}

/// One family read from live state at scrape time.
#[derive(Debug)]
pub struct Scraped(MetricFamily);

impl Scraped {
    fn new(name: &str, help: &str, kind: MetricType) -> Self {
        let mut f = MetricFamily::default();
        f.set_name(name.to_string());
        f.set_help(help.to_string());
        f.set_field_type(kind);
        Self(f)
    }

    pub fn gauge(name: &str, help: &str) -> Self {
        Self::new(name, help, MetricType::GAUGE)
    }

    /// A total that only grows, kept by its owner (an engine's tokens).
    pub fn counter(name: &str, help: &str) -> Self {
        Self::new(name, help, MetricType::COUNTER)
    }

    /// A counter (`total`) or a gauge, as a table of families says.
    pub fn scalar(name: &str, help: &str, total: bool) -> Self {
        if total {
            Self::counter(name, help)
        } else {
            Self::gauge(name, help)
        }
    }

    pub fn histogram(name: &str, help: &str) -> Self {
        Self::new(name, help, MetricType::HISTOGRAM)
    }

    fn metric(labels: &[(&str, &str)]) -> proto::Metric {
        let pairs = labels
            .iter()
            .map(|(k, v)| {
                let mut p = proto::LabelPair::default();
                p.set_name(k.to_string());
                p.set_value(v.to_string());
                p
            })
            .collect();
        proto::Metric::from_label(pairs)
    }

    /// One series of a gauge or counter family.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: f64) -> &mut Self {
        let mut m = Self::metric(labels);
        if self.0.get_field_type() == MetricType::COUNTER {
            let mut c = proto::Counter::default();
            c.set_value(value);
            m.set_counter(c);
        } else {
            let mut g = proto::Gauge::default();
            g.set_value(value);
            m.set_gauge(g);
        }
        self.0.mut_metric().push(m);
        self
    }

    /// One series of a histogram family: per bucket counts (not
    /// cumulative, the last one past every bound), and their sum.
    pub fn distribution(
        &mut self,
        labels: &[(&str, &str)],
        bounds: &[f64],
        counts: &[u64],
        sum: f64,
    ) -> &mut Self {
        let mut h = proto::Histogram::default();
        let mut cumulative = 0;
        let buckets = bounds
            .iter()
            .zip(counts)
            .map(|(&bound, &n)| {
                cumulative += n;
                let mut b = proto::Bucket::default();
                b.set_upper_bound(bound);
                b.set_cumulative_count(cumulative);
                b
            })
            .collect();
        h.set_bucket(buckets);
        h.set_sample_count(counts.iter().sum());
        h.set_sample_sum(sum);
        let mut m = Self::metric(labels);
        m.set_histogram(h);
        self.0.mut_metric().push(m);
        self
    }

    pub fn done(self) -> MetricFamily {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_with_inf_sum_and_count() {
        let mut h = Scraped::histogram("x", "An x.");
        h.distribution(&[("model_name", "m")], &[0.1, 1.0], &[2, 1, 3], 7.5);
        let text = expose([vec![h.done()]]);
        assert_eq!(
            text,
            "# HELP x An x.\n# TYPE x histogram\n\
             x_bucket{model_name=\"m\",le=\"0.1\"} 2\n\
             x_bucket{model_name=\"m\",le=\"1\"} 3\n\
             x_bucket{model_name=\"m\",le=\"+Inf\"} 6\n\
             x_sum{model_name=\"m\"} 7.5\n\
             x_count{model_name=\"m\"} 6\n"
        );
    }

    #[test]
    fn label_values_are_escaped_and_families_sorted_and_merged() {
        let c = int_counter_vec("b_total", "Bs.", &["k"]);
        c.with_label_values(&["a\"b\\c"]).inc();
        let mut g = Scraped::gauge("a", "As.");
        g.sample(&[], 1.5);
        let mut g2 = Scraped::gauge("a", "As.");
        g2.sample(&[("w", "x")], 2.0);
        let empty = Scraped::gauge("c", "Cs.");
        let text = expose([c.collect(), vec![g.done(), g2.done(), empty.done()]]);
        let two = int_counter_vec("c_total", "Cs.", &["z", "a"]);
        two.with_label_values(&["1", "2"]).inc();
        assert_eq!(
            expose([in_order(two.collect(), &["z", "a"])]),
            "# HELP c_total Cs.\n# TYPE c_total counter\nc_total{z=\"1\",a=\"2\"} 1\n"
        );
        assert_eq!(
            text,
            "# HELP a As.\n# TYPE a gauge\na 1.5\na{w=\"x\"} 2\n\
             # HELP b_total Bs.\n# TYPE b_total counter\nb_total{k=\"a\\\"b\\\\c\"} 1\n"
        );
    }
}
