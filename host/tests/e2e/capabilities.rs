//! End-to-end: a plugin whose declared capability this host cannot grant (the Python sandbox
//! component absent) does not run. `host eval`, `host rl`, `host bench plugins` and `host env
//! install` stop before any rollout, naming the plugin, the capability, where the sandbox was
//! looked for and the command that fixes it; `--allow-missing-capabilities` runs anyway and
//! marks every rollout; `host doctor` shows the grant that is missing.
//!
//! The sandbox is hidden the way a user meets it: the `host` binary run outside its build tree
//! (`$RLHOST_SOURCE` unset), nothing in `$RLHOST_HOME/sandbox/`, no `$RLHOST_PYTHON_SANDBOX`.

use std::process::Command;
use std::sync::atomic::Ordering;

use serde_json::Value;

use crate::common;
use crate::eval::{first_tool_result, math_python_server, results};

/// `host` with no way to find the sandbox component.
fn without_sandbox(home: &std::path::Path) -> Command {
    let mut cmd = common::host(home);
    cmd.env_remove("RLHOST_SOURCE")
        .env_remove("RLHOST_PYTHON_SANDBOX");
    cmd
}

/// What every refusal says: plugin, capability, where it looked, the fix, the way out.
fn assert_names_everything(stderr: &str, home: &std::path::Path, plugin: &str) {
    let looked = home.join("sandbox/python-sandbox.wasm");
    for part in [
        plugin,
        "cannot run on this host: it needs capability `sandbox.python`",
        &format!(
            "no Python sandbox component found (looked in: {})",
            looked.display()
        ),
        "`make sandbox`",
        "$RLHOST_PYTHON_SANDBOX",
        "--allow-missing-capabilities",
    ] {
        assert!(stderr.contains(part), "missing {part:?} in:\n{stderr}");
    }
}

