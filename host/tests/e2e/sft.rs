//! End-to-end: a warm start the way the demo does it. A scripted teacher (an OpenAI-compatible
//! server on loopback) plays arith through `host eval -s`, with the real environment and sandbox;
//! `host sft --only-correct` trains a tiny Qwen3 on those rollouts; the result calls the python
//! tool in the format it was shown (hermes calls the server parses), which the untrained model
//! never does.

use std::process::{Command, Stdio};

use serde_json::Value;

use crate::common;

fn eval(home: &std::path::Path, model: &std::path::Path) -> Value {
    let stdout = common::run_ok(
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

/// `scripts/arith-teacher.py ARGS` listening on loopback, and its base URL.
pub(crate) fn teacher(args: &[&str]) -> (std::process::Child, String) {
    let mut child = Command::new("python3")
        .arg(common::repo_root().join("scripts/arith-teacher.py"))
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let url = common::first_line(&mut child).trim().to_string();
    (child, url)
}

#[test]
fn teacher_traces_warm_start_a_tiny_model() {
    let common::Workspace {
        tmp,
        home,
        model: base,
    } = common::workspace(&["arith"], 1);
    let (mut teacher, url) = teacher(&[]);
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
                url.as_str(),
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
    let stdout = common::run_ok(
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
                "--save-every",
                "20",
                "--data",
            ])
            .arg(traces.join("arith/results.jsonl"))
            .arg("-m")
            .arg(&base)
            .arg("--out")
            .arg(&warm),
    );
    assert!(
        stdout.contains("300 conversations, 600 assistant turns in 300 samples"),
        "{stdout}"
    );
    // Without a terminal, a progress line every tenth of the run; --save-every keeps a complete
    // model folder at step 20 (the last step's model is OUT itself).
    assert!(stdout.contains("sft: step 4/40 loss "), "{stdout}");
    assert!(stdout.contains("sft: step 40/40 loss "), "{stdout}");
    let mid = warm.join("step-20");
    common::run_ok(common::host(&home).args(["model", "info"]).arg(&mid));
    assert!(mid.join("tokenizer.json").is_file() && mid.join("tokenizer_config.json").is_file());
    assert!(!warm.join("step-40").exists());
    let before = eval(&home, &base);
    let after = eval(&home, &warm);
    assert_eq!(metric(&before, "num_tool_calls"), 0.0, "{before}");
    assert_eq!(metric(&after, "num_tool_calls"), 1.0, "{after}");
    assert_eq!(metric(&after, "num_turns"), 2.0, "{after}");
    assert_eq!(after["tool_parse_failures"], 0);
    // The trainer's memory options: checkpointing, offload and packing take the same steps
    // (the same printed losses); a dtype the trainer does not have is refused by its flag.
    let losses = |extra: &[&str], out: &str| -> Vec<String> {
        let stdout = common::run_ok(
            common::host(&home)
                .args(["sft", "--steps", "4", "--batch-size", "8", "--lr", "3e-3"])
                .args(extra)
                .arg("--data")
                .arg(traces.join("arith/results.jsonl"))
                .arg("-m")
                .arg(&base)
                .arg("--out")
                .arg(tmp.path().join(out)),
        );
        let lines: Vec<String> = stdout
            .lines()
            .filter(|l| l.starts_with("sft: step "))
            // "loss X lr Y (T s)": the loss and the rate, not the time.
            .map(|l| l.split(" (").next().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(lines.len(), 4, "{stdout}");
        lines
    };
    let plain = losses(&["--dtype", "f32"], "plain");
    let lean = losses(
        &[
            "--dtype",
            "f32",
            "--ac",
            "full",
            "--optim-cpu-offload",
            "--packing",
        ],
        "lean",
    );
    let loss_of = |line: &str| -> f64 {
        line.split("loss ")
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    // The same steps and rates, and losses as close as rounding leaves them: a step's loss is
    // a mean of −log p over its tokens, each log-prob of one run within `logprob_bound` of the
    // other's (the same weights summed in other orders: prompts of at most the model's context,
    // temperature 1); the runs' weights differ by no more than that rounding, which Adam's ε
    // amplifies only where a gradient is near zero, moving the loss by a second-order amount;
    // and each printout rounds to 4 decimals (5e-5 each).
    let context = rlhost::model::Qwen3Config::load(&base)
        .unwrap()
        .max_position_embeddings as usize;
    let bound = crate::inference::logprob_bound(&base, context, 1.0) + 1e-4;
    for (a, b) in plain.iter().zip(&lean) {
        assert_eq!(
            a.split(" loss ").next(),
            b.split(" loss ").next(),
            "{plain:?} vs {lean:?}"
        );
        assert_eq!(
            a.split(" lr ").nth(1),
            b.split(" lr ").nth(1),
            "{plain:?} vs {lean:?}"
        );
        assert!(
            (loss_of(a) - loss_of(b)).abs() <= bound,
            "{plain:?} vs {lean:?} (bound {bound:e})"
        );
    }
    // LoRA: the adapters alone train and the loss falls; the output is a PEFT folder for the
    // base, which `host model merge-lora` folds in.
    let lora = losses(
        &[
            "--dtype",
            "f32",
            "--lora.rank",
            "8",
            "--lora.target-modules",
            "q_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
        ],
        "lora",
    );
    assert!(loss_of(&lora[3]) < loss_of(&lora[0]), "{lora:?}");
    let adapter = tmp.path().join("lora");
    assert!(adapter.join("adapter_config.json").is_file());
    assert!(!adapter.join("model.safetensors").exists());
    common::run_ok(
        common::host(&home)
            .args(["model", "merge-lora", "--base"])
            .arg(&base)
            .arg("--adapter")
            .arg(&adapter)
            .arg("--out")
            .arg(tmp.path().join("lora-merged")),
    );
    assert!(tmp.path().join("lora-merged/model.safetensors").is_file());
    // Adapter dropout with checkpointing is refused: a rerun layer would draw another mask.
    let err = common::run_err(
        common::host(&home)
            .args([
                "sft",
                "--lora.rank",
                "4",
                "--lora.dropout",
                "0.1",
                "--ac",
                "full",
            ])
            .arg("--data")
            .arg(traces.join("arith/results.jsonl"))
            .arg("-m")
            .arg(&base)
            .arg("--out")
            .arg(tmp.path().join("never")),
    );
    assert!(
        err.contains("--lora.dropout") && err.contains("--ac"),
        "{err}"
    );
    assert!(!tmp.path().join("never").exists());
    let out = common::run(
        common::host(&home)
            .args(["sft", "--dtype", "f16", "--data"])
            .arg(traces.join("arith/results.jsonl"))
            .arg("-m")
            .arg(&base)
            .arg("--out")
            .arg(tmp.path().join("f16")),
    );
    let (_, stderr) = common::texts(&out);
    assert!(
        !out.status.success() && stderr.contains("--dtype"),
        "{stderr}"
    );
}

/// LoRA flags without `--lora.rank` are refused, not dropped for full fine-tuning; values LoRA
/// cannot take (alpha, dropout, targets) and ranks above the model's shape (with the bound) are
/// refused by flag, as are a zero batch, a learning rate that is not a positive number and a
/// dtype training does not take. All before any work: the data file does not even exist (it
/// would be read first otherwise), and `--out` never appears.
#[test]
fn settings_are_checked_before_any_work() {
    use rlhost::model::{LoraTarget, Qwen3Config};
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    common::tiny_model(&model, 1);
    let shape = Qwen3Config::load(&model).unwrap();
    let bound = |t: LoraTarget| {
        let (out, inp) = t.shape(&shape);
        out.min(inp)
    };
    let (k_bound, q_bound) = (bound(LoraTarget::KProj), bound(LoraTarget::QProj));
    let out = tmp.path().join("out");
    let sft = |extra: &[&str]| {
        let mut cmd = common::host(tmp.path());
        cmd.args(["sft", "--steps", "1", "-m"])
            .arg(&model)
            .arg("--data")
            .arg(tmp.path().join("missing.jsonl"))
            .arg("--out")
            .arg(&out)
            .args(extra);
        cmd
    };
    let (k_over, q_over) = ((k_bound + 1).to_string(), (q_bound + 1).to_string());
    let cases: [(&[&str], &[&str]); 12] = [
        (
            &["--lora.alpha", "-1", "--lora.target-modules", "q_proj"],
            &[
                "--lora.alpha, --lora.target-modules",
                "--lora.rank",
                "every weight",
            ],
        ),
        (
            &["--lora.dropout", "0.1"],
            &["--lora.dropout", "--lora.rank"],
        ),
        (
            &["--lora.rank", "0", "--lora.alpha", "8"],
            &["--lora.alpha", "--lora.rank"],
        ),
        (
            &["--lora.rank", "8", "--lora.alpha", "-1"],
            &["--lora.alpha:", "positive"],
        ),
        (
            &["--lora.rank", "8", "--lora.alpha", "inf"],
            &["--lora.alpha:"],
        ),
        (
            &["--lora.rank", "8", "--lora.dropout", "1"],
            &["--lora.dropout:"],
        ),
        (
            &["--lora.rank", "1000000000"],
            &["--lora.rank:", "1000000000", &k_bound.to_string(), "k_proj"],
        ),
        (
            // Only the targeted projections bound it: q_proj's bound is above k_proj's.
            &["--lora.rank", &q_over, "--lora.target-modules", "q_proj"],
            &["--lora.rank:", &q_bound.to_string(), "q_proj"],
        ),
        (
            &[
                "--lora.rank",
                &k_over,
                "--lora.target-modules",
                "q_proj,k_proj",
            ],
            &["--lora.rank:", &k_bound.to_string(), "k_proj"],
        ),
        (&["--batch-size", "0"], &["--batch-size"]),
        (&["--lr", "NaN"], &["--lr"]),
        (&["--dtype", "f16"], &["--dtype"]),
    ];
    for (extra, wanted) in cases {
        let err = common::run_err(&mut sft(extra));
        for w in wanted {
            assert!(err.contains(w), "{extra:?}: {w:?} not in: {err}");
        }
        assert!(!out.exists(), "{extra:?} trained");
    }
    // A projection rlhost does not know: clap's usage error, naming it.
    let failed = common::run(&mut sft(&[
        "--lora.rank",
        "8",
        "--lora.target-modules",
        "qkv",
    ]));
    let err = common::texts(&failed).1;
    assert_eq!(failed.status.code(), Some(2), "{err}");
    assert!(
        err.contains("qkv") && err.contains("--lora.target-modules"),
        "{err}"
    );
    assert!(!out.exists());
}

/// `arith-teacher.py --tool-rate`: the teacher uses the tool on about that share of the
/// questions, answers the others at once with an estimate (right only when the value is a
/// multiple of ten), and makes the same choice for a question every time.
#[test]
fn teacher_tool_rate_mixes_habits_stably() {
    let tmp = tempfile::tempdir().unwrap();
    let home = common::home_with_plugins(tmp.path(), &["arith"]);
    let (mut teacher, url) = teacher(&["--tool-rate", "0.4"]);
    let summaries: Vec<Value> = (0..2)
        .map(|i| {
            let dir = tmp.path().join(format!("traces-{i}"));
            common::run_ok(
                common::host(&home)
                    .args([
                        "eval", "arith", "-n", "200", "-r", "1", "--split", "train-d1",
                    ])
                    .args(["-b", url.as_str(), "-s"])
                    .arg(&dir),
            );
            serde_json::from_str(&std::fs::read_to_string(dir.join("arith/summary.json")).unwrap())
                .unwrap()
        })
        .collect();
    let _ = teacher.kill();
    let _ = teacher.wait();
    let (tools, correct) = (
        metric(&summaries[0], "num_tool_calls"),
        metric(&summaries[0], "correct"),
    );
    assert!((0.3..0.5).contains(&tools), "tool share {tools}");
    // Tool answers are right; estimates rarely.
    assert!(
        correct >= tools && correct < tools + 0.3,
        "{correct} vs {tools}"
    );
    assert_eq!(summaries[0]["metrics"], summaries[1]["metrics"]);
}
