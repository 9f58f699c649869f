//! Prometheus metrics without a client library: counters, gauges and histograms with fixed label
//! sets, kept in a [`Registry`] and rendered in the text exposition format 0.0.4 (what
//! Prometheus scrapes from `GET /metrics`, served with [`CONTENT_TYPE`]).
//!
//! A series is created once, with all its label values, and updated through its handle
//! ([`Counter`], [`Gauge`], [`Histogram`]): updates are an atomic or one short lock, never a
//! lookup by labels, so the engine thread can record every token. Numbers are written as
//! Python's `prometheus_client` writes them (`5.0`, `le="0.25"`, `+Inf`), so series scraped from
//! rlhost and from vLLM carry identical label values.
//!
//! This module must never do I/O or know what it measures: the engine defines its metrics
//! (`crate::engine::metrics`) and the servers serve the text.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The `Content-Type` of the text exposition format 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Why a metric or series could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetricError {
    /// A metric name outside `[a-zA-Z_:][a-zA-Z0-9_:]*`.
    #[error(
        "`{0}` is not a valid metric name: use letters, digits, `_` and `:`, not starting with a digit"
    )]
    Name(String),
    /// A label name outside `[a-zA-Z_][a-zA-Z0-9_]*`, starting with `__`, or `le` on a histogram.
    #[error("metric `{metric}`: `{label}` is not a valid label name here")]
    Label {
        /// The metric.
        metric: String,
        /// The label.
        label: String,
    },
    /// The name is registered already with another type, help text or set of label names.
    #[error(
        "metric `{0}` is registered already with another type, help text or label names; a family's series must agree"
    )]
    Conflict(String),
    /// The very same label values are registered twice.
    #[error("metric `{metric}` already has a series with labels {labels}")]
    Duplicate {
        /// The metric.
        metric: String,
        /// The labels, as they would be rendered.
        labels: String,
    },
    /// Histogram bucket bounds that are empty, not finite or not strictly increasing.
    #[error(
        "histogram `{0}`: bucket bounds must be finite and strictly increasing (+Inf is added)"
    )]
    Buckets(String),
}

/// An `f64` updated atomically (its bits in an `AtomicU64`).
#[derive(Debug, Default)]
struct AtomicF64(AtomicU64);

impl AtomicF64 {
    fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }

    fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }

    fn add(&self, v: f64) {
        let _ = self
            .0
            .try_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + v).to_bits())
            });
    }
}

/// A value that only goes up (requests served, tokens generated). Cheap to clone; clones share
/// the value.
#[derive(Debug, Clone, Default)]
pub struct Counter(Arc<AtomicF64>);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.0.add(1.0);
    }

    /// Adds `v`; a negative or NaN `v` is ignored (a counter never goes down).
    pub fn inc_by(&self, v: f64) {
        if v > 0.0 {
            self.0.add(v);
        }
    }

    /// The current value: the total added through this counter and its clones.
    pub fn get(&self) -> f64 {
        self.0.get()
    }
}

/// A value that goes up and down (requests running, cache usage). Cheap to clone; clones share
/// the value.
#[derive(Debug, Clone, Default)]
pub struct Gauge(Arc<AtomicF64>);

impl Gauge {
    /// Sets the value.
    pub fn set(&self, v: f64) {
        self.0.set(v);
    }

    /// Adds `v` (negative to subtract).
    pub fn add(&self, v: f64) {
        self.0.add(v);
    }

    /// The current value, as every clone sees it.
    pub fn get(&self) -> f64 {
        self.0.get()
    }
}

#[derive(Debug)]
struct HistogramState {
    /// Observations per bucket (not cumulative); the last is the `+Inf` bucket.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

/// Observations counted in buckets by upper bound, with their sum and count. Cheap to clone;
/// clones share the state. One lock per observation, so a scrape never sees a count that
/// disagrees with its buckets.
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: Arc<[f64]>,
    state: Arc<Mutex<HistogramState>>,
}