fn eval_args(url: &str) -> Vec<String> {
    [
        "eval",
        "math-python",
        "-n",
        "4",
        "-r",
        "2",
        "-c",
        "2",
        "--split",
        "train",
        "-b",
        url,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[test]
fn eval_refuses_before_any_rollout_and_runs_marked_when_told() {
    let tmp = tempfile::tempdir().unwrap();
    // Installed while the sandbox was there (the build tree's), then used without it.
    let home = common::home_with_plugins(tmp.path(), &["math-python"]);
    let (url, stop, requests) = math_python_server(4, None);

    let out = common::run(without_sandbox(&home).args(eval_args(&url)));
    let (stdout, stderr) = common::texts(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert_names_everything(&stderr, &home, "will/math-python v");
    assert_eq!(requests.load(Ordering::SeqCst), 0, "no rollout started");

    // Told to run anyway: it runs, and every rollout and the summary say what was missing.
    let save = tmp.path().join("results");
    let out = common::run(
        without_sandbox(&home)
            .args(eval_args(&url))
            .args(["--allow-missing-capabilities", "-s"])
            .arg(&save),
    );
    stop.store(true, Ordering::Relaxed);
    let (stdout, stderr) = common::texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains(
            "WARNING: 8 of 8 rollouts ran without capability sandbox.python \
             (--allow-missing-capabilities): these figures do not measure the environment"
        ),
        "{stdout}"
    );
    let lines = results(&save.join("math-python/results.jsonl"));
    assert_eq!(lines.len(), 8);
    for l in &lines {
        assert_eq!(
            l["missing_capabilities"],
            serde_json::json!(["sandbox.python"]),
            "{l}"
        );
    }
    // The tool answered with the refusal, not with Python's output.
    let tool = first_tool_result(&lines, 0);
    assert!(tool.contains("no Python sandbox"), "{tool}");
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(save.join("math-python/summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        summary["missing_capabilities"],
        serde_json::json!(["sandbox.python"])
    );
    assert_eq!(summary["rollouts_without_capabilities"], 8);
}

#[test]
fn rl_bench_and_install_refuse_and_doctor_shows_the_missing_grant() {
    let common::Workspace { tmp, home, model } = common::workspace(&["arith"], 3);

    // host doctor: with the sandbox, arith's grant is there; without it, it is a problem.
    let out = common::run(common::host(&home).args(["doctor", "--json"]));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let arith = |r: &Value| {
        r["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "rlhost/arith")
            .cloned()
            .unwrap_or_else(|| panic!("arith listed: {r:#}"))
    };
    assert_eq!(
        arith(&report)["capabilities"][0]["capability"],
        "sandbox.python"
    );
    assert_eq!(
        arith(&report)["capabilities"][0]["granted"],
        true,
        "{report:#}"
    );
    assert!(
        report["python_sandbox"]["component"].is_string(),
        "{report:#}"
    );
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    let out = common::run(without_sandbox(&home).args(["doctor", "--json"]));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    let grant = &arith(&report)["capabilities"][0];
    assert_eq!(grant["granted"], false, "{report:#}");
    assert!(
        grant["reason"]
            .as_str()
            .unwrap()
            .contains("no Python sandbox component found"),
        "{grant}"
    );
    let problems = report["problems"].to_string();
    assert!(
        problems.contains("rlhost/arith v0.2.0 cannot run here"),
        "{problems}"
    );
    let text = common::run(without_sandbox(&home).arg("doctor"));
    let (stdout, _) = common::texts(&text);
    assert!(
        stdout.contains("python sandbox: MISSING: no Python sandbox component found"),
        "{stdout}"
    );
    assert!(
        stdout.contains("rlhost/arith 0.2.0: sandbox.python (CANNOT BE GRANTED)"),
        "{stdout}"
    );

    // host rl: refused before the model is touched or a step runs.
    let run_dir = tmp.path().join("run");
    let out = common::run(without_sandbox(&home).args(crate::rl::rl_args(&model, &run_dir, 1)));
    let (stdout, stderr) = common::texts(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert_names_everything(&stderr, &home, "rlhost/arith v0.2.0");
    assert!(!run_dir.join("metrics.jsonl").exists(), "no step ran");

    // Told to run anyway: the step line marks its rollouts.
    let out = common::run(
        without_sandbox(&home)
            .args(crate::rl::rl_args(&model, &run_dir, 1))
            .arg("--allow-missing-capabilities"),
    );
    let (stdout, stderr) = common::texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let line: Value = serde_json::from_str(
        std::fs::read_to_string(run_dir.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        line["missing_capabilities"],
        serde_json::json!(["sandbox.python"]),
        "{line}"
    );
    assert_eq!(line["rollouts_without_capabilities"], 8, "{line}");
    assert!(
        stdout.contains("WITHOUT sandbox.python (8 rollouts)"),
        "{stdout}"
    );

    // host bench plugins: the same refusal.
    let installed = home.join("plugins/rlhost/arith/0.2.0");
    let out = common::run(
        without_sandbox(&home)
            .args(["bench", "plugins", "--rollouts", "5", "--component"])
            .arg(&installed),
    );
    let (stdout, stderr) = common::texts(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert_names_everything(&stderr, &home, "rlhost/arith v0.2.0");

    // host env install into a home without the sandbox: validation refuses it; told, installs.
    let fresh = tmp.path().join("fresh-home");
    let registry = format!("file://{}", tmp.path().join("registry").display());
    let install = |extra: &[&str]| {
        common::run(
            without_sandbox(&fresh)
                .env("RLHOST_REGISTRY", &registry)
                .args(["env", "install", "rlhost/arith"])
                .args(extra),
        )
    };
    let out = install(&[]);
    let (stdout, stderr) = common::texts(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert_names_everything(&stderr, &fresh, "rlhost/arith v0.2.0");
    assert!(
        !fresh.join("plugins/rlhost/arith").exists(),
        "nothing installed"
    );
    let out = install(&["--allow-missing-capabilities"]);
    let (stdout, stderr) = common::texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        fresh
            .join("plugins/rlhost/arith/0.2.0/plugin.toml")
            .is_file()
    );
}
