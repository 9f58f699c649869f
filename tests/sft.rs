//! End-to-end: a warm start the way the demo does it. A scripted teacher (an OpenAI-compatible
//! server on loopback) plays arith through `host eval -s`, with the real environment and sandbox;
//! `host sft --only-correct` trains a tiny Qwen3 on those rollouts; the result calls the python
//! tool in the format it was shown (hermes calls the server parses), which the untrained model
//! never does.

mod common;

use std::process::{Command, Stdio};

use serde_json::Value;

fn eval(home: &std::path::Path, model: &std::path::Path) -> Value {
    let out = common::run(
        common::host(home)
            .args([
                "eval",
                "arith",
                "-n",
                "12",
                "-r",
                "1",
                "--temperature",
                "0",
                "--max-tokens",
                "40",
                "--json",
                "-m",
            ])
            .arg(model),
    );
    let (stdout, stderr) = common::texts(&out);
    assert!(out.status.success(), "{stderr}");
    serde_json::from_str::<Value>(&stdout).unwrap()[0].clone()
}

fn metric(summary: &Value, name: &str) -> f64 {
    summary["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m[0] == name)
        .unwrap()[1]
        .as_f64()
        .unwrap()
}

#[test]
fn teacher_traces_warm_start_a_tiny_model() {
    let tmp = tempfile::tempdir().unwrap();
    let home = common::home_with_plugins(tmp.path(), &["arith"]);
    let base = tmp.path().join("tiny");
    common::tiny_model(&base, 1);
    let mut teacher = Command::new("python3")
        .arg(common::repo_root().join("scripts/arith-teacher.py"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let url = common::first_line(&mut teacher);
    let traces = tmp.path().join("traces");
    let out = common::run(
        common::host(&home)
            .args([
                "eval",
                "arith",
                "-n",
                "300",
                "-r",
                "1",
                "-c",
                "16",
                "--split",
                "train",
                "-b",
                url.trim(),
                "-s",
            ])
            .arg(&traces),
    );
    let _ = teacher.kill();
    let _ = teacher.wait();
    let (stdout, stderr) = common::texts(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("Reward: 1.000, Correct: 1.000, #Turns: 2.000, #Tool calls: 1.000"),
        "{stdout}"
    );
    let warm = tmp.path().join("warm");
    let out = common::run(
        common::host(&home)
            .args([
                "sft",
                "--steps",
                "40",
                "--batch-size",
                "16",
                "--lr",
                "3e-3",
                "--only-correct",
                "--data",
            ])
            .arg(traces.join("arith/results.jsonl"))
            .arg("-m")
            .arg(&base)
            .arg("--out")
            .arg(&warm),
    );
    let (stdout, stderr) = common::texts(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("300 conversations, 600 assistant turns"),
        "{stdout}"
    );
    let before = eval(&home, &base);
    let after = eval(&home, &warm);
    assert_eq!(metric(&before, "num_tool_calls"), 0.0, "{before}");
    assert_eq!(metric(&after, "num_tool_calls"), 1.0, "{after}");
    assert_eq!(metric(&after, "num_turns"), 2.0, "{after}");
    assert_eq!(after["tool_parse_failures"], 0);
}
