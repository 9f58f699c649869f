//! PEFT adapter folders held to the rule flags follow: every setting of PEFT's `LoraConfig`
//! that rlhost does not compute as PEFT does (aLoRA, BD-LoRA, DoRA, …), a key PEFT does not
//! have, a `target_modules` selecting a module rlhost does not adapt, and weights only in a
//! pickle are refused naming the setting, wherever a folder enters: `POST
//! /v1/load_lora_adapter`, `host inference --lora-modules`, `host eval -m … --lora`, `host model
//! merge-lora` and `host rl --resume`. The forms of `target_modules` PEFT resolves
//! (`"all-linear"`, a regular expression, names the model lacks) load.

use std::path::{Path, PathBuf};
use std::process::Command;

use rlhost::model::Qwen3Config;
use rlhost::model::peft::{LORA_CONFIG, Setting};
use serde_json::{Value, json};

use crate::common;

/// What PEFT writes when the refused setting `key` is on (values of its own configs: an
/// aLoRA's invocation tokens, a BD-LoRA's blocks, …); `true` for a setting not listed.
fn on_value(key: &str) -> Value {
    match key {
        "modules_to_save" => json!(["lm_head"]),
        "rank_pattern" => json!({"q_proj": 8}),
        "alpha_pattern" => json!({"q_proj": 32}),
        "megatron_config" => json!({"tensor_model_parallel_size": 2}),
        "trainable_token_indices" => json!([0, 1]),
        "loftq_config" => json!({"loftq_bits": 4, "loftq_iter": 1}),
        "corda_config" => json!({"corda_method": "ipm"}),
        "lora_ga_config" => json!({"direction": "ArB2r"}),
        "velora_config" => {
            json!({"num_groups": 32, "scale": 1.0, "init_type": "batch_average_once"})
        }
        "alora_invocation_tokens" => json!([5, 17]),
        "monteclora_config" => json!({"num_samples": 4}),
        "layer_replication" => json!([[0, 4], [2, 4]]),
        "target_parameters" => json!(["mlp.experts.down_proj"]),
        "use_bdlora" => {
            json!({"target_modules_bd_a": ["q_proj"], "target_modules_bd_b": ["o_proj"],
                               "nblocks": 2, "match_strict": true})
        }
        "arrow_config" => json!({"top_k": 3}),
        "kasa_config" => json!({"beta": 1.0}),
        _ => json!(true),
    }
}

/// Copies of the adapter folder `good` under `root`, each with one thing rlhost refuses, and
/// what its refusal must name: every refused setting of PEFT's `LoraConfig` on, a bias,
/// a PiSSA initialisation, a key PEFT does not have, a `target_modules` selecting `lm_head`,
/// and weights only in `adapter_model.bin`.
fn refused_folders(good: &Path, root: &Path) -> Vec<(String, PathBuf)> {
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(good.join("adapter_config.json")).unwrap())
            .unwrap();
    let mut changes: Vec<(&str, &str, Value)> = LORA_CONFIG
        .iter()
        .filter(|(_, s)| matches!(s, Setting::Refused { .. }))
        .map(|(k, _)| (*k, *k, on_value(k)))
        .collect();
    changes.extend([
        ("bias", "bias", json!("all")),
        ("init_lora_weights", "init_lora_weights", json!("pissa")),
        ("use_future_lora", "use_future_lora", json!(true)),
        ("target_modules", "lm_head", json!(["q_proj", "lm_head"])),
    ]);
    let mut out = Vec::new();
    for (i, (key, names, value)) in changes.into_iter().enumerate() {
        let dir = root.join(format!("refused-{i}-{key}"));
        common::copy_dir(good, &dir);
        let mut c = config.clone();
        c[key] = value;
        std::fs::write(dir.join("adapter_config.json"), c.to_string()).unwrap();
        out.push((names.to_owned(), dir));
    }
    let pickle = root.join("refused-pickle");
    common::copy_dir(good, &pickle);
    std::fs::remove_file(pickle.join("adapter_model.safetensors")).unwrap();
    std::fs::write(pickle.join("adapter_model.bin"), b"a pickle, never read").unwrap();
    out.push(("adapter_model.bin".to_owned(), pickle));
    out
}