/// What a [`Histogram`] holds at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// `(upper bound, observations <= it)`, cumulative, `+Inf` last.
    pub buckets: Vec<(f64, u64)>,
    /// Sum of the observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Histogram {
    fn new(bounds: &[f64]) -> Self {
        Self {
            bounds: bounds.into(),
            state: Arc::new(Mutex::new(HistogramState {
                counts: vec![0; bounds.len() + 1],
                sum: 0.0,
                count: 0,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HistogramState> {
        // The state is consistent after every statement that changes it: a panic elsewhere
        // while it was held cannot leave it half-updated.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records one observation; NaN is ignored.
    pub fn observe(&self, v: f64) {
        if v.is_nan() {
            return;
        }
        let i = self.bounds.partition_point(|&b| b < v);
        let mut s = self.lock();
        s.counts[i] += 1;
        s.sum += v;
        s.count += 1;
    }

    /// The buckets (cumulative), sum and count now.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let s = self.lock();
        let mut acc = 0;
        let buckets = self
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(&s.counts)
            .map(|(b, &c)| {
                acc += c;
                (b, acc)
            })
            .collect();
        HistogramSnapshot {
            buckets,
            sum: s.sum,
            count: s.count,
        }
    }
}

/// The kind of a metric family (its `# TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MetricKind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Bucketed observations.
    Histogram,
}

impl MetricKind {
    fn as_str(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        }
    }
}

#[derive(Debug)]
enum Value {
    Counter(Counter),
    Gauge(Gauge),
    Histogram(Histogram),
}

#[derive(Debug)]
struct Series {
    /// Rendered label pairs without braces (`a="x",b="y"`), empty without labels.
    labels: String,
    value: Value,
}

#[derive(Debug)]
struct Family {
    name: String,
    help: String,
    kind: MetricKind,
    label_names: Vec<String>,
    series: Vec<Series>,
}

/// Metric families in registration order, each a name, help text, type and its series.
/// Registering a name again with new label values adds a series to its family.
#[derive(Debug, Default)]
pub struct Registry {
    families: Mutex<Vec<Family>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// A counter series of `name` (conventionally ending in `_total`) with `labels`.
    pub fn counter(
        &self,
        name: &str,
        help: &str,
        labels: &[(&str, &str)],
    ) -> Result<Counter, MetricError> {
        let c = Counter::default();
        self.add(
            name,
            help,
            MetricKind::Counter,
            labels,
            Value::Counter(c.clone()),
        )?;
        Ok(c)
    }

    /// A gauge series of `name` with `labels`, starting at 0.
    pub fn gauge(
        &self,
        name: &str,
        help: &str,
        labels: &[(&str, &str)],
    ) -> Result<Gauge, MetricError> {
        let g = Gauge::default();
        self.add(
            name,
            help,
            MetricKind::Gauge,
            labels,
            Value::Gauge(g.clone()),
        )?;
        Ok(g)
    }

    /// A histogram series of `name` with `labels` and bucket upper bounds `buckets` (finite,
    /// strictly increasing; the `+Inf` bucket is implied).
    pub fn histogram(
        &self,
        name: &str,
        help: &str,
        labels: &[(&str, &str)],
        buckets: &[f64],
    ) -> Result<Histogram, MetricError> {
        let increasing = buckets.windows(2).all(|w| w[0] < w[1]);
        if buckets.is_empty() || !increasing || buckets.iter().any(|b| !b.is_finite()) {
            return Err(MetricError::Buckets(name.to_string()));
        }
        if labels.iter().any(|(k, _)| *k == "le") {
            return Err(MetricError::Label {
                metric: name.to_string(),
                label: "le".into(),
            });
        }
        let h = Histogram::new(buckets);
        self.add(
            name,
            help,
            MetricKind::Histogram,
            labels,
            Value::Histogram(h.clone()),
        )?;
        Ok(h)
    }

    fn add(
        &self,
        name: &str,
        help: &str,
        kind: MetricKind,
        labels: &[(&str, &str)],
        value: Value,
    ) -> Result<(), MetricError> {
        if !valid_name(name, true) {
            return Err(MetricError::Name(name.to_string()));
        }
        if let Some((bad, _)) = labels
            .iter()
            .find(|(k, _)| !valid_name(k, false) || k.starts_with("__"))
        {
            return Err(MetricError::Label {
                metric: name.to_string(),
                label: bad.to_string(),
            });
        }
        let label_names: Vec<String> = labels.iter().map(|(k, _)| k.to_string()).collect();
        let mut rendered = String::new();
        for (i, (k, v)) in labels.iter().enumerate() {
            if label_names[..i].iter().any(|n| n == k) {
                return Err(MetricError::Label {
                    metric: name.to_string(),
                    label: k.to_string(),
                });
            }
            if i > 0 {
                rendered.push(',');
            }
            let _ = write!(rendered, "{k}=\"{}\"", escape_label_value(v));
        }
        let series = Series {
            labels: rendered,
            value,
        };
        let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        match families.iter_mut().find(|f| f.name == name) {
            Some(f) => {
                if f.kind != kind || f.help != help || f.label_names != label_names {
                    return Err(MetricError::Conflict(name.to_string()));
                }
                if f.series.iter().any(|s| s.labels == series.labels) {
                    return Err(MetricError::Duplicate {
                        metric: name.to_string(),
                        labels: format!("{{{}}}", series.labels),
                    });
                }
                f.series.push(series);
            }
            None => families.push(Family {
                name: name.to_string(),
                help: help.to_string(),
                kind,
                label_names,
                series: vec![series],
            }),
        }
        Ok(())
    }

    /// Every family in the text exposition format 0.0.4: `# HELP`, `# TYPE`, then one line per
    /// sample (a histogram's cumulative `_bucket{le=…}` lines, `+Inf` last, then `_sum` and
    /// `_count`).
    pub fn render(&self) -> String {
        let families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        for f in families.iter() {
            let _ = writeln!(out, "# HELP {} {}", f.name, escape_help(&f.help));
            let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind.as_str());
            for s in &f.series {
                match &s.value {
                    Value::Counter(c) => sample(&mut out, &f.name, "", &s.labels, None, c.get()),
                    Value::Gauge(g) => sample(&mut out, &f.name, "", &s.labels, None, g.get()),
                    Value::Histogram(h) => {
                        let snap = h.snapshot();
                        for (bound, n) in &snap.buckets {
                            let le = format_float(*bound);
                            sample(
                                &mut out,
                                &f.name,
                                "_bucket",
                                &s.labels,
                                Some(&le),
                                *n as f64,
                            );
                        }
                        sample(&mut out, &f.name, "_sum", &s.labels, None, snap.sum);
                        sample(
                            &mut out,
                            &f.name,
                            "_count",
                            &s.labels,
                            None,
                            snap.count as f64,
                        );
                    }
                }
            }
        }
        out
    }
}

/// One sample line: `name{labels,le="…"} value`.
fn sample(out: &mut String, name: &str, suffix: &str, labels: &str, le: Option<&str>, v: f64) {
    out.push_str(name);
    out.push_str(suffix);
    if !labels.is_empty() || le.is_some() {
        out.push('{');
        out.push_str(labels);
        if let Some(le) = le {
            if !labels.is_empty() {
                out.push(',');
            }
            let _ = write!(out, "le=\"{le}\"");
        }
        out.push('}');
    }
    out.push(' ');
    out.push_str(&format_float(v));
    out.push('\n');
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*` for metric names, the same without `:` for label names.
fn valid_name(s: &str, colon: bool) -> bool {
    let ok = |c: char, first: bool| {
        c.is_ascii_alphabetic() || c == '_' || (colon && c == ':') || (!first && c.is_ascii_digit())
    };
    let mut chars = s.chars();
    chars.next().is_some_and(|c| ok(c, true)) && chars.all(|c| ok(c, false))
}

/// A label value as the format quotes it: `\` → `\\`, `"` → `\"`, newline → `\n`.
pub fn escape_label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Help text as the format writes it: `\` → `\\`, newline → `\n` (quotes stay).
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A number as Python's `prometheus_client` writes it: `+Inf`, `-Inf`, `NaN`, whole numbers
/// with one decimal (`5.0`, `le="1.0"`), others in their shortest exact form (`0.25`).
pub fn format_float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else if v.fract() == 0.0 && v.abs() < 1e16 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}
