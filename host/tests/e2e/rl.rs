//! End-to-end: `host rl` as a user runs it, on the installed `arith` plugin and a tiny Qwen3:
//! steps run through the real rollout loop, engine and trainer; metrics.jsonl gets one line per
//! step; checkpoints are written atomically; a run killed mid-way and resumed ends at the same
//! step count with a valid checkpoint, and its metrics.jsonl has each step once; bad
//! configuration fails fast naming the key.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common;

pub(crate) fn rl_args(model: &std::path::Path, out: &std::path::Path, steps: usize) -> Vec<String> {
    [
        "rl",
        "--plugin",
        "arith",
        "--orchestrator.env[0].args",
        "{tools = \"none\"}",
        "--orchestrator.batch-size",
        "8",
        "--orchestrator.rollouts-per-example",
        "4",
        "--orchestrator.sampling.max-tokens",
        "12",
        "--orchestrator.max-concurrent",
        "8",
        "--inference.max-model-len",
        "256",
        "--inference.max-batch-size",
        "8",
        "--trainer.data.seq-len",
        "256",
        "--trainer.optim.lr",
        "1e-3",
        "--trainer.ckpt.interval",
        "2",
        "--trainer.ckpt.keep",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        "--trainer.max-steps".to_string(),
        steps.to_string(),
        "--orchestrator.max-steps".to_string(),
        steps.to_string(),
        "--model.name".into(),
        model.display().to_string(),
        "--output-dir".into(),
        out.display().to_string(),
    ])
    .collect()
}

/// `args` without the `--inference.*` flags and their values.
fn without_inference(args: Vec<String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        if a.starts_with("--inference.") {
            it.next();
        } else {
            out.push(a);
        }
    }
    out
}

/// `host rl` (3 synchronous steps, `extra` flags) generating on the server at `url`, then the
/// server's `/v1/models`; asserts the run succeeded.
fn remote_run(
    home: &std::path::Path,
    model: &std::path::Path,
    run_dir: &std::path::Path,
    url: &str,
    extra: &[String],
) -> serde_json::Value {
    let out = common::run(
        common::host(home)
            // The inference section configures the colocated engine; a remote run refuses it.
            .args(without_inference(rl_args(model, run_dir, 3)))
            .args(extra)
            .args([
                "--orchestrator.client.base-urls",
                &format!("[\"{url}\"]"),
                "--orchestrator.async-level",
                "0",
            ]),
    );
    let (stdout, stderr) = common::texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let models = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async { reqwest::get(format!("{url}/models")).await?.text().await })
        .unwrap();
    serde_json::from_str(&models).unwrap()
}

