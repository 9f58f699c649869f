//! End-to-end: the monitors of `host rl`, `host sft` and `host eval`, read back by the trackers'
//! own code. A real `mlflow server` (sqlite store, loopback port) takes a training run, a failed
//! run, an evaluation and a warm start, and MLflow's client reads every run, param and metric
//! back; TensorBoard's `EventAccumulator` reads the event files and finds every scalar of every
//! `metrics.jsonl` line at its step. A tracking server that is down does not fail the run and
//! is reported once.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::common;

/// An `mlflow server` on a free loopback port with a sqlite store in `dir`, its process group
/// stopped on drop.
struct Mlflow {
    child: Child,
    url: String,
    log: PathBuf,
}

impl Mlflow {
    fn start(python: &Path, dir: &Path) -> Self {
        use std::os::unix::process::CommandExt;
        let port = free_port();
        let log = dir.join("mlflow-server.log");
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(python)
            .args(["-m", "mlflow", "server", "--host", "127.0.0.1", "--port"])
            .arg(port.to_string())
            .arg("--backend-store-uri")
            .arg(format!("sqlite:///{}", dir.join("mlflow.db").display()))
            .arg("--default-artifact-root")
            .arg(dir.join("artifacts"))
            .args(["--workers", "1"])
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .process_group(0)
            .spawn()
            .unwrap();
        let mut m = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
        };
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(180) {
            if let Some(status) = m.child.try_wait().unwrap() {
                panic!("mlflow server exited ({status}):\n{}", m.log_tail());
            }
            let listening = std::net::TcpStream::connect(common::addr_of(&m.url)).is_ok();
            if listening
                && common::raw_request(
                    &m.url,
                    "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                    Vec::new(),
                )
                .0 == 200
            {
                return m;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        panic!("mlflow server did not answer in 180 s:\n{}", m.log_tail());
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Mlflow {
    fn drop(&mut self) {
        let pid = self.child.id() as i32;
        for signal in ["TERM", "KILL"] {
            let _ = Command::new("kill")
                .args(["-s", signal, "--", &format!("-{pid}")])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let _ = self.child.wait();
    }
}

/// A loopback port nothing listens on (bound, then let go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `host rl` on arith for `steps` steps (the rl tests' run) with an evaluation at the start
/// and every 2 steps.
fn rl_args(model: &Path, out: &Path, steps: usize) -> Vec<String> {
    let mut args = crate::rl::rl_args(model, out, steps);
    args.extend(
        [
            "--orchestrator.eval.env",
            "[{id = \"arith\", split = \"test-d1\", num_examples = 4, rollouts_per_example = 2, args = {tools = \"none\"}}]",
            "--orchestrator.eval.interval",
            "2",
            "--orchestrator.eval.at-start",
            "true",
        ]
        .map(String::from),
    );
    args
}

/// Checks, with TensorBoard's and MLflow's own readers, what the runs of
/// [`runs_reach_tensorboard_and_mlflow`] logged. Arguments: the MLflow URI, the rl run's folder,
/// its TensorBoard folder, the sft TensorBoard folder.
const CHECK: &str = r#"
import json, math, re, sys
from tensorboard.backend.event_processing import event_accumulator as ea
from mlflow.tracking import MlflowClient
import numpy as np

uri, run_dir, tb_dir, sft_tb = sys.argv[1:5]

def flatten(prefix, v, out):
    if isinstance(v, bool):
        out[prefix] = float(v)
    elif isinstance(v, (int, float)):
        out[prefix] = float(v)
    elif isinstance(v, dict):
        for k, x in v.items():
            flatten(f"{prefix}/{k}" if prefix else k, x, out)

lines = [json.loads(l) for l in open(f"{run_dir}/metrics.jsonl")]
expected = {}
for l in lines:
    s = {}
    flatten("", l, s)
    s.pop("step")
    for k, v in s.items():
        expected.setdefault(k, {})[l["step"]] = v
assert [l["step"] for l in lines] == [0, 1, 2, 3, 4], lines  # the start's evaluation, 4 steps
assert any(k.startswith("eval/arith/") for k in expected), sorted(expected)

# Exact: TensorBoard holds the f32 rounding of the very f64 metrics.jsonl writes (serde_json
# writes the shortest decimal that reads back as it), and numpy rounds it to f32 the same way.
def same32(a, b):
    a32 = float(np.float32(a))
    return (math.isnan(a32) and math.isnan(b)) or a32 == b

acc = ea.EventAccumulator(tb_dir, size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
acc.Reload()
tags = set(acc.Tags()["scalars"])
assert tags == set(expected), (sorted(tags ^ set(expected)))
points = 0
for k, by_step in expected.items():
    got = {e.step: e.value for e in acc.Scalars(k)}
    assert set(got) == set(by_step), (k, sorted(got), sorted(by_step))
    for step, v in by_step.items():
        assert same32(v, got[step]), (k, step, v, got[step])
        points += 1
config = acc.Tensors("config")[0].tensor_proto.string_val[0].decode()
assert "host rl" in config and "[trainer.optim]" in config and "lr = 0.001" in config, config

sft = ea.EventAccumulator(sft_tb, size_guidance={ea.SCALARS: 0})
sft.Reload()
loss = sft.Scalars("loss")
assert [e.step for e in loss] == [1, 2, 3], loss
assert {"loss", "lr", "grad_norm", "tokens_per_s"} <= set(sft.Tags()["scalars"])

c = MlflowClient(tracking_uri=uri)
exp = c.get_experiment_by_name("e2e")
found = c.search_runs([exp.experiment_id])
assert len(found) == 4, [r.info.run_name for r in found]  # the resume reopened its run
runs = {r.info.run_name: r for r in found}
assert set(runs) == {"tiny-arith", "broken", "eval-arith", "sft"}, sorted(runs)
r = runs["tiny-arith"]
assert r.info.status == "FINISHED", r.info.status
assert r.data.params["trainer.optim.lr"] == "0.001", r.data.params.get("trainer.optim.lr")
assert r.data.params["orchestrator.env.0.id"] == "arith"
assert r.data.tags["mlflow.source.name"] == "host rl"
key = lambda k: re.sub(r"[^\w\-./: ]", "_", k)
metrics = 0
for k, by_step in expected.items():
    finite = {s: v for s, v in by_step.items() if math.isfinite(v)}
    hist = {m.step: m.value for m in c.get_metric_history(r.info.run_id, key(k))}
    assert hist == finite, (k, hist, finite)
    metrics += len(finite)
assert runs["broken"].info.status == "FAILED", runs["broken"].info.status
e = runs["eval-arith"]
assert e.info.status == "FINISHED"
assert "eval/arith/reward" in e.data.metrics and "eval/arith/avg@k".replace("@", "_") in e.data.metrics, e.data.metrics
assert e.data.params["rollouts_per_example"] == "2", e.data.params
s = runs["sft"]
assert [m.step for m in c.get_metric_history(s.info.run_id, "loss")] == [1, 2, 3]
print(f"tensorboard: {points} points of {len(expected)} scalars; mlflow: {metrics} metric values, 4 runs")
"#;

/// One `mlflow server` takes a 3-step `host rl` run (with evaluations) resumed for a fourth step
/// into the same MLflow run, a run that fails after
/// its monitors started, a `host eval -m` and a `host sft`; TensorBoard gets the rl and sft runs.
/// Both trackers' own readers find every scalar of metrics.jsonl at its step, the resolved
/// config as params and as TensorBoard text, and each run's final status.
#[test]
fn runs_reach_tensorboard_and_mlflow() {
    let Some(python) = common::reference_python("runs_reach_tensorboard_and_mlflow") else {
        return;
    };
    let common::Workspace { tmp, home, model } = common::workspace(&["arith"], 5);
    let mlflow = Mlflow::start(&python, tmp.path());
    let run_dir = tmp.path().join("run");
    let tb = tmp.path().join("tb/rl");
    let tracker = |name: &str| {
        [
            "--monitor.mlflow.tracking-uri".to_owned(),
            mlflow.url.clone(),
            "--monitor.mlflow.experiment".into(),
            "e2e".into(),
            "--monitor.mlflow.run-name".into(),
            name.into(),
        ]
    };
    let out = common::run(
        common::host(&home)
            .args(rl_args(&model, &run_dir, 3))
            .arg("--monitor.tensorboard")
            .arg(&tb)
            .args(tracker("tiny-arith")),
    );
    let (stdout, stderr) = common::texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(!stderr.contains("not reachable"), "{stderr}");
    assert!(
        run_dir.join("mlflow-run.json").is_file(),
        "the run id is kept for --resume"
    );
    // Resumed for a fourth step: the same MLflow run goes on (the check below finds 4 runs, and
    // step 4's metrics in tiny-arith), the same TensorBoard folder gets the step.
    let out = common::run(
        common::host(&home)
            .args(rl_args(&model, &run_dir, 4))
            .arg("--resume")
            .arg("--monitor.tensorboard")
            .arg(&tb)
            .args(tracker("tiny-arith")),
    );
    let (stdout, stderr) = common::texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");

    // A run that fails once its monitors are up (its environment is not installed).
    let broken = tmp.path().join("broken");
    let out = common::run(
        common::host(&home)
            .args(rl_args(&model, &broken, 1))
            .args(["--plugin", "not-installed"])
            .args(tracker("broken")),
    );
    assert!(!out.status.success());

    let out = common::run(
        common::host(&home)
            .args(["eval", "arith", "-m"])
            .arg(&model)
            .args([
                "-n",
                "4",
                "-r",
                "2",
                "--max-tokens",
                "8",
                "-a",
                "{\"tools\": \"none\"}",
            ])
            .args(tracker("eval-arith")),
    );
    let (stdout, stderr) = common::texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");

    let data = tmp.path().join("sft.jsonl");
    let conv = |q: &str, a: &str| {
        serde_json::json!({"messages": [
            {"role": "user", "content": q},
            {"role": "assistant", "content": a},
        ]})
        .to_string()
    };
    std::fs::write(
        &data,
        [conv("1+1?", "2"), conv("2+3?", "5"), conv("4*2?", "8")].join("\n"),
    )
    .unwrap();
    let sft_tb = tmp.path().join("tb/sft");
    let out = common::run(
        common::host(&home)
            .args(["sft", "--steps", "3", "--batch-size", "2", "--data"])
            .arg(&data)
            .arg("-m")
            .arg(&model)
            .arg("--out")
            .arg(tmp.path().join("warm"))
            .arg("--monitor.tensorboard")
            .arg(&sft_tb)
            .args(tracker("sft")),
    );
    let (stdout, stderr) = common::texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");

    let check = Command::new(&python)
        .args(["-c", CHECK, &mlflow.url])
        .args([&run_dir, &tb, &sft_tb])
        .output()
        .unwrap();
    let (stdout, stderr) = common::texts(&check);
    assert!(
        check.status.success(),
        "{stdout}{stderr}\nserver log:\n{}",
        mlflow.log_tail()
    );
    println!("{stdout}");
}

/// A tracking server that is not there: the run trains every step, writes TensorBoard and
/// metrics.jsonl in full, exits 0, and says the server is unreachable once, not every step.
#[test]
fn a_tracker_that_is_down_does_not_fail_the_run() {
    let common::Workspace { tmp, home, model } = common::workspace(&["arith"], 6);
    let run_dir = tmp.path().join("run");
    let tb = tmp.path().join("tb");
    let out = common::run(
        common::host(&home)
            .args(rl_args(&model, &run_dir, 3))
            .arg("--monitor.tensorboard")
            .arg(&tb)
            .arg("--monitor.mlflow.tracking-uri")
            .arg(format!("http://127.0.0.1:{}", free_port())),
    );
    let (stdout, stderr) = common::texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(
        stderr.matches("not reachable").count(),
        1,
        "the outage is reported once:\n{stderr}"
    );
    assert!(
        stderr.contains("not sent") && stderr.contains("metrics.jsonl"),
        "what was not sent is said at the end:\n{stderr}"
    );
    let lines = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 4, "{lines}");
    let events: Vec<_> = std::fs::read_dir(&tb)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("tfevents"))
        .collect();
    assert_eq!(events.len(), 1, "one event file");
}

/// Monitor keys that cannot act are refused by name before anything runs.
#[test]
fn monitor_keys_that_cannot_act_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("m");
    common::tiny_model(&model, 1);
    let err = common::run_err(
        common::host(tmp.path())
            .args([
                "sft", "--steps", "1", "--data", "x.jsonl", "--out", "o", "-m",
            ])
            .arg(&model)
            .args(["--monitor.prometheus-port", "9400"]),
    );
    assert!(
        err.contains("monitor.prometheus_port") && err.contains("no inference engine"),
        "{err}"
    );
    let err = common::run_err(common::host(tmp.path()).args([
        "eval",
        "arith",
        "-b",
        "http://127.0.0.1:9",
        "--monitor.prometheus-port",
        "9400",
    ]));
    assert!(err.contains("own /metrics"), "{err}");
    let err = common::run_err(common::host(tmp.path()).args([
        "rl",
        "--plugin",
        "arith",
        "--model.name",
        model.to_str().unwrap(),
        "--monitor.mlflow.run-name",
        "x",
    ]));
    assert!(
        err.contains("monitor.mlflow.run_name") && err.contains("tracking_uri"),
        "{err}"
    );
}

/// Parses Prometheus text with the official parser: `{name: [(labels, value)]}` as JSON.
const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = {}
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        out.setdefault(s.name, []).append([s.labels, s.value])
print(json.dumps(out))
"#;

/// `host rl --monitor.prometheus-port` serves the in-process engine's metrics (vLLM's names)
/// and the last step's figures while it trains: scraped mid-run and parsed by
/// `prometheus_client`, the engine has generated, the weights have been updated, and the
/// figures are those of the step metrics.jsonl has.
#[test]
fn rl_serves_prometheus_metrics_while_it_trains() {
    let Some(python) = common::reference_python("rl_serves_prometheus_metrics_while_it_trains")
    else {
        return;
    };
    let common::Workspace { tmp, home, model } = common::workspace(&["arith"], 7);
    let run_dir = tmp.path().join("run");
    let port = free_port();
    let mut child = common::host(&home)
        .args(rl_args(&model, &run_dir, 40))
        .args(["--monitor.prometheus-port", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let parse = |text: &str| -> serde_json::Value {
        let out = common::run_python(&python, PARSE, text);
        assert!(out.status.success(), "the parser refused:\n{text}");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let value = |m: &serde_json::Value, name: &str| -> f64 {
        m[name]
            .as_array()
            .map_or(0.0, |s| s.iter().map(|x| x[1].as_f64().unwrap()).sum())
    };
    let started = Instant::now();
    let scraped = loop {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "no step shown in 300 s"
        );
        assert!(child.try_wait().unwrap().is_none(), "host rl ended early");
        if std::net::TcpStream::connect(common::addr_of(&url)).is_ok() {
            let (code, ctype, text) = common::raw_request(
                &url,
                "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                Vec::new(),
            );
            assert_eq!(code, 200, "{text}");
            assert!(ctype.starts_with("text/plain; version=0.0.4"), "{ctype}");
            let m = parse(&text);
            if value(&m, "rlhost:train_step") >= 2.0 {
                break m;
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    let _ = child.kill();
    let _ = child.wait();
    let step = value(&scraped, "rlhost:train_step");
    assert!(
        value(&scraped, "vllm:generation_tokens_total") > 0.0,
        "{scraped}"
    );
    assert!(
        value(&scraped, "vllm:prompt_tokens_total") > 0.0,
        "{scraped}"
    );
    assert!(
        value(&scraped, "rlhost:weight_updates_total") >= step,
        "every step's weights reached the engine: {scraped}"
    );
    assert_eq!(
        scraped["vllm:generation_tokens_total"][0][0]["model_name"],
        model.display().to_string()
    );
    // The figures are those of the step's metrics.jsonl line.
    let lines = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    let line: serde_json::Value = lines
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["step"].as_f64() == Some(step))
        .expect("the step shown is logged");
    let figure = |key: &str| {
        scraped["rlhost:train_figure"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s[0]["key"] == key)
            .map(|s| s[1].as_f64().unwrap())
    };
    for key in ["reward", "loss", "grad_norm", "samples"] {
        assert_eq!(figure(key), line[key].as_f64(), "{key}");
    }
}
