//! `rlhost::prometheus`: the text exposition format written byte for byte (escaping, cumulative
//! buckets with an inclusive `le`, a family's series under one `# HELP`/`# TYPE`), read back by
//! Prometheus' official Python parser when the reference venv has it, the registration errors,
//! and `rlhost::server::serve_metrics` answering a real HTTP client on loopback.

use std::process::Command;
use std::sync::Arc;

use rlhost::prometheus::{MetricError, Registry, format_float};

use crate::common;

/// A registry with a two-series counter (one with every character that needs escaping), a
/// gauge and a histogram.
fn demo() -> Registry {
    let r = Registry::new();
    let help = "Requests.\nTwo lines, a \\ and \"quotes\".";
    let tricky = r
        .counter(
            "demo:requests_total",
            help,
            &[("path", "a\"b\\c\nd"), ("code", "200")],
        )
        .unwrap();
    tricky.inc();
    tricky.inc_by(2.5);
    tricky.inc_by(-7.0);
    let plain = r
        .counter(
            "demo:requests_total",
            help,
            &[("path", "/"), ("code", "500")],
        )
        .unwrap();
    plain.inc();
    r.gauge("demo_temperature", "Degrees.", &[])
        .unwrap()
        .set(-1.5);
    let h = r
        .histogram(
            "demo_seconds",
            "Latency.",
            &[("route", "x")],
            &[0.25, 1.0, 10.0],
        )
        .unwrap();
    for v in [0.0625, 0.25, 0.5, 5.0, 100.0, f64::NAN] {
        h.observe(v);
    }
    r
}

const DEMO: &str = r#"# HELP demo:requests_total Requests.\nTwo lines, a \\ and "quotes".
# TYPE demo:requests_total counter
demo:requests_total{path="a\"b\\c\nd",code="200"} 3.5
demo:requests_total{path="/",code="500"} 1.0
# HELP demo_temperature Degrees.
# TYPE demo_temperature gauge
demo_temperature -1.5
# HELP demo_seconds Latency.
# TYPE demo_seconds histogram
demo_seconds_bucket{route="x",le="0.25"} 2.0
demo_seconds_bucket{route="x",le="1.0"} 3.0
demo_seconds_bucket{route="x",le="10.0"} 4.0
demo_seconds_bucket{route="x",le="+Inf"} 5.0
demo_seconds_sum{route="x"} 105.8125
demo_seconds_count{route="x"} 5.0
"#;

#[test]
fn the_text_format_is_written_byte_for_byte() {
    assert_eq!(demo().render(), DEMO);
}

#[test]
fn numbers_are_written_as_prometheus_client_writes_them() {
    for (v, want) in [
        (5.0, "5.0"),
        (0.0, "0.0"),
        (0.25, "0.25"),
        (0.001, "0.001"),
        (2560.0, "2560.0"),
        (-1.5, "-1.5"),
        (f64::INFINITY, "+Inf"),
        (f64::NEG_INFINITY, "-Inf"),
        (f64::NAN, "NaN"),
    ] {
        assert_eq!(format_float(v), want, "{v}");
    }
}

#[test]
fn the_official_parser_reads_back_every_value_and_label() {
    let Some(python) = common::reference_python("prometheus format (prometheus_client parser)")
    else {
        return;
    };
    let has_parser = Command::new(&python)
        .args(["-c", "import prometheus_client.parser"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_parser {
        common::skip(
            "prometheus format (prometheus_client parser)",
            "the reference venv lacks prometheus_client; re-run `make setup-py-reference`",
        );
        return;
    }
    let script = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
print(json.dumps([[f.name, f.type, f.documentation,
                   [[s.name, s.labels, s.value] for s in f.samples]]
                  for f in text_string_to_metric_families(sys.stdin.read())]))
"#;
    let out = common::run_python(&python, script, DEMO);
    let (stdout, stderr) = common::texts(&out);
    assert!(out.status.success(), "{stderr}");
    type Sample = (String, std::collections::BTreeMap<String, String>, f64);
    let families: Vec<(String, String, String, Vec<Sample>)> =
        serde_json::from_str(&stdout).unwrap();
    let names: Vec<(&str, &str)> = families
        .iter()
        .map(|f| (f.0.as_str(), f.1.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("demo:requests", "counter"),
            ("demo_temperature", "gauge"),
            ("demo_seconds", "histogram")
        ]
    );
    assert_eq!(families[0].2, "Requests.\nTwo lines, a \\ and \"quotes\".");
    let requests = &families[0].3;
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].0, "demo:requests_total");
    assert_eq!(requests[0].1["path"], "a\"b\\c\nd");
    assert_eq!(requests[0].2, 3.5);
    assert_eq!(requests[1].1["code"], "500");
    let buckets: Vec<(&str, f64)> = families[2]
        .3
        .iter()
        .filter(|s| s.0 == "demo_seconds_bucket")
        .map(|s| (s.1["le"].as_str(), s.2))
        .collect();
    assert_eq!(
        buckets,
        [("0.25", 2.0), ("1.0", 3.0), ("10.0", 4.0), ("+Inf", 5.0)]
    );
}