/// A copy of `good` (adapting every projection) whose `target_modules` is `value`.
fn with_targets(good: &Path, dir: &Path, value: Value) -> PathBuf {
    common::copy_dir(good, dir);
    let path = dir.join("adapter_config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    c["target_modules"] = value;
    std::fs::write(&path, c.to_string()).unwrap();
    dir.to_owned()
}

/// A tiny model in `root/model` and an adapter of it on all seven projections in `root/good`.
fn model_and_adapter(root: &Path) -> (PathBuf, PathBuf) {
    let model = root.join("model");
    common::tiny_model(&model, 6);
    let cfg = Qwen3Config::load(&model).unwrap();
    let good = root.join("good");
    common::random_lora(&cfg, 8.0, 5)
        .save_peft(&good, "tiny", None)
        .unwrap();
    (model, good)
}

/// `POST url` with a JSON body: status and body (the inference tests' helper).
fn post(url: &str, body: &Value) -> (u16, Value) {
    crate::inference::rt().block_on(crate::inference::post(&reqwest::Client::new(), url, body))
}

/// Over HTTP: each refused folder is a 400 on `lora_path` whose one-line message names the
/// setting; adapters whose `target_modules` PEFT resolves (`"all-linear"`, a regular
/// expression, a list naming a module Qwen3 lacks) load. At start, `--lora-modules` naming an
/// aLoRA folder stops the server with the setting's name.
#[test]
fn peft_settings_are_refused_by_name_over_http_and_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, good) = model_and_adapter(tmp.path());
    let refused = refused_folders(&good, tmp.path());
    let server = common::InferenceServer::start(&model, &["--enable-lora"]);
    let root = server.url.trim_end_matches("/v1").to_string();
    let load = |name: &str, dir: &Path| {
        post(
            &format!("{root}/v1/load_lora_adapter"),
            &json!({"lora_name": name, "lora_path": dir.display().to_string()}),
        )
    };
    for (i, (names, dir)) in refused.iter().enumerate() {
        let (status, v) = load(&format!("bad{i}"), dir);
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            status == 400
                && v["error"]["param"] == "lora_path"
                && message.contains(names.as_str())
                && !message.contains('\n'),
            "{names}: {status} {v}"
        );
    }
    for (i, targets) in [
        json!("all-linear"),
        json!(r"model\.layers\.\d+\.(self_attn|mlp)\.\w+_proj"),
        json!([
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
            "qkv_proj"
        ]),
    ]
    .into_iter()
    .enumerate()
    {
        let dir = with_targets(&good, &tmp.path().join(format!("form{i}")), targets.clone());
        let (status, v) = load(&format!("form{i}"), &dir);
        assert_eq!(status, 200, "{targets}: {v}");
    }
    drop(server);
    let alora = refused
        .iter()
        .find(|(n, _)| n == "alora_invocation_tokens")
        .map(|(_, d)| d)
        .unwrap();
    let err = common::run_err(
        Command::new(common::host_bin())
            .args(["inference", "--enable-lora", "--port", "0", "-m"])
            .arg(&model)
            .arg("--lora-modules")
            .arg(format!("a={}", alora.display())),
    );
    assert!(
        err.contains("lora_modules") && err.contains("alora_invocation_tokens = [5,17]"),
        "{err}"
    );
}

/// `host model merge-lora` refuses each folder naming the setting and writes nothing (PEFT
/// itself cannot merge an aLoRA adapter; rlhost would have merged it as plain LoRA).
#[test]
fn merge_lora_refuses_peft_settings_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, good) = model_and_adapter(tmp.path());
    for (names, dir) in refused_folders(&good, tmp.path()) {
        let out = tmp.path().join("merged");
        let err = common::run_err(
            Command::new(common::host_bin())
                .args(["model", "merge-lora", "--base"])
                .arg(&model)
                .arg("--adapter")
                .arg(&dir)
                .arg("--out")
                .arg(&out),
        );
        assert!(err.contains(&names), "{names}: {err}");
        assert!(!out.exists(), "{names}: merged anyway");
    }
}

/// `host eval -m MODEL --lora DIR` refuses each folder naming the setting, before any plugin
/// or the model loads (this home has no plugin installed).
#[test]
fn eval_lora_refuses_peft_settings_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, good) = model_and_adapter(tmp.path());
    let home = tmp.path().join("home");
    for (names, dir) in refused_folders(&good, tmp.path()) {
        let err = common::run_err(
            common::host(&home)
                .args(["eval", "arith", "-n", "1", "-m"])
                .arg(&model)
                .arg("--lora")
                .arg(&dir),
        );
        assert!(
            err.contains(&names) && err.contains("--lora"),
            "{names}: {err}"
        );
    }
}

/// `host rl --resume` with LoRA refuses a checkpoint whose adapter holds any refused setting,
/// naming it, before any plugin or model loads (this home has no plugin installed).
#[test]
fn rl_resume_refuses_peft_settings_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, good) = model_and_adapter(tmp.path());
    let home = tmp.path().join("home");
    let lora = ["--model.lora.rank", "4"];
    for (i, (names, dir)) in refused_folders(&good, tmp.path()).into_iter().enumerate() {
        let run = tmp.path().join(format!("run{i}"));
        let step = run.join("checkpoints/step_2");
        std::fs::create_dir_all(step.parent().unwrap()).unwrap();
        std::fs::rename(&dir, &step).unwrap();
        std::fs::write(step.join("orchestrator_state.json"), "{}").unwrap();
        let err = common::run_err(
            common::host(&home)
                .args(crate::rl::rl_args(&model, &run, 3))
                .args(lora)
                .arg("--resume"),
        );
        assert!(
            err.contains(&names) && err.contains("--resume"),
            "{names}: {err}"
        );
    }
}
