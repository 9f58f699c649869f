//! End-to-end: `GET /metrics` of `host inference`, read with Prometheus' official Python parser
//! (`prometheus_client`, from the reference venv) after real traffic on loopback: chat
//! completions sharing a long system prompt (prefix-cache hits), one cut by `max_tokens`, one
//! stopped by a stop token, a streamed one, a text completion with `n = 2`, and a weight update.
//! Every counter must equal what the responses themselves report (`usage`, `finish_reason`),
//! every histogram count the number of samples, and the families must carry vLLM's names, types,
//! labels and buckets.

use std::collections::BTreeMap;
use std::process::Command;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::common;

/// One sample as `prometheus_client.parser` reads it.
#[derive(Debug, Deserialize)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// One metric family as `prometheus_client.parser` reads it (a counter's name without
/// `_total`).
#[derive(Debug, Deserialize)]
struct Family {
    name: String,
    #[serde(rename = "type")]
    kind: String,
    documentation: String,
    samples: Vec<Sample>,
}

/// Families parsed from a scrape, by the parser's family name.
struct Scrape(BTreeMap<String, Family>);

const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for f in text_string_to_metric_families(sys.stdin.read()):
    out.append({"name": f.name, "type": f.type, "documentation": f.documentation,
                "samples": [{"name": s.name, "labels": s.labels, "value": s.value}
                            for s in f.samples]})
print(json.dumps(out))
"#;

/// The reference venv's Python if it has `prometheus_client`; otherwise records the skip.
fn parser_python() -> Option<std::path::PathBuf> {
    let python = common::reference_python("metrics (prometheus_client parser)")?;
    let ok = Command::new(&python)
        .args(["-c", "import prometheus_client.parser"])
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        Some(python)
    } else {
        common::skip(
            "metrics (prometheus_client parser)",
            "the reference venv lacks prometheus_client; re-run `make setup-py-reference`",
        );
        None
    }
}

fn parse(python: &std::path::Path, text: &str) -> Scrape {
    let out = common::run_python(python, PARSE, text);
    let (stdout, stderr) = common::texts(&out);
    assert!(
        out.status.success(),
        "the official parser refused the scrape:\n{stderr}\n--- scrape ---\n{text}"
    );
    let families: Vec<Family> = serde_json::from_str(&stdout).unwrap();
    let mut map = BTreeMap::new();
    for f in families {
        assert!(
            map.insert(f.name.clone(), f).is_none(),
            "a family appears twice:\n{text}"
        );
    }
    Scrape(map)
}

impl Scrape {
    fn family(&self, name: &str, kind: &str) -> &Family {
        let f = self
            .0
            .get(name)
            .unwrap_or_else(|| panic!("no family {name}; have {:?}", self.0.keys()));
        assert_eq!(f.kind, kind, "{name}");
        assert!(!f.documentation.is_empty(), "{name} has no help text");
        f
    }