#[test]
fn bad_registrations_are_refused_by_name() {
    let r = Registry::new();
    r.counter("ok_total", "Help.", &[("a", "1")]).unwrap();
    let err = |e: Result<(), MetricError>| e.expect_err("refused");
    assert_eq!(
        err(r.gauge("1bad", "Help.", &[]).map(|_| ())),
        MetricError::Name("1bad".into())
    );
    assert!(matches!(
        err(r.gauge("g", "Help.", &[("__reserved", "x")]).map(|_| ())),
        MetricError::Label { .. }
    ));
    assert!(matches!(
        err(r.gauge("g", "Help.", &[("a", "x"), ("a", "y")]).map(|_| ())),
        MetricError::Label { .. }
    ));
    assert!(matches!(
        err(r
            .histogram("h", "Help.", &[("le", "1")], &[1.0])
            .map(|_| ())),
        MetricError::Label { .. }
    ));
    for buckets in [&[][..], &[1.0, 1.0], &[2.0, 1.0], &[1.0, f64::INFINITY]] {
        assert_eq!(
            err(r.histogram("h", "Help.", &[], buckets).map(|_| ())),
            MetricError::Buckets("h".into()),
            "{buckets:?}"
        );
    }
    // The same name must keep its type, help and label names; the same labels cannot repeat.
    assert_eq!(
        err(r.gauge("ok_total", "Help.", &[("a", "2")]).map(|_| ())),
        MetricError::Conflict("ok_total".into())
    );
    assert_eq!(
        err(r.counter("ok_total", "Other.", &[("a", "2")]).map(|_| ())),
        MetricError::Conflict("ok_total".into())
    );
    assert_eq!(
        err(r.counter("ok_total", "Help.", &[("b", "2")]).map(|_| ())),
        MetricError::Conflict("ok_total".into())
    );
    assert!(matches!(
        err(r.counter("ok_total", "Help.", &[("a", "1")]).map(|_| ())),
        MetricError::Duplicate { .. }
    ));
    r.counter("ok_total", "Help.", &[("a", "2")]).unwrap();
    assert_eq!(r.render().matches("# TYPE ok_total counter").count(), 1);
}

#[test]
fn serve_metrics_answers_get_metrics_only() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let registry = Arc::new(Registry::new());
        let hits = registry.counter("scrapes_total", "Scrapes.", &[]).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let source = {
            let registry = registry.clone();
            move || {
                hits.inc();
                registry.render()
            }
        };
        let server = tokio::spawn(rlhost::server::serve_metrics(listener, source, async {
            let _ = stopped.await;
        }));
        let client = reqwest::Client::new();
        for n in 1..=2 {
            let r = client.get(format!("{url}/metrics")).send().await.unwrap();
            assert_eq!(r.status().as_u16(), 200);
            assert_eq!(
                r.headers()["content-type"],
                "text/plain; version=0.0.4; charset=utf-8"
            );
            let body = r.text().await.unwrap();
            assert!(body.contains(&format!("\nscrapes_total {n}.0\n")), "{body}");
        }
        let r = client.get(format!("{url}/v1/models")).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 404);
        let r = client.post(format!("{url}/metrics")).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 405);
        stop.send(()).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), server)
            .await
            .expect("the server stops when asked")
            .unwrap()
            .unwrap();
    });
}
