//! End-to-end: grammar-constrained decoding through `host inference`. A tiny model with RANDOM
//! weights (it has learnt nothing, so every valid output is the constraint's doing) must return
//! a declared, schema-valid tool call on every one of 50 seeded `tool_choice` requests, and
//! `response_format` outputs must parse and validate — all read back through the official
//! `openai` client. vLLM's `guided_*` / `structured_outputs` fields work on `/v1/completions`;
//! n > 1, seeds, the prefix cache and stop strings keep working under a constraint; fields that
//! cannot be honoured are 400s naming them. A taught model's own call is unchanged when the same
//! call is forced.

use std::process::Command;

use serde_json::{Value, json};

use crate::common;
use crate::inference::{QUESTION, taught_model, tools as python_tool};

/// Tools whose arguments are bounded (enums, integer ranges, short strings), so a call always
/// fits in `max_tokens` whatever a random model prefers.
fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "The forecast for a city.",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            }, "required": ["city", "days"], "additionalProperties": false},
        }},
        {"type": "function", "function": {
            "name": "set_alarm",
            "description": "Set an alarm.",
            "parameters": {"type": "object", "properties": {
                "hour": {"type": "integer", "minimum": 0, "maximum": 23},
                "label": {"type": "string", "maxLength": 6},
                "loud": {"type": "boolean"},
            }, "required": ["hour"], "additionalProperties": false},
        }},
    ])
}

fn random_server() -> (tempfile::TempDir, common::InferenceServer) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("random");
    common::tiny_model(&dir, 5);
    let server = common::InferenceServer::start(&dir, &["--served-model-name", "tiny"]);
    (tmp, server)
}

async fn post(client: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let r = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap())
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// 50 seeded requests on a random model through the `openai` client: 20 `required` (parallel
/// calls allowed), 15 `required` with `parallel_tool_calls: false`, 15 naming `set_alarm`; every
/// one returns declared calls whose arguments validate. Then `response_format`: json_schema
/// outputs validate, json_object outputs are objects.
#[test]
fn forced_calls_and_response_formats_are_always_valid_on_a_random_model() {
    let (tmp, server) = random_server();
    let Some(python) = common::reference_python("grammar") else {
        return;
    };
    let mut tool_runs = Vec::new();
    for seed in 0..50u64 {
        let (choice, parallel) = match seed {
            0..20 => ("required", true),
            20..35 => ("required", false),
            _ => ("set_alarm", false),
        };
        tool_runs.push(json!({"tool_choice": choice, "parallel": parallel, "seed": seed}));
    }
    let answer = json!({"type": "object", "properties": {
        "verdict": {"type": "string", "enum": ["yes", "no", "maybe"]},
        "score": {"type": "integer", "minimum": -5, "maximum": 5},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
    }, "required": ["verdict", "score", "tags"], "additionalProperties": false});
    let schema_runs: Vec<Value> = (0..10)
        .map(|seed| json!({"schema": answer, "seed": seed}))
        .collect();
    let case = tmp.path().join("case.json");
    std::fs::write(
        &case,
        json!({
            "messages": [{"role": "user", "content": "Plan my day."}],
            "tools": tools(), "max_tokens": 1500,
            "tool_runs": tool_runs, "schema_runs": schema_runs, "object_runs": [0, 1, 2, 3, 4],
        })
        .to_string(),
    )
    .unwrap();
    let stdout = common::run_ok(
        Command::new(python)
            .arg(common::repo_root().join("scripts/openai-structured-check.py"))
            .args(["--base-url", &server.url, "--model", "tiny", "--case"])
            .arg(&case),
    );
    let r: Value = serde_json::from_str(&stdout).unwrap();
    eprintln!("validated with {}", r["validator"]);
    let runs = r["tool_runs"].as_array().unwrap();
    assert_eq!(runs.len(), 50);
    let mut several = 0;
    for run in runs {
        assert_eq!(run["problems"], json!([]), "{run}");
        assert_eq!(run["finish_reason"], "tool_calls", "{run}");
        several += usize::from(run["calls"].as_array().unwrap().len() > 1);
    }
    // Parallel calls happen when allowed (a random model stops or goes on about evenly).
    assert!(several > 0, "no request made more than one call: {r}");
    for run in r["schema_runs"].as_array().unwrap() {
        assert_eq!(run["problems"], json!([]), "{run}");
        assert_eq!(run["finish_reason"], "stop", "{run}");
    }
    for run in r["object_runs"].as_array().unwrap() {
        assert_eq!(run["is_object"], true, "{run}");
        assert_eq!(run["finish_reason"], "stop", "{run}");
    }
}