    /// The one sample `sample` of family `family` whose labels include `extra`.
    fn value(&self, family: &str, kind: &str, sample: &str, extra: &[(&str, &str)]) -> f64 {
        let f = self.family(family, kind);
        let hits: Vec<&Sample> = f
            .samples
            .iter()
            .filter(|s| {
                s.name == sample
                    && extra
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect();
        assert_eq!(hits.len(), 1, "{sample} {extra:?}: {:?}", f.samples);
        hits[0].value
    }

    fn counter(&self, name: &str, extra: &[(&str, &str)]) -> f64 {
        let family = name.strip_suffix("_total").expect("a counter name");
        self.value(family, "counter", name, extra)
    }

    fn gauge(&self, name: &str) -> f64 {
        self.value(name, "gauge", name, &[])
    }

    /// A histogram's buckets (upper bound as written, cumulative count), sum and count, after
    /// checking its shape: bounds increasing, counts cumulative, `+Inf` last and equal to the
    /// count.
    fn histogram(&self, name: &str) -> (Vec<(String, f64)>, f64, f64) {
        let f = self.family(name, "histogram");
        let buckets: Vec<(String, f64)> = f
            .samples
            .iter()
            .filter(|s| s.name == format!("{name}_bucket"))
            .map(|s| (s.labels["le"].clone(), s.value))
            .collect();
        let sum = self.value(name, "histogram", &format!("{name}_sum"), &[]);
        let count = self.value(name, "histogram", &format!("{name}_count"), &[]);
        assert_eq!(buckets.last().map(|b| b.0.as_str()), Some("+Inf"), "{name}");
        assert_eq!(buckets.last().unwrap().1, count, "{name}: +Inf bucket");
        for w in buckets.windows(2) {
            assert!(
                w[0].1 <= w[1].1,
                "{name}: buckets not cumulative: {buckets:?}"
            );
            let (a, b) = (
                w[0].0.parse::<f64>().unwrap(),
                w[1].0.parse::<f64>().unwrap(),
            );
            assert!(a < b, "{name}: bounds not increasing: {buckets:?}");
        }
        (buckets, sum, count)
    }

    fn count(&self, name: &str) -> f64 {
        self.histogram(name).2
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn post(client: &reqwest::Client, url: &str, body: &Value) -> Value {
    let r = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    assert_eq!(status, 200, "{url} {body}: {text}");
    serde_json::from_str(&text).unwrap()
}

/// The scrape's body, after checking the status and content type.
async fn scrape_text(client: &reqwest::Client, root: &str) -> String {
    let r = client.get(format!("{root}/metrics")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let ctype = r.headers()["content-type"].to_str().unwrap().to_string();
    assert_eq!(ctype, "text/plain; version=0.0.4; charset=utf-8");
    r.text().await.unwrap()
}

/// What the responses reported, summed.
#[derive(Debug, Default)]
struct Served {
    prompt_tokens: f64,
    completion_tokens: f64,
    cached_tokens: f64,
    /// Samples (choices), and by finish reason.
    samples: f64,
    finishes: BTreeMap<String, f64>,
    /// Prompt tokens once per sample (what `vllm:request_prompt_tokens` sums).
    sample_prompt_tokens: f64,
}

impl Served {
    fn add(&mut self, usage: &Value, finish_reasons: &[&str]) {
        let n = |v: &Value| v.as_f64().unwrap_or_else(|| panic!("a number: {usage}"));
        let prompt = n(&usage["prompt_tokens"]);
        self.prompt_tokens += prompt;
        self.completion_tokens += n(&usage["completion_tokens"]);
        self.cached_tokens += n(&usage["prompt_tokens_details"]["cached_tokens"]);
        for r in finish_reasons {
            self.samples += 1.0;
            self.sample_prompt_tokens += prompt;
            *self.finishes.entry(r.to_string()).or_default() += 1.0;
        }
    }

    fn response(&mut self, r: &Value) {
        let reasons: Vec<&str> = r["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["finish_reason"].as_str().unwrap())
            .collect();
        self.add(&r["usage"], &reasons);
    }
}

#[test]
fn metrics_count_exactly_the_traffic_served() {
    let Some(python) = parser_python() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    common::tiny_model(&a, 21);
    common::tiny_model(&b, 22);
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(a.join("config.json")).unwrap()).unwrap();
    let vocab = config["vocab_size"].as_u64().unwrap();
    let server = common::InferenceServer::start(&a, &["--served-model-name", "tiny"]);
    let root = server.url.trim_end_matches("/v1").to_string();
    let chat = format!("{}/chat/completions", server.url);
    let rt = rt();
    let client = reqwest::Client::new();
    let mut served = Served::default();
    let system = "You are a careful assistant for arithmetic. ".repeat(24);
    let ask = |question: &str, extra: Value| {
        let mut body = json!({"model": "tiny", "temperature": 0, "max_tokens": 6,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": question}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    rt.block_on(async {
        // Before any traffic: everything at zero, version 0.
        let idle = parse(&python, &scrape_text(&client, &root).await);
        assert_eq!(idle.counter("vllm:prompt_tokens_total", &[]), 0.0);
        assert_eq!(idle.gauge("rlhost:policy_version"), 0.0);
        assert_eq!(idle.counter("rlhost:weight_updates_total", &[]), 0.0);

        // Three questions after one long system prompt, one at a time: the second and third
        // find its blocks in the prefix cache.
        for q in ["What is 2 + 2?", "What is 3 * 5?", "What is 10 - 7?"] {
            let r = post(&client, &chat, &ask(q, json!({}))).await;
            served.response(&r);
        }
        // Cut by max_tokens.
        let cut = json!({"max_tokens": 1, "ignore_eos": true});
        let r = post(&client, &chat, &ask("Count to ten.", cut)).await;
        assert_eq!(r["choices"][0]["finish_reason"], "length", "{r}");
        served.response(&r);
        // Stopped by a stop token: every id is one.
        let all: Vec<u64> = (0..vocab).collect();
        let r = post(
            &client,
            &chat,
            &ask("Stop.", json!({"stop_token_ids": all})),
        )
        .await;
        assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
        served.response(&r);
        // Streamed, with usage in the last chunk.
        let body = ask(
            "What is 6 * 7?",
            json!({"stream": true, "stream_options": {"include_usage": true}}),
        );
        let text = client
            .post(&chat)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let chunks: Vec<Value> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let finish: Vec<&str> = chunks
            .iter()
            .flat_map(|c| c["choices"].as_array().unwrap())
            .filter_map(|c| c["finish_reason"].as_str())
            .collect();
        let usage = &chunks.last().unwrap()["usage"];
        assert_eq!(finish.len(), 1, "{text}");
        served.add(usage, &finish);
        // A text completion with two samples: its prompt counts once in the token counters
        // (as in usage), each sample once in the request counts.
        let r = post(
            &client,
            &format!("{}/completions", server.url),
            &json!({"model": "tiny", "prompt": [5, 6, 7, 8, 9], "max_tokens": 4, "n": 2,
                    "temperature": 1.0, "seed": 3}),
        )
        .await;
        served.response(&r);
        assert!(
            served.cached_tokens > 0.0,
            "the shared system prompt must hit: {served:?}"
        );

        let before = parse(&python, &scrape_text(&client, &root).await);
        check_totals(&before, &served);
        assert_eq!(before.gauge("rlhost:policy_version"), 0.0);
        let usage = before.gauge("vllm:kv_cache_usage_perc");
        assert!(usage > 0.0 && usage <= 1.0, "{usage}");

        // New weights: counted once, the version moves, the prefix cache empties.
        let r = post(
            &client,
            &format!("{root}/update_weights"),
            &json!({"model_path": b}),
        )
        .await;
        assert_eq!(r["policy_version"], 1, "{r}");
        let after = parse(&python, &scrape_text(&client, &root).await);
        assert_eq!(after.gauge("rlhost:policy_version"), 1.0);
        assert_eq!(after.counter("rlhost:weight_updates_total", &[]), 1.0);
        let (_, seconds, count) = after.histogram("rlhost:weight_update_seconds");
        assert_eq!(count, 1.0);
        assert!(seconds > 0.0);
        assert_eq!(after.gauge("vllm:kv_cache_usage_perc"), 0.0);
        // A refused update is not counted.
        let refused = client
            .post(format!("{root}/update_weights"))
            .header("content-type", "application/json")
            .body(json!({"model_path": tmp.path().join("missing")}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status().as_u16(), 400);
        // One more request on the new weights; nothing cached any more.
        let r = post(&client, &chat, &ask("What is 1 + 1?", json!({}))).await;
        assert_eq!(
            r["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
            "{r}"
        );
        served.response(&r);
        let last = parse(&python, &scrape_text(&client, &root).await);
        check_totals(&last, &served);
        assert_eq!(last.counter("rlhost:weight_updates_total", &[]), 1.0);
    });
}

/// Every figure of `m` against what the responses reported, and vLLM's family shapes.
fn check_totals(m: &Scrape, served: &Served) {
    // Labels: vLLM's, on every sample.
    for f in m.0.values() {
        for s in &f.samples {
            assert_eq!(
                s.labels.get("model_name").map(String::as_str),
                Some("tiny"),
                "{s:?}"
            );
            assert_eq!(
                s.labels.get("engine").map(String::as_str),
                Some("0"),
                "{s:?}"
            );
        }
    }
    // Token counters equal the sums of the responses' usage.
    assert_eq!(
        m.counter("vllm:prompt_tokens_total", &[]),
        served.prompt_tokens
    );
    assert_eq!(
        m.counter("vllm:generation_tokens_total", &[]),
        served.completion_tokens
    );
    // Prefix caching is on: every prompt queried it, and the hits are the cached tokens.
    assert_eq!(
        m.counter("vllm:prefix_cache_queries_total", &[]),
        served.prompt_tokens
    );
    assert_eq!(
        m.counter("vllm:prefix_cache_hits_total", &[]),
        served.cached_tokens
    );
    assert_eq!(
        m.counter("vllm:prompt_tokens_cached_total", &[]),
        served.cached_tokens
    );
    let source = |s: &str| m.counter("vllm:prompt_tokens_by_source_total", &[("source", s)]);
    assert_eq!(source("local_cache_hit"), served.cached_tokens);
    let computed = source("local_compute");
    assert_eq!(computed, served.prompt_tokens - served.cached_tokens);
    // Finishes by reason, as the responses gave them (every reason has a series).
    for reason in ["stop", "length", "abort"] {
        let want = served.finishes.get(reason).copied().unwrap_or(0.0);
        assert_eq!(
            m.counter("vllm:request_success_total", &[("finished_reason", reason)]),
            want,
            "{reason}: {served:?}"
        );
    }
    // One observation per sample in every request histogram, one inter-token latency per
    // token after a sample's first.
    for h in [
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
    ] {
        assert_eq!(m.count(h), served.samples, "{h}");
    }
    let decoded = served.completion_tokens - served.samples;
    assert_eq!(m.count("vllm:inter_token_latency_seconds"), decoded);
    assert_eq!(
        m.histogram("vllm:request_generation_tokens").1,
        served.completion_tokens
    );
    assert_eq!(
        m.histogram("vllm:request_prompt_tokens").1,
        served.sample_prompt_tokens
    );
    // Each scheduler step's tokens: every prompt token computed, then one per decode.
    assert_eq!(
        m.histogram("vllm:iteration_tokens_total").1,
        computed + decoded
    );
    // vLLM's buckets, written as vLLM writes them.
    let (ttft, _, _) = m.histogram("vllm:time_to_first_token_seconds");
    let les: Vec<&str> = ttft.iter().map(|b| b.0.as_str()).collect();
    assert_eq!(
        les,
        [
            "0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75",
            "1.0", "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "160.0", "640.0", "2560.0",
            "+Inf"
        ]
    );
    let (e2e, _, _) = m.histogram("vllm:e2e_request_latency_seconds");
    assert_eq!(e2e.len(), 22);
    assert_eq!(e2e[0].0, "0.3");
    // Idle: nothing running or waiting.
    assert_eq!(m.gauge("vllm:num_requests_running"), 0.0);
    assert_eq!(m.gauge("vllm:num_requests_waiting"), 0.0);
}
