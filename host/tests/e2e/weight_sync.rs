//! Weight sync per server kind (`orchestrator.client.weight_sync`). Against rlhost's own server
//! (real): the refusals that name the flag to set. SGLang and prime-rl's server do not run on
//! these machines, so their routes are checked against a loopback HTTP server answering as
//! their sources do (SGLang's `/update_weights_from_disk` → `{"success", "message"}`, prime-rl's
//! `/update_weights {"weight_dir"}`, FastAPI's `/openapi.json`); vLLM's are checked against the
//! real vLLM by `make interop` (`interop.rs`), and here for the requests they send.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rlhost::rollout::{Generator, OpenAiClient, WeightSync};
use serde_json::{Value, json};

use crate::common;

/// A [`fake`] server: its base URL, the requests it saw, and the flag that stops it.
type Fake = (
    String,
    Arc<Mutex<Vec<String>>>,
    Arc<std::sync::atomic::AtomicBool>,
);

/// A server that answers like `owned_by`'s, lists `routes` in `/openapi.json`, answers
/// `update` to its weight route and records every request as `METHOD PATH BODY`.
fn fake(owned_by: &'static str, routes: &'static [&'static str], update: Value) -> Fake {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let (port, stop) = common::serve_http(60, move |r| {
        log.lock().unwrap().push(format!(
            "{} {} {}",
            r.method,
            r.path,
            String::from_utf8_lossy(&r.body)
        ));
        let body = match r.path.as_str() {
            "/v1/models" => {
                json!({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": owned_by}]})
            }
            "/openapi.json" => {
                let paths: serde_json::Map<String, Value> =
                    routes.iter().map(|p| (p.to_string(), json!({}))).collect();
                json!({"openapi": "3.1.0", "paths": paths})
            }
            "/v1/chat/completions" => common::chat_completion(Some("hi"), vec![]),
            p if routes.contains(&p) => update.clone(),
            _ => return (404, vec![], b"{\"detail\":\"Not Found\"}".to_vec()),
        };
        (200, vec![], body.to_string().into_bytes())
    });
    (format!("http://127.0.0.1:{port}/v1"), seen, stop)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn client(url: &str) -> OpenAiClient {
    OpenAiClient::new(url, None, Duration::from_secs(10))
}

#[test]
fn each_server_kind_gets_its_route_and_versions_are_tracked() {
    let rt = rt();
    let dir = std::path::Path::new("/tmp/weights/step_3");
    // (owned_by, routes, answer to the update, weight_sync asked, kind found, request expected)
    type Case = (
        &'static str,
        &'static [&'static str],
        Value,
        WeightSync,
        WeightSync,
        &'static str,
    );
    let cases: [Case; 4] = [
        (
            "sglang",
            &["/update_weights_from_disk"],
            json!({"success": true, "message": "ok"}),
            WeightSync::Auto,
            WeightSync::Sglang,
            "POST /update_weights_from_disk {\"model_path\":\"/tmp/weights/step_3\"}",
        ),
        (
            "vllm",
            &[
                "/update_weights",
                "/init_broadcaster",
                "/v1/chat/completions/tokens",
            ],
            json!({"status": "ok"}),
            WeightSync::Auto,
            WeightSync::PrimeRl,
            "POST /update_weights {\"weight_dir\":\"/tmp/weights/step_3\"}",
        ),
        (
            "vllm",
            &[
                "/collective_rpc",
                "/reset_prefix_cache",
                "/update_weight_version",
            ],
            json!({"results": [null]}),
            WeightSync::Auto,
            WeightSync::Vllm,
            "POST /collective_rpc {\"method\":\"reload_weights\",\"kwargs\":{\"weights_path\":\"/tmp/weights/step_3\"}}",
        ),
        (
            "vllm",
            &["/collective_rpc", "/reset_prefix_cache"],
            json!({"results": [null]}),
            WeightSync::Vllm,
            WeightSync::Vllm,
            "POST /reset_prefix_cache null",
        ),
    ];
    for (owned_by, routes, update, asked, kind, expected) in cases {
        let (url, seen, stop) = fake(owned_by, routes, update);
        let c = client(&url).track_versions(0);
        let target = rt.block_on(c.prepare_sync(asked, false)).unwrap();
        assert_eq!(target.kind, kind, "{owned_by} {routes:?}");
        // Before the update: completions stamped 0; after it returned: 3.
        let req = rlhost::rollout::request("m", &[], &[], &Default::default(), None);
        let before = rt.block_on(c.complete(&req)).unwrap();
        assert_eq!(before.policy_version, Some(0));
        assert_eq!(rt.block_on(c.update_weights(dir, &target, 3)).unwrap(), 3);
        let after = rt.block_on(c.complete(&req)).unwrap();
        assert_eq!(after.policy_version, Some(3));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let seen = seen.lock().unwrap().join("\n");
        assert!(seen.contains(expected), "{kind:?}: {seen}");
        if kind == WeightSync::Vllm {
            let version = seen.contains("POST /update_weight_version {\"new_version\":\"3\"}");
            assert_eq!(
                version,
                routes.contains(&"/update_weight_version"),
                "{seen}"
            );
        }
    }
}

#[test]
fn a_failed_or_missing_route_is_an_error_naming_the_fix() {
    let rt = rt();
    let dir = std::path::Path::new("/tmp/w");
    // SGLang answering success = false.
    let (url, _, stop) = fake(
        "sglang",
        &["/update_weights_from_disk"],
        json!({"success": false, "message": "shape mismatch in lm_head"}),
    );
    let c = client(&url);
    let target = rt
        .block_on(c.prepare_sync(WeightSync::Sglang, false))
        .unwrap();
    let err = rt
        .block_on(c.update_weights(dir, &target, 1))
        .unwrap_err()
        .to_string();
    assert!(err.contains("shape mismatch in lm_head"), "{err}");
    // LoRA adapters go to rlhost and vLLM servers only.
    let err = rt
        .block_on(c.prepare_sync(WeightSync::Sglang, true))
        .unwrap_err()
        .to_string();
    assert!(err.contains("rlhost and vLLM"), "{err}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // vLLM without dev mode.
    let (url, _, stop) = fake("vllm", &["/v1/chat/completions"], json!({}));
    let err = rt
        .block_on(client(&url).prepare_sync(WeightSync::Auto, false))
        .unwrap_err()
        .to_string();
    assert!(err.contains("VLLM_SERVER_DEV_MODE=1"), "{err}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // prime-rl asked of plain vLLM.
    let (url, _, stop) = fake("vllm", &["/collective_rpc"], json!({}));
    let err = rt
        .block_on(client(&url).prepare_sync(WeightSync::PrimeRl, false))
        .unwrap_err()
        .to_string();
    assert!(err.contains("prime-rl's `inference`"), "{err}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// `host rl` against rlhost's real server with `weight_sync = "vllm"`: refused before any step,
/// naming the variable that gives vLLM its reload route; in colocated mode the key is refused.
#[test]
fn host_rl_names_the_server_flag_to_set() {
    let common::Workspace { tmp, home, model } = common::workspace(&["arith"], 3);
    let server = common::InferenceServer::start(&model, &[]);
    let base = [
        "rl",
        "--plugin",
        "arith",
        "--orchestrator.batch-size",
        "8",
        "--orchestrator.rollouts-per-example",
        "4",
        "--orchestrator.max-steps",
        "1",
        "--trainer.max-steps",
        "1",
    ];
    let out_dir = tmp.path().join("run");
    let err = common::run_err(
        common::host(&home)
            .args(base)
            .args(["--model.name", model.to_str().unwrap()])
            .args(["--output-dir", out_dir.to_str().unwrap()])
            .args([
                "--orchestrator.client.base-urls",
                &format!("[\"{}\"]", server.url),
                "--orchestrator.client.weight-sync",
                "vllm",
            ]),
    );
    assert!(
        err.contains("weight_sync") && err.contains("VLLM_SERVER_DEV_MODE=1"),
        "{err}"
    );
    let err = common::run_err(
        common::host(&home)
            .args(base)
            .args(["--model.name", model.to_str().unwrap()])
            .args(["--output-dir", out_dir.to_str().unwrap()])
            .args(["--orchestrator.client.weight-sync", "vllm"]),
    );
    assert!(
        err.contains("orchestrator.client.weight_sync") && err.contains("base_urls"),
        "{err}"
    );
}