/// vLLM's fields on `/v1/completions` (choice, regex, JSON schema, old and new names); n > 1,
/// seeds, the prefix cache and stop strings under a constraint; what cannot be honoured is a 400
/// naming the field.
#[test]
fn guided_fields_work_on_completions_and_bad_ones_are_named() {
    let (_tmp, server) = random_server();
    let chat = format!("{}/chat/completions", server.url);
    let text = format!("{}/completions", server.url);
    rt().block_on(async {
        let c = reqwest::Client::new();
        // Long enough to fill prefix-cache blocks.
        let prompt = "Pick one of the words that follow and write nothing else: alpha beta, gamma, delta. ".repeat(3);
        let base = json!({"model": "tiny", "prompt": prompt, "max_tokens": 200});
        let with = |extra: Value| {
            let mut b = base.clone();
            b.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            b
        };
        // guided_choice and structured_outputs.choice, n = 4 with a seed: every sample is a
        // choice, and the same request again gives the same samples (from the prefix cache).
        let choices = ["alpha beta", "gamma", "delta"];
        for field in [
            json!({"guided_choice": choices}),
            json!({"structured_outputs": {"choice": choices}}),
        ] {
            let body = with(json!({"n": 4, "seed": 7}));
            let mut body = body.as_object().unwrap().clone();
            body.extend(field.as_object().unwrap().clone());
            let body = Value::Object(body);
            let (s1, r1) = post(&c, &text, &body).await;
            assert_eq!(s1, 200, "{r1}");
            let texts: Vec<&str> = r1["choices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x["text"].as_str().unwrap())
                .collect();
            assert_eq!(texts.len(), 4);
            for t in &texts {
                assert!(choices.contains(t), "{t:?} is not a choice");
            }
            let (_, r2) = post(&c, &text, &body).await;
            assert_eq!(r1["choices"], r2["choices"]);
            assert!(
                r2["usage"]["prompt_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .unwrap()
                    > 0,
                "{r2}"
            );
        }
        // A stop string still ends a constrained output (inside the grammar's text).
        for seed in 0..6 {
            let body = with(json!({"guided_choice": ["alpha beta", "gamma"], "stop": [" beta"],
                                   "seed": seed}));
            let (s, r) = post(&c, &text, &body).await;
            assert_eq!(s, 200, "{r}");
            let t = r["choices"][0]["text"].as_str().unwrap();
            assert!(t == "alpha" || t == "gamma", "{t:?}");
            assert_eq!(r["choices"][0]["finish_reason"], "stop");
        }
        // guided_regex and structured_outputs.regex.
        for field in [
            json!({"guided_regex": "[0-9]{3}-[a-c]{2}"}),
            json!({"structured_outputs": {"regex": "[0-9]{3}-[a-c]{2}"}}),
        ] {
            let (s, r) = post(&c, &text, &with(field)).await;
            assert_eq!(s, 200, "{r}");
            let t = r["choices"][0]["text"].as_str().unwrap();
            let b = t.as_bytes();
            assert!(
                b.len() == 6
                    && b[..3].iter().all(u8::is_ascii_digit)
                    && b[3] == b'-'
                    && b[4..].iter().all(|x| (b'a'..=b'c').contains(x)),
                "{t:?}"
            );
        }
        // guided_json as JSON text (vLLM accepts a string) on completions.
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer",
            "minimum": 0, "maximum": 9}}, "required": ["n"], "additionalProperties": false});
        let (s, r) = post(&c, &text, &with(json!({"guided_json": schema.to_string()}))).await;
        assert_eq!(s, 200, "{r}");
        let v: Value = serde_json::from_str(r["choices"][0]["text"].as_str().unwrap()).unwrap();
        let n = v["n"].as_i64().unwrap();
        assert!((0..=9).contains(&n) && v.as_object().unwrap().len() == 1, "{v}");
        // Refused, by name.
        let msgs = json!([{"role": "user", "content": "hi"}]);
        let refused = [
            (
                json!({"model": "tiny", "messages": msgs,
                       "response_format": {"type": "json_schema", "json_schema": {"name": "x",
                           "schema": {"type": "object", "properties": {"a": {"$ref": "http://x/y"}}}}}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"model": "tiny", "messages": msgs, "guided_grammar": "root ::= \"a\""}),
                "guided_grammar",
            ),
            (
                json!({"model": "tiny", "messages": msgs,
                       "structured_outputs": {"grammar": "start: \"a\""}}),
                "structured_outputs.grammar",
            ),
            (
                json!({"model": "tiny", "messages": msgs, "guided_regex": "a", "guided_choice": ["a"]}),
                "guided_choice",
            ),
            (
                json!({"model": "tiny", "messages": msgs, "tools": tools(), "tool_choice": "required",
                       "response_format": {"type": "json_object"}}),
                "response_format",
            ),
            (
                json!({"model": "tiny", "messages": msgs, "guided_regex": "(unclosed"}),
                "guided_regex",
            ),
            (
                json!({"model": "tiny", "messages": msgs, "guided_json": "{not json"}),
                "guided_json",
            ),
            (
                json!({"model": "tiny", "messages": msgs, "guided_decoding_backend": "xgrammar",
                       "guided_regex": "a"}),
                "guided_decoding_backend",
            ),
            (
                json!({"model": "tiny", "messages": msgs, "response_format": {"type": "json_object"},
                       "ignore_eos": true}),
                "ignore_eos",
            ),
        ];
        for (body, param) in refused {
            let (s, r) = post(&c, &chat, &body).await;
            assert_eq!(s, 400, "{body}: {r}");
            assert_eq!(r["error"]["param"], param, "{body}: {r}");
        }
    });
}

