//! End-to-end: `host eval` as a user runs it. A scripted OpenAI server (a real HTTP server on
//! loopback replaying fixed turns, tool calls included) proves the metric arithmetic of
//! will/math-python exactly, with the real plugin and the real Python sandbox running the tool
//! calls; flaky server errors are retried; a missing plugin prints the install command; and
//! `host inference` + `host eval -b` agree with `host eval -m` (in-process) under greedy decoding.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use serde_json::{Value, json};

use crate::common::{self, chat_completion};

/// The first `n` MATH train rows: (problem, answer), the order math-python serves them in.
fn math_rows(n: usize) -> Vec<(String, String)> {
    let data = std::env::var_os("RLHOST_DATA")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| common::repo_root().join("../shared/data"));
    std::fs::read_to_string(data.join("math/train.jsonl"))
        .unwrap()
        .lines()
        .take(n)
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["problem"].as_str().unwrap().to_string(),
                v["answer"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn call(id: &str, code: &str) -> Value {
    json!({"id": id, "type": "function", "function": {"name": "python", "arguments": json!({"code": code}).to_string()}})
}

/// Turn `turn` of the scripted conversation for example `i` (answer `answer`).
fn scripted(i: usize, turn: usize, answer: &str) -> Value {
    let boxed = |a: &str| format!("<think>\nchecked\n</think>\nThe answer is $\\boxed{{{a}}}$.");
    match (i, turn) {
        // A tool call, then the right answer.
        (0, 0) => chat_completion(None, vec![call("c0", "print(6 * 7)")]),
        (0, _) => chat_completion(Some(&boxed(answer)), vec![]),
        // A wrong answer at once.
        (1, _) => chat_completion(Some(&boxed("123456789")), vec![]),
        // A tool call that raises, then the right answer.
        (2, 0) => chat_completion(Some("Let me compute."), vec![call("c2", "1/0")]),
        (2, _) => chat_completion(Some(&boxed(answer)), vec![]),
        // Two tool calls in one turn, then the right answer.
        (3, 0) => chat_completion(None, vec![call("c3a", "print(1)"), call("c3b", "print(2)")]),
        (_, _) => chat_completion(Some(&boxed(answer)), vec![]),
    }
}

/// A scripted OpenAI server playing [`scripted`] for math-python's first `rows` questions;
/// with `fail_every`, every such request fails once with a 503 (the client must retry).
/// Returns the URL, the stop flag and the count of requests it answered.
pub(crate) fn math_python_server(
    rows: usize,
    fail_every: Option<usize>,
) -> (String, Arc<AtomicBool>, Arc<AtomicUsize>) {
    let rows = math_rows(rows);
    let requests = Arc::new(AtomicUsize::new(0));
    let seen = requests.clone();
    let (url, stop) = common::scripted_openai(120, move |body| {
        let n = seen.fetch_add(1, Ordering::SeqCst);
        if fail_every.is_some_and(|k| n % k == k - 1) {
            return (503, json!({"error": {"message": "busy"}}));
        }
        let msgs = body["messages"].as_array().unwrap();
        let user = msgs.iter().find(|m| m["role"] == "user").unwrap()["content"]
            .as_str()
            .unwrap()
            .to_string();
        let turn = msgs.iter().filter(|m| m["role"] == "assistant").count();
        let i = rows
            .iter()
            .position(|(p, _)| user.contains(p.as_str()))
            .expect("a known question");
        assert_eq!(
            body["tools"][0]["function"]["name"], "python",
            "the tool is offered"
        );
        (200, scripted(i, turn, &rows[i].1))
    });
    (url, stop, requests)
}

/// The lines of a saved `results.jsonl`.
pub(crate) fn results(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The text of the first tool message of example `i`'s rollout in `lines`.
pub(crate) fn first_tool_result(lines: &[Value], i: usize) -> String {
    let line = lines.iter().find(|l| l["example_index"] == i).unwrap();
    let tool = line["completion"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap_or_else(|| panic!("no tool message in {line}"));
    tool["content"].as_str().unwrap().to_owned()
}

#[test]
fn scripted_conversations_give_the_exact_math_python_metrics() {
    let tmp = tempfile::tempdir().unwrap();
    let home = common::home_with_plugins(tmp.path(), &["math-python"]);
    let (url, stop, requests) = math_python_server(4, Some(5));
    let save = tmp.path().join("results");
    let out = common::run(
        common::host(&home)
            .args([
                "eval",
                "math-python",
                "-n",
                "4",
                "-r",
                "2",
                "-c",
                "3",
                "--split",
                "train",
            ])
            .args(["-b", &url, "-s"])
            .arg(&save),
    );
    stop.store(true, Ordering::Relaxed);
    let (stdout, stderr) = common::texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    // Per example: correct, turns, tool calls, errors → reward = correct - 0.1 errors.
    //   0: 1, 2, 1, 0 → 1.0    1: 0, 1, 0, 0 → 0.0    2: 1, 2, 1, 1 → 0.9    3: 1, 2, 2, 0 → 1.0
    assert!(
        stdout.contains(
            "Reward: 0.725, Correct: 0.750, #Turns: 1.750, #Tool calls: 1.000, Errors: 0.250"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("Pass@1                           0.750"),
        "{stdout}"
    );
    assert!(
        stdout.contains("Pass@2                           0.750"),
        "{stdout}"
    );
    assert!(
        stdout.contains("failed rollouts                      0"),
        "{stdout}"
    );
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(save.join("math-python/summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(summary["rollouts"], 8);
    // f64 rewards (a rubric's weighted sum of a few metrics, terms up to 1) and their mean
    // over 8 rollouts: a few dozen roundings of values up to 1 (γ₃₂, generously), and the
    // literal's own.
    let bound = rlhost::testing::rounding::gamma(32, tch::Kind::Double);
    assert!((summary["reward"].as_f64().unwrap() - 0.725).abs() <= bound);
    let lines = results(&save.join("math-python/results.jsonl"));
    assert_eq!(lines.len(), 8);
    // Example 2's tool result is the sandbox's real traceback.
    let tool = first_tool_result(&lines, 2);
    assert!(tool.contains("ZeroDivisionError"), "{tool}");
    let ex2 = lines.iter().find(|l| l["example_index"] == 2).unwrap();
    assert!((ex2["reward"].as_f64().unwrap() - 0.9).abs() <= bound);
    assert!(requests.load(Ordering::SeqCst) >= 14, "retries happened");
}

#[test]
fn a_missing_plugin_names_the_install_command() {
    let tmp = tempfile::tempdir().unwrap();
    let stderr = common::run_err(common::host(tmp.path()).args([
        "eval",
        "aime2024",
        "-b",
        "http://127.0.0.1:9/v1",
    ]));
    assert!(stderr.contains("host env install aime2024"), "{stderr}");
}

/// `host inference` + `host eval -b` agree with `host eval -m` under greedy decoding; `-b
/// --lora` on a server without `--enable-lora` is refused before any rollout.
#[test]
fn served_and_in_process_evals_agree_under_greedy_decoding() {
    let common::Workspace { tmp, home, model } = common::workspace(&["math500"], 9);
    let args = [
        "eval",
        "math500",
        "-n",
        "3",
        "-r",
        "2",
        "--max-tokens",
        "24",
        "--temperature",
        "0",
        "--json",
    ];
    let local = common::run(
        common::host(&home)
            .args(args)
            .args(["--threads", "1", "-m"])
            .arg(&model),
    );
    let (stdout, stderr) = common::texts(&local);
    assert!(local.status.success(), "{stderr}");
    let local: Value = serde_json::from_str(&stdout).unwrap();

    let server = common::InferenceServer::start(&model, &[]);
    let served = common::run(common::host(&home).args(args).args(["-b", &server.url]));
    // `-b --lora DIR` on a server that cannot load adapters (no --enable-lora) is refused
    // before any rollout, saying why: never the base model evaluated in the adapter's name.
    let adapter = tmp.path().join("adapter");
    common::random_lora(&rlhost::model::Qwen3Config::load(&model).unwrap(), 8.0, 3)
        .save_peft(&adapter, "tiny", None)
        .unwrap();
    let save = tmp.path().join("never");
    let err = common::run_err(
        common::host(&home)
            .args(args)
            .args(["-b", &server.url, "--lora"])
            .arg(&adapter)
            .arg("-s")
            .arg(&save),
    );
    assert!(
        err.contains("--lora") && err.contains("did not load") && err.contains("--enable-lora"),
        "{err}"
    );
    assert!(!save.exists(), "rollouts ran: {err}");
    drop(server);
    let (stdout, stderr) = common::texts(&served);
    assert!(served.status.success(), "{stderr}");
    let served: Value = serde_json::from_str(&stdout).unwrap();
    for key in [
        "reward",
        "metrics",
        "avg_at_k",
        "pass_at_k",
        "completion_tokens",
        "truncated",
        "rollouts",
    ] {
        assert_eq!(local[0][key], served[0][key], "{key}");
    }
    assert_eq!(local[0]["rollouts"], 6);
    assert_eq!(local[0]["completion_tokens"]["max"], 24.0);
}

/// `host eval -m BASE --lora DIR` evaluates the adapter (its completions differ from the
/// base's) and agrees, under greedy decoding, with `host eval -b` against `host inference
/// --enable-lora --lora-modules` naming the adapter, and with `host eval -b --lora DIR`, which
/// has the server load the folder for the run and unload it after (the server lists what it
/// listed before); each summary names the adapter. `--lora` without `-m` or `-b`, and `-b
/// --lora` with `--served-model-name`, are refused.
#[test]
fn an_adapter_evaluates_in_process_as_on_a_server() {
    let common::Workspace { tmp, home, model } = common::workspace(&["math500"], 9);
    let cfg = rlhost::model::Qwen3Config::load(&model).unwrap();
    let adapter = tmp.path().join("adapter");
    common::random_lora(&cfg, 8.0, 3)
        .save_peft(&adapter, "tiny", None)
        .unwrap();
    let args = [
        "eval",
        "math500",
        "-n",
        "2",
        "-r",
        "1",
        "--max-tokens",
        "16",
        "--temperature",
        "0",
        "--json",
    ];
    let eval = |extra: &[&str], save: &str| -> (Value, Vec<Value>) {
        let dir = tmp.path().join(save);
        let out = common::run(
            common::host(&home)
                .args(args)
                .args(extra)
                .arg("--save-dir")
                .arg(&dir),
        );
        let (stdout, stderr) = common::texts(&out);
        assert!(out.status.success(), "{extra:?}: {stderr}");
        let summary = serde_json::from_str(&stdout).unwrap();
        (summary, results(&dir.join("math500/results.jsonl")))
    };
    let (model_s, adapter_s) = (model.display().to_string(), adapter.display().to_string());
    // f32 in process as on the server (`auto` is bf16 on CPUs with bf16 instructions).
    let (_, base) = eval(&["-m", &model_s, "--dtype", "f32"], "base");
    let (local, with) = eval(
        &["-m", &model_s, "--dtype", "f32", "--lora", &adapter_s],
        "local",
    );
    assert_ne!(
        base[0]["completion"], with[0]["completion"],
        "the adapter applies"
    );
    let module = format!("x={adapter_s}");
    let server =
        common::InferenceServer::start(&model, &["--enable-lora", "--lora-modules", &module]);
    let (served, over) = eval(&["-b", &server.url, "--served-model-name", "x"], "served");
    let models = || common::raw_request(&server.url, &models_request(&server.url), vec![]).2;
    let listed = models();
    let (loaded, on_server) = eval(&["-b", &server.url, "--lora", &adapter_s], "loaded");
    assert_eq!(models(), listed, "the run's adapter is unloaded");
    let err = common::run_err(common::host(&home).args(args).args([
        "-b",
        &server.url,
        "--lora",
        &adapter_s,
        "--served-model-name",
        "x",
    ]));
    assert!(
        err.contains("--served-model-name") && err.contains("--lora"),
        "{err}"
    );
    drop(server);
    for (a, b) in with.iter().zip(&over) {
        assert_eq!(a["completion"], b["completion"]);
    }
    for (a, b) in with.iter().zip(&on_server) {
        assert_eq!(a["completion"], b["completion"]);
    }
    assert_eq!(local[0]["reward"], served[0]["reward"]);
    assert_eq!(local[0]["reward"], loaded[0]["reward"]);
    for summary in [&local, &loaded] {
        let label = summary[0]["model"].as_str().unwrap();
        assert!(label.ends_with(&format!("+ LoRA {adapter_s}")), "{label}");
    }
    let out = common::run(common::host(&home).args(args).args(["--lora", &adapter_s]));
    let err = common::texts(&out).1;
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("--lora") && err.contains("--model"), "{err}");
}

/// `GET /v1/models` of the server at `url` (`http://HOST:PORT/v1`), as raw HTTP.
fn models_request(url: &str) -> String {
    format!(
        "GET /v1/models HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        common::addr_of(url)
    )
}

/// The flags of the other generator are refused before anything runs, never ignored: `-m`'s
/// engine flags with `-b`, `-b`'s client flags with `-m` (clap's usage error, exit 2, naming
/// both). Nothing listens at the URL and no environment is installed: each refusal comes first.
#[test]
fn flags_of_the_other_generator_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let save = tmp.path().join("results");
    let model = tmp.path().join("tiny").display().to_string();
    let url = "http://127.0.0.1:9/v1";
    for (generator, flag, value) in [
        (["-b", url], "--dtype", "f32"),
        (["-b", url], "--device", "cpu"),
        (["-b", url], "--tool-call-parser", "hermes"),
        (["-b", url], "--max-batch-size", "4"),
        (["-b", url], "--max-model-len", "64"),
        (["-b", url], "--threads", "1"),
        (["-m", &model], "--served-model-name", "x"),
        (["-m", &model], "--request-timeout", "5"),
        (["-m", &model], "--api-key-var", "KEY"),
    ] {
        let out = common::run(
            common::host(tmp.path())
                .args(["eval", "math500"])
                .args(generator)
                .args([flag, value])
                .arg("-s")
                .arg(&save),
        );
        let err = common::texts(&out).1;
        assert_eq!(
            out.status.code(),
            Some(2),
            "{flag} with {generator:?}: {err}"
        );
        let other = if generator[0] == "-b" {
            "--base-url"
        } else {
            "--model"
        };
        assert!(err.contains(flag) && err.contains(other), "{err}");
        assert!(!save.exists(), "{flag}: {err}");
    }
}

/// `arith-tools` as a Rust component, an Extism plugin (AssemblyScript) and a Python component,
/// each packed, published, installed from the registry and evaluated by `host eval` against the
/// same scripted model: identical metrics. The model calls the calculator with the question's
/// expression, then answers with the tool's result, except on questions whose answer ends in 0
/// (it answers 0 without the tool).
#[test]
fn the_rust_python_and_extism_arith_tools_evaluate_identically() {
    let tmp = tempfile::tempdir().unwrap();
    let flavours = ["arith-tools", "arith-tools-extism", "arith-tools-python"];
    let home = common::home_with_plugins(tmp.path(), &flavours);
    let (url, stop) = common::scripted_openai(300, |body| {
        assert_eq!(body["tools"][0]["function"]["name"], "calculator");
        let msgs = body["messages"].as_array().unwrap();
        let question = msgs[1]["content"].as_str().unwrap();
        let expression = question
            .trim_start_matches("What is ")
            .trim_end_matches('?');
        let reply = match msgs.iter().rev().find(|m| m["role"] == "tool") {
            None if expression.ends_with('0') => chat_completion(Some("\\boxed{0}"), vec![]),
            None => chat_completion(
                None,
                vec![json!({"id": "c1", "type": "function", "function": {
                    "name": "calculator",
                    "arguments": json!({"expression": expression}).to_string()}})],
            ),
            Some(tool) => chat_completion(
                Some(&format!("\\boxed{{{}}}", tool["content"].as_str().unwrap())),
                vec![],
            ),
        };
        (200, reply)
    });
    let mut lines = Vec::new();
    for flavour in flavours {
        let stdout = common::run_ok(
            common::host(&home)
                .args(["eval", flavour, "-n", "20", "-r", "1", "--split", "test"])
                .args(["-b", &url]),
        );
        let line = stdout
            .lines()
            .find(|l| l.trim_start().starts_with("Reward:"))
            .unwrap_or_else(|| panic!("{flavour}: no metrics line in {stdout}"))
            .trim()
            .to_owned();
        lines.push(line);
    }
    stop.store(true, Ordering::Relaxed);
    assert_eq!(lines[1], lines[0], "Extism vs Rust");
    assert_eq!(lines[2], lines[0], "Python vs Rust");
    // 2 of the 20 test questions end in 0: answered 0, without the tool.
    assert_eq!(lines[0], "Reward: 0.900, Correct: 0.900, tool_calls: 0.900");
}

/// Ctrl-C (SIGINT) stops `host eval` with the rollouts that finished: exit 130, and the saved
/// summary says it was interrupted and how many of the planned rollouts it covers. The signal
/// goes once the engine has finished requests (its Prometheus port says so), not on a timer.
#[test]
fn an_interrupted_eval_marks_its_summary() {
    use std::io::Read;
    let common::Workspace { tmp, home, model } = common::workspace(&["arith"], 9);
    let save = tmp.path().join("saved");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = common::host(&home)
        .args([
            "eval",
            "arith",
            "-n",
            "200",
            "-r",
            "8",
            "-c",
            "4",
            "--max-tokens",
            "48",
        ])
        .args([
            "--threads",
            "1",
            "--monitor.prometheus-port",
            &port.to_string(),
            "-m",
        ])
        .arg(&model)
        .arg("-s")
        .arg(&save)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let finished = || -> f64 {
        let Ok(text) = metrics_text(port) else {
            return 0.0;
        };
        text.lines()
            .filter(|l| l.starts_with("vllm:request_success_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let started = std::time::Instant::now();
    while finished() < 8.0 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(120),
            "no rollout finished"
        );
        assert!(child.try_wait().unwrap().is_none(), "the eval ended early");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = std::process::Command::new("kill")
        .args(["-s", "INT", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(130), "{err}");
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(save.join("arith/summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["interrupted"], true, "{summary}");
    assert_eq!(summary["planned_rollouts"], 1600);
    let done = summary["rollouts"].as_u64().unwrap();
    assert!(done > 0 && done < 1600, "{summary}");
    assert_eq!(
        results(&save.join("arith/results.jsonl")).len() as u64,
        done
    );
}

/// `GET http://127.0.0.1:PORT/metrics`, as text.
fn metrics_text(port: u16) -> Result<String, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let r = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
            .await
            .map_err(|e| e.to_string())?;
        r.text().await.map_err(|e| e.to_string())
    })
}