/// The lines of a run's metrics.jsonl.
fn metric_lines(run_dir: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Two training environments mixed 3:1 and an evaluation every 2 steps (and at the start),
/// in one run: per-environment metrics on every step line, evaluation results at steps 0, 2
/// and 4 only, the mixture's proportions within tolerance of the weights, and the objective's
/// and trainer's statistics on every line.
#[test]
fn a_weighted_mixture_with_evaluations_during_training() {
    let common::Workspace { tmp, home, model } = common::workspace(&["arith", "arith-tools"], 4);
    let run_dir = tmp.path().join("mix");
    let orch = tmp.path().join("orch.toml");
    std::fs::write(
        &orch,
        r#"
max_steps = 4
batch_size = 32
rollouts_per_example = 2
max_concurrent = 16
async_level = 1

[sampling]
max_tokens = 8

[[env]]
id = "arith"
split = "train-d1"
weight = 3.0
args = { tools = "none" }

[[env]]
id = "arith-tools"
split = "train"
weight = 1.0

[eval]
interval = 2
at_start = true

[[eval.env]]
id = "arith"
split = "test-d1"
num_examples = 4
rollouts_per_example = 2
args = { tools = "none" }
"#,
    )
    .unwrap();
    let out = common::run(common::host(&home).args([
        "rl",
        "--orchestrator",
        "@",
        orch.to_str().unwrap(),
        "--model.name",
        model.to_str().unwrap(),
        "--trainer.max-steps",
        "4",
        "--trainer.data.seq-len",
        "1024",
        "--inference.max-model-len",
        "1024",
        "--inference.enable-auto-tool-choice",
        "true",
        "--output-dir",
        run_dir.to_str().unwrap(),
    ]));
    let (stdout, stderr) = common::texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let lines = metric_lines(&run_dir);
    assert_eq!(
        lines.len(),
        5,
        "the start evaluation and 4 steps: {lines:?}"
    );
    let evaluated: Vec<u64> = lines
        .iter()
        .filter(|l| l.get("eval/arith/reward").is_some())
        .map(|l| l["step"].as_u64().unwrap())
        .collect();
    assert_eq!(evaluated, [0, 2, 4]);
    for l in lines
        .iter()
        .filter(|l| l.get("eval/arith/reward").is_some())
    {
        // The weights after `step` steps, the policy the engine served then.
        assert_eq!(l["eval/step"], l["step"], "{l}");
        assert_eq!(l["eval/policy_version"], l["step"], "{l}");
        assert!(l["eval/arith/pass@2"].as_f64().is_some(), "{l}");
        assert!(l["eval/arith/correct"].as_f64().is_some(), "{l}");
        assert!(l["eval_s"].as_f64().unwrap() > 0.0, "{l}");
    }
    assert_eq!(lines[1]["step"], 1);
    assert_eq!(lines[1]["eval_s"], 0.0, "no evaluation after step 1");
    assert!(lines[1].get("eval/step").is_none());
    let (mut a, mut t) = (0.0, 0.0);
    for l in &lines[1..] {
        for k in [
            "entropy",
            "mismatch_kl",
            "masked_frac",
            "clipped_frac",
            "kl",
            "stale_dropped",
            "rollout_tokens_per_s",
            "sync_s",
        ] {
            assert!(l.get(k).is_some(), "{k} missing: {l}");
        }
        a += l["env/arith/groups"].as_f64().unwrap_or(0.0);
        t += l["env/arith-tools/groups"].as_f64().unwrap_or(0.0);
        assert!(l.get("env/arith/reward").is_some(), "{l}");
    }
    assert_eq!(a + t, 64.0);
    // 64 independent draws at 3:1: the share's standard deviation is √(0.75·0.25/64) ≈ 0.054;
    // within three of them (the draws are seeded: the same on every machine).
    let share = a / (a + t);
    let sd = (0.75f64 * 0.25 / 64.0).sqrt();
    assert!(
        (share - 0.75).abs() < 3.0 * sd,
        "arith got {a} of 64 groups"
    );
    assert!(stdout.contains("arith-tools: reward"), "{stdout}");
    for step in [0, 2, 4] {
        assert!(
            stdout.contains(&format!("eval after step {step} (policy {step}")),
            "{stdout}"
        );
    }
    assert!(run_dir.join("curves.png").is_file());
}

/// `max_off_policy_steps = 0` with `async_level = 2`: the orchestrator still starts batches
/// two steps ahead, but whatever was generated by weights the trainer has since replaced is
/// redone before it trains, so every step trains a full batch on policy (`policy_lag` 0) and
/// counts what it redid. How many rollouts go stale depends on timing; the orchestrator's
/// unit test makes it deterministic.
#[test]
fn rollouts_older_than_max_off_policy_steps_are_redone() {
    let common::Workspace { tmp, home, model } = common::workspace(&["arith"], 5);
    let run_dir = tmp.path().join("stale");
    let mut args = rl_args(&model, &run_dir, 3);
    args.extend(
        [
            "--orchestrator.async-level",
            "2",
            "--orchestrator.max-off-policy-steps",
            "0",
            "--trainer.ckpt.interval",
            "0",
        ]
        .map(String::from),
    );
    let out = common::run(common::host(&home).args(args));
    let (stdout, stderr) = common::texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let lines = metric_lines(&run_dir);
    assert_eq!(lines.len(), 3);
    assert_eq!(
        lines[0]["stale_dropped"], 0,
        "step 1 is generated by the initial weights"
    );
    for l in &lines {
        assert_eq!(l["samples"], 8, "a full batch: {l}");
        assert_eq!(l["policy_lag"], 0, "{l}");
        assert!(l["stale_dropped"].as_u64().is_some(), "{l}");
    }
    assert!(stdout.contains("| stale "), "{stdout}");
}

/// `inference.enable_sleep_mode` with `async_level = 0`: the colocated engine releases its KV
/// slots and prefix cache for every training step (each line reports the bytes) and takes them
/// back for the next batch, which still trains on policy. With generation ahead of the trainer
/// (`async_level` > 0) the option is refused, naming both keys.
#[test]
fn sleep_mode_lends_the_engine_memory_to_each_training_step() {
    let common::Workspace { tmp, home, model } = common::workspace(&["arith"], 6);
    let run_dir = tmp.path().join("sleep");
    let mut args = rl_args(&model, &run_dir, 3);
    args.extend(["--inference.enable-sleep-mode", "true"].map(String::from));
    let refused = common::run_err(common::host(&home).args(&args));
    assert!(
        refused.contains("inference.enable_sleep_mode") && refused.contains("async_level"),
        "{refused}"
    );
    args.extend(["--orchestrator.async-level", "0"].map(String::from));
    let out = common::run(common::host(&home).args(&args));
    let (stdout, stderr) = common::texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let lines = metric_lines(&run_dir);
    assert_eq!(lines.len(), 3);
    for l in &lines {
        assert!(l["engine_released_bytes"].as_u64().unwrap() > 0, "{l}");
        assert_eq!(l["policy_lag"], 0, "{l}");
        assert_eq!(l["samples"], 8, "{l}");
    }
}

#[test]
fn steps_checkpoints_and_resume_after_a_kill() {
    let common::Workspace { tmp, home, model } = common::workspace(&["arith"], 2);
    let run_dir = tmp.path().join("run");
    let steps = 12;
    // Start, wait for the first checkpoint, kill hard.
    // The tiny model scores 0 on every rollout: advantages are all 0, and the trainer would
    // skip every sample. Run them, so the trainer's statistics below have tokens behind them.
    let run = || {
        let mut c = common::host(&home);
        c.args(rl_args(&model, &run_dir, steps))
            .args(["--trainer.skip-zero-advantage", "false"]);
        c
    };
    let mut child = run()
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !run_dir
        .join("checkpoints/step_2/orchestrator_state.json")
        .is_file()
    {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no checkpoint appeared"
        );
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // Resume to the end.
    let stdout = common::run_ok(run().arg("--resume"));
    assert!(stdout.contains(&format!("step   {steps} |")), "{stdout}");
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.last().unwrap()["step"], steps);
    for l in &lines {
        assert_eq!(l["samples"], 8, "{l}");
        // No difficulty filtering in configs/arith/rl: both groups of 4 are trained on.
        assert_eq!(l["groups"], 2, "{l}");
        assert!(l["ratio_mean"].as_f64().unwrap() > 0.99, "{l}");
        // configs/arith/rl: async_level 1.
        assert!(l["policy_lag"].as_u64().unwrap() <= 1, "{l}");
    }
    // The reward and loss curves.
    let png = std::fs::read(run_dir.join("curves.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    // The newest checkpoints are complete and load; older ones were pruned.
    let ckpts: Vec<String> = std::fs::read_dir(run_dir.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert!(ckpts.contains(&format!("step_{steps}")), "{ckpts:?}");
    assert!(
        ckpts.iter().filter(|c| c.starts_with("step_")).count() <= 2,
        "{ckpts:?}"
    );
    common::run_ok(
        common::host(&home)
            .args(["model", "info", "--check"])
            .arg(run_dir.join(format!("checkpoints/step_{steps}"))),
    );
    common::run_ok(
        common::host(&home)
            .args([
                "eval",
                "arith",
                "-n",
                "2",
                "-r",
                "1",
                "--max-tokens",
                "8",
                "-a",
                "{\"tools\": \"none\"}",
                "-m",
            ])
            .arg(run_dir.join("final")),
    );
}

/// A crash after the newest checkpoint leaves metrics.jsonl lines of steps the resumed run
/// redoes (and maybe a line torn mid-write): resuming drops them first, so the log (and
/// curves.png drawn from it) has each step once, in order.
#[test]
fn resume_redoes_the_steps_after_its_checkpoint_without_duplicate_metrics() {
    let common::Workspace { tmp, home, model } = common::workspace(&["arith"], 4);
    let run_dir = tmp.path().join("run");
    let steps_of = || -> Vec<u64> {
        std::fs::read_to_string(run_dir.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .unwrap_or_else(|e| panic!("{l:?}: {e}"))["step"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    };
    // TensorBoard as well: the resumed run's points replace the redone steps' there too.
    let tb = tmp.path().join("tb");
    let out = common::run(
        common::host(&home)
            .args(rl_args(&model, &run_dir, 4))
            .arg("--monitor.tensorboard")
            .arg(&tb),
    );
    assert!(out.status.success(), "{}", common::texts(&out).1);
    assert_eq!(steps_of(), [1, 2, 3, 4]);
    // As if the process died after logging step 4 but before its checkpoint was published,
    // halfway through writing the line of step 5.
    std::fs::remove_dir_all(run_dir.join("checkpoints/step_4")).unwrap();
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(run_dir.join("metrics.jsonl"))
            .unwrap();
        write!(f, "{{\"step\": 5, \"rew").unwrap();
    }
    let out = common::run(
        common::host(&home)
            .args(rl_args(&model, &run_dir, 5))
            .arg("--resume")
            .arg("--monitor.tensorboard")
            .arg(&tb),
    );
    let (stdout, stderr) = common::texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("step    3 |"),
        "resumed at step 3: {stdout}"
    );
    assert_eq!(steps_of(), [1, 2, 3, 4, 5], "each step once, in order");
    if let Some(python) = common::reference_python("resume_redoes_the_steps (tensorboard)") {
        // TensorBoard's reader, with the session start the resumed run wrote at step 3: each
        // step once, with the value metrics.jsonl kept (the redone steps' new values).
        let check = std::process::Command::new(python)
            .args([
                "-c",
                r#"
import json, sys
import numpy as np
from tensorboard.backend.event_processing import event_accumulator as ea
acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0})
acc.Reload()
got = [(e.step, e.value) for e in acc.Scalars("rollout_s")]
want = [(l["step"], float(np.float32(l["rollout_s"]))) for l in map(json.loads, open(sys.argv[2]))]
assert got == want, (got, want)
"#,
            ])
            .arg(&tb)
            .arg(run_dir.join("metrics.jsonl"))
            .output()
            .unwrap();
        let (o, e) = common::texts(&check);
        assert!(check.status.success(), "{o}{e}");
    }
    // A fresh run into the same folder would mix the two runs: refused, nothing touched.
    let metrics = std::fs::read(run_dir.join("metrics.jsonl")).unwrap();
    let out = common::run(common::host(&home).args(rl_args(&model, &run_dir, 2)));
    let stderr = common::texts(&out).1;
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("holds an earlier run") && stderr.contains("--resume"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(run_dir.join("metrics.jsonl")).unwrap(),
        metrics
    );
    // Metrics alone (no checkpoint) are an earlier run too.
    std::fs::remove_dir_all(run_dir.join("checkpoints")).unwrap();
    let out = common::run(common::host(&home).args(rl_args(&model, &run_dir, 2)));
    let stderr = common::texts(&out).1;
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("metrics.jsonl is not empty"), "{stderr}");
    assert_eq!(
        std::fs::read(run_dir.join("metrics.jsonl")).unwrap(),
        metrics
    );
}