/// A model that already writes the call: forcing that call (named, greedy) gives exactly the
/// free call's tokens and log-probs — the constraint never disturbs a compliant model — and
/// `parallel_tool_calls: false` still returns it.
#[test]
fn a_taught_models_call_is_the_same_when_forced() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("taught");
    taught_model(&dir);
    let server = common::InferenceServer::start(&dir, &["--served-model-name", "tiny"]);
    let url = format!("{}/chat/completions", server.url);
    rt().block_on(async {
        let c = reqwest::Client::new();
        let body = |choice: Value| {
            json!({"model": "tiny", "messages": [{"role": "user", "content": QUESTION}],
                   "tools": python_tool(), "tool_choice": choice, "temperature": 0.0,
                   "max_tokens": 60, "logprobs": true, "return_token_ids": true,
                   "parallel_tool_calls": false})
        };
        let (s, free) = post(&c, &url, &body(json!("auto"))).await;
        assert_eq!(s, 200, "{free}");
        let named = json!({"type": "function", "function": {"name": "python"}});
        for choice in [named, json!("required")] {
            let (s, forced) = post(&c, &url, &body(choice)).await;
            assert_eq!(s, 200, "{forced}");
            let (a, b) = (&free["choices"][0], &forced["choices"][0]);
            assert_eq!(a["finish_reason"], "tool_calls", "{free}");
            assert_eq!(b["finish_reason"], "tool_calls", "{forced}");
            assert_eq!(
                a["message"]["tool_calls"][0]["function"],
                b["message"]["tool_calls"][0]["function"]
            );
            let args = b["message"]["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .unwrap();
            assert_eq!(
                serde_json::from_str::<Value>(args).unwrap(),
                json!({"code": "print(6 * 7)"})
            );
            assert_eq!(a["token_ids"], b["token_ids"]);
            assert_eq!(a["logprobs"], b["logprobs"]);
        }
    });
}