#[test]
fn bad_configuration_fails_fast() {
    let tmp = tempfile::tempdir().unwrap();
    let stderr = common::run_err(common::host(tmp.path()).args([
        "rl",
        "--plugin",
        "arith",
        "--trainer.optim.lrr",
        "1",
    ]));
    assert!(
        stderr.contains("lrr") && stderr.contains("trainer.optim"),
        "{stderr}"
    );
    let out = common::run(common::host(tmp.path()).args(["rl", "--plugin", "nothere"]));
    assert!(common::texts(&out).1.contains("host env install nothere"));
}

/// Remote mode: `host inference` in its own process generates; the trainer writes each step's
/// weights to a folder and calls `/update_weights`; the policy version the orchestrator sees
/// increases with the steps.
#[test]
fn remote_servers_generate_and_receive_weights() {
    let common::Workspace { tmp, home, model } = common::workspace(&["arith"], 3);
    let server = common::InferenceServer::start(&model, &[]);
    let url = server.url.clone();
    let run_dir = tmp.path().join("remote");
    let models = remote_run(&home, &model, &run_dir, &url, &[]);
    drop(server);
    assert_eq!(
        models["data"][0]["policy_version"], 3,
        "three updates reached the server"
    );
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    // Synchronous: every batch came from the newest policy.
    assert!(lines.iter().all(|l| l["policy_lag"] == 0), "{lines:?}");
    assert!(run_dir.join("weights/step_3/model.safetensors").is_file());
}

/// `host rl` with LoRA (`--model.lora.*`, which lands in `[trainer]`): in process, the engine
/// serves the trainer's adapter as `policy` and takes it each step (the sampler's and the
/// trainer's log-probs agree: ratio 1), checkpoints hold the adapter and `OUTPUT/final` is a
/// PEFT folder of the base model, whose files are untouched; remote, a `host inference
/// --enable-lora` server loads each step's adapter folder in place (three updates, its base
/// model unchanged) and the folders hold the adapter, not the model. Settings the run cannot
/// honour are refused by key.
#[test]
fn lora_runs_in_process_and_on_remote_servers() {
    let common::Workspace { tmp, home, model } = common::workspace(&["arith"], 8);
    let lora = ["--model.lora.rank", "8", "--model.lora.alpha", "16"].map(String::from);
    for (flag, key) in [
        ("--model.lora.rank", "trainer.model.lora.rank"),
        ("--orchestrator.model.lora.rank", "lora"),
    ] {
        let err = common::run_err(
            common::host(&home)
                .args(rl_args(&model, &tmp.path().join("bad"), 1))
                .args([flag, "0"]),
        );
        assert!(err.contains(key), "{flag}: {err}");
    }
    let before = std::fs::read(model.join("model.safetensors")).unwrap();
    let run_dir = tmp.path().join("lora");
    // Every reward 0 (the tiny model): samples run anyway, so the ratios below are measured.
    let out = common::run(
        common::host(&home)
            .args(rl_args(&model, &run_dir, 3))
            .args(&lora)
            .args(["--trainer.skip-zero-advantage", "false"]),
    );
    let (stdout, stderr) = common::texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let lines = metric_lines(&run_dir);
    assert_eq!(lines.len(), 3);
    for l in &lines {
        assert!(l["ratio_mean"].as_f64().unwrap() > 0.99, "{l}");
    }
    let last = run_dir.join("checkpoints/step_2");
    for dir in [run_dir.join("final"), last] {
        let config: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("adapter_config.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(config["r"], 8, "{}", dir.display());
        assert_eq!(config["lora_alpha"], 16.0);
        assert_eq!(
            config["base_model_name_or_path"],
            model.display().to_string()
        );
        assert!(dir.join("adapter_model.safetensors").is_file());
        assert!(!dir.join("model.safetensors").exists());
    }
    assert_eq!(
        std::fs::read(model.join("model.safetensors")).unwrap(),
        before
    );

    let server = common::InferenceServer::start(&model, &["--enable-lora"]);
    let url = server.url.clone();
    let run_dir = tmp.path().join("remote-lora");
    let models = remote_run(&home, &model, &run_dir, &url, &lora);
    drop(server);
    assert_eq!(models["data"][1]["id"], "policy", "{models}");
    assert_eq!(
        models["data"][0]["policy_version"], 3,
        "three in-place loads reached the server"
    );
    let lines = metric_lines(&run_dir);
    assert_eq!(lines.len(), 3);
    assert!(lines.iter().all(|l| l["policy_lag"] == 0), "{lines:?}");
    let published = run_dir.join("weights/step_3");
    assert!(published.join("adapter_model.safetensors").is_file());
    assert!(!published.join("model.safetensors").exists());
}

/// `[trainer.model.lora]`'s rank is bounded by the policy's shape (the bound stated), from flags
/// (`--trainer.model.lora.rank`, `--model.lora.rank`) or a TOML file alike, and other values LoRA
/// cannot take are refused by key: all before anything is loaded or written (no output folder;
/// the plugin is not even installed in this home).
#[test]
fn lora_settings_are_checked_before_any_work() {
    use rlhost::model::{LoraTarget, Qwen3Config};
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    common::tiny_model(&model, 2);
    let (out, inp) = LoraTarget::KProj.shape(&Qwen3Config::load(&model).unwrap());
    let bound = out.min(inp).to_string();
    let toml = |name: &str, text: &str| {
        let path = tmp.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let huge = toml("huge.toml", "[model.lora]\nrank = 1000000000\n");
    let negative = toml("negative.toml", "[model.lora]\nalpha = -1.0\n");
    let unknown = toml("unknown.toml", "[model.lora]\ntarget_modules = [\"qkv\"]\n");
    let run_dir = tmp.path().join("run");
    let cases: [(Vec<&str>, Vec<&str>); 5] = [
        (
            vec!["--trainer.model.lora.rank", "1000000000"],
            vec!["trainer.model.lora.rank", "1000000000", &bound, "k_proj"],
        ),
        (
            vec!["--model.lora.rank", "1000000000"],
            vec!["trainer.model.lora.rank", &bound],
        ),
        (
            vec!["--trainer", "@", &huge],
            vec!["trainer.model.lora.rank", &bound],
        ),
        (
            vec!["--trainer", "@", &negative],
            vec!["trainer.model.lora.alpha"],
        ),
        (
            vec!["--trainer", "@", &unknown],
            vec!["qkv", "target_modules"],
        ),
    ];
    for (extra, wanted) in cases {
        let err = common::run_err(
            common::host(tmp.path())
                .args(rl_args(&model, &run_dir, 1))
                .args(&extra),
        );
        for w in &wanted {
            assert!(err.contains(w), "{extra:?}: {w:?} not in: {err}");
        }
        assert!(!run_dir.exists(), "{extra:?}: the run started");
    }
}

/// A `max_tokens` that leaves no room for a prompt in the generators' context is refused
/// before any rollout, naming the key and the context: the colocated engine's (arith's preset
/// `inference.max_model_len` of 1,024 here; `max_tokens` above it is refused by the config
/// check already, equal to it by this one) and a remote server's (its `--max-model-len`).
#[test]
fn lengths_are_checked_before_any_rollout() {
    let common::Workspace { tmp, home, model } = common::workspace(&["arith"], 4);
    let started = Instant::now();
    let args: Vec<String> = without_inference(rl_args(&model, &tmp.path().join("a"), 2));
    let err = common::run_err(
        common::host(&home)
            .args(&args)
            .args(["--orchestrator.sampling.max-tokens", "1024"]),
    );
    assert!(
        err.contains("orchestrator.sampling.max_tokens = 1024") && err.contains("context of 1024"),
        "{err}"
    );
    let server = common::InferenceServer::start(&model, &["--max-model-len", "256"]);
    let err = common::run_err(
        common::host(&home)
            .args(without_inference(rl_args(&model, &tmp.path().join("b"), 2)))
            .args([
                "--orchestrator.sampling.max-tokens",
                "300",
                "--orchestrator.client.base-urls",
                &format!("[\"{}\"]", server.url),
            ]),
    );
    assert!(
        err.contains("max_tokens = 300") && err.contains("256"),
        "{err}"
    );
    assert!(!tmp.path().join("b/metrics.jsonl").exists(), "no step ran");
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// An environment's declared reward plugins score its rollouts in `host rl` as in `host eval`
/// (both load environments with `plugin::install::load_installed`): fixture-judged weighs
/// `exact_match`, which only the reward plugin rlhost/exact-match returns. The run's step lines
/// carry the reward plugin's metrics and the evaluation's summary the same names. Dynamic
/// sampling (`orchestrator.filter_groups`) filters on a metric of either (the fixture's own
/// `length` here), refuses one that no plugin reports (listing those that do), and every step
/// accounts for its groups: trained + filtered = the step's 2 + resampled. The soft overlong
/// buffer's count is on every line.
#[test]
fn reward_plugins_score_rl_rollouts_as_in_eval_with_dynamic_sampling() {
    let common::Workspace { tmp, home, model } =
        common::workspace(&["exact-match", "fixture-judged"], 4);
    let args = |dir: &str| -> Vec<String> {
        let mut a = rl_args(&model, &tmp.path().join(dir), 3);
        // rl_args trains arith with its tools off; this fixture takes no arguments.
        let at = a
            .iter()
            .position(|x| x == "--orchestrator.env[0].args")
            .unwrap();
        a.drain(at..at + 2);
        a[2] = "fixture-judged".into();
        a
    };
    let err = common::run_err(
        common::host(&home)
            .args(args("bad"))
            .args(["--orchestrator.filter-groups.metric", "nope"]),
    );
    assert!(
        err.contains("orchestrator.filter_groups.metric")
            && err.contains("exact_match")
            && err.contains("length"),
        "{err}"
    );
    common::run_ok(common::host(&home).args(args("run")).args([
        "--orchestrator.filter-groups.metric",
        "length",
        "--orchestrator.filter-groups.max-num-gen-batches",
        "3",
        "--orchestrator.overlong-buffer.len",
        "4",
    ]));
    let lines = metric_lines(&tmp.path().join("run"));
    assert_eq!(lines.len(), 3);
    for l in &lines {
        let metrics = l["metrics"].as_object().unwrap();
        for name in ["exact_match", "has_answer", "length"] {
            assert!(metrics.contains_key(name), "{name} missing: {l}");
        }
        let count = |k: &str| l[k].as_u64().unwrap_or_else(|| panic!("{k}: {l}"));
        assert_eq!(
            count("groups") + count("filtered_groups"),
            2 + count("resampled_groups"),
            "{l}"
        );
        assert!(
            count("resampled_groups") <= 2 * 2,
            "two more rounds at most: {l}"
        );
        assert!(count("informative_groups") <= count("groups"), "{l}");
        if count("groups") < 2 {
            assert!(
                count("resampled_groups") > 0,
                "short of groups, it resampled: {l}"
            );
        }
        assert!(count("overlong_penalized") <= 4 * count("groups"), "{l}");
        assert!(l["elapsed_s"].as_f64().unwrap() > 0.0, "{l}");
    }
    let save = tmp.path().join("eval");
    common::run_ok(
        common::host(&home)
            .args([
                "eval",
                "fixture-judged",
                "-n",
                "2",
                "-r",
                "2",
                "--max-tokens",
                "8",
            ])
            .arg("-m")
            .arg(&model)
            .arg("-s")
            .arg(&save),
    );
    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(save.join("fixture-judged/summary.json")).unwrap(),
    )
    .unwrap();
    let text = summary.to_string();
    for name in ["exact_match", "has_answer", "length"] {
        assert!(
            text.contains(&format!("\"{name}\"")),
            "{name} missing: {text}"
        );
    }
}

/// The pass-rate curriculum (`orchestrator.curriculum`) resumes exactly: a run stopped at its
/// step-3 checkpoint and resumed to step 6 ends with the curriculum state of the uninterrupted
/// run (every example's draws, streaks and solves), and reports the same pool counts on every
/// step (`env/arith/pool`, `retired`, `hard`), although its batches were generated one step
/// ahead (async_level 1) across the restart. Resuming a checkpoint saved without a curriculum
/// with one is refused.
#[test]
fn the_curriculum_resumes_exactly() {
    let common::Workspace { tmp, home, model } = common::workspace(&["arith"], 4);
    let args = |dir: &std::path::Path, steps: usize| -> Vec<String> {
        let mut a = rl_args(&model, dir, steps);
        a.extend(
            [
                "--orchestrator.curriculum.hard-weight",
                "0.5",
                "--orchestrator.async-level",
                "1",
                "--trainer.ckpt.interval",
                "3",
                "--trainer.ckpt.keep",
                "5",
            ]
            .map(String::from),
        );
        a
    };
    let (whole, split) = (tmp.path().join("whole"), tmp.path().join("split"));
    common::run_ok(common::host(&home).args(args(&whole, 6)));
    common::run_ok(common::host(&home).args(args(&split, 3)));
    common::run_ok(common::host(&home).args(args(&split, 6)).arg("--resume"));
    let state = |dir: &std::path::Path| -> serde_json::Value {
        let text = std::fs::read_to_string(dir.join("checkpoints/step_6/orchestrator_state.json"))
            .unwrap();
        serde_json::from_str(&text).unwrap()
    };
    let (a, b) = (state(&whole), state(&split));
    assert_eq!(a["step"], 6);
    // Versions 5 and 6 (async_level 1): after five and six steps of two groups each.
    let drawn: u64 = a["curriculum"]["versions"]["6"]["envs"][0]["drawn"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap())
        .sum();
    assert_eq!(drawn, 12, "{a}");
    assert_eq!(
        a["curriculum"], b["curriculum"],
        "the resumed run's curriculum"
    );
    let counts = |dir: &std::path::Path| -> Vec<(f64, f64, f64)> {
        metric_lines(dir)
            .iter()
            .map(|l| {
                let get = |k: &str| l[format!("env/arith/{k}")].as_f64().unwrap();
                (get("pool"), get("retired"), get("hard"))
            })
            .collect()
    };
    let (ca, cb) = (counts(&whole), counts(&split));
    assert_eq!(ca.len(), 6);
    assert_eq!(ca, cb);
    // The tiny model solves nothing: every example drawn is hard, none retired.
    assert!(
        ca.iter()
            .all(|&(pool, retired, _)| retired == 0.0 && pool > 100.0)
    );
    assert!(
        ca.windows(2).all(|w| w[1].2 >= w[0].2) && ca[5].2 > 0.0,
        "{ca:?}"
    );
    // A checkpoint without curriculum state: refused with a curriculum, by name.
    let plain = tmp.path().join("plain");
    common::run_ok(
        common::host(&home)
            .args(rl_args(&model, &plain, 3))
            .args(["--trainer.ckpt.interval", "3"]),
    );
    let err = common::run_err(common::host(&home).args(args(&plain, 4)).arg("--resume"));
    assert!(err.contains("curriculum"), "{err}");
}
