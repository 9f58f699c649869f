//! End-to-end: the `host` command line as a user meets it.

use crate::common::{host, run, run_err, texts};

const GROUPS: &[&str] = &[
    "env",
    "registry",
    "model",
    "sandbox",
    "inference",
    "eval",
    "rl",
    "sft",
    "bench",
    "doctor",
];

#[test]
fn help_lists_every_group_with_its_purpose() {
    let home = tempfile::tempdir().unwrap();
    let out = run(host(home.path()).arg("--help"));
    assert!(out.status.success());
    let (stdout, _) = texts(&out);
    for group in GROUPS {
        let line = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{group} ")))
            .unwrap_or_else(|| panic!("`{group}` missing from --help:\n{stdout}"));
        assert!(
            line.split_whitespace().count() > 2,
            "`{group}` has no description: {line:?}"
        );
    }
}

#[test]
fn version_is_the_workspace_version() {
    let home = tempfile::tempdir().unwrap();
    let out = run(host(home.path()).arg("--version"));
    assert!(out.status.success());
    assert_eq!(texts(&out).0.trim(), format!("host {}", rlhost::VERSION));
}

#[test]
fn an_unknown_benchmark_is_a_usage_error_listing_the_benchmarks_and_touches_nothing() {
    let home = tempfile::tempdir().unwrap();
    for word in ["inference", "typo"] {
        let out = run(host(home.path()).args(["bench", word, "--flag"]));
        let (stdout, stderr) = texts(&out);
        assert_eq!(out.status.code(), Some(2), "`host bench {word}`: {stderr}");
        assert!(stdout.is_empty(), "`host bench {word}` printed: {stdout}");
        assert!(
            stderr.contains(&format!("unrecognized subcommand '{word}'")),
            "{stderr}"
        );
        assert!(
            stderr.contains("`host bench` has: plugins, sandbox, math-verify,")
                && stderr.contains("products")
                && stderr.contains("serve"),
            "{stderr}"
        );
        assert!(!stderr.contains("not implemented"), "{stderr}");
    }
    let left: Vec<_> = std::fs::read_dir(home.path()).unwrap().collect();
    assert!(
        left.is_empty(),
        "a usage error wrote into RLHOST_HOME: {left:?}"
    );
}

#[test]
fn unknown_subcommand_is_a_usage_error() {
    let home = tempfile::tempdir().unwrap();
    let out = run(host(home.path()).arg("trian"));
    assert_eq!(out.status.code(), Some(2));
    assert!(texts(&out).1.contains("unrecognized subcommand 'trian'"));
    let out = run(host(home.path()).args(["env", "instal", "x"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(texts(&out).1.contains("unrecognized subcommand 'instal'"));
}

#[test]
fn sandbox_run_behaves_like_the_models_python_tool() {
    let home = tempfile::tempdir().unwrap();
    let out = run(host(home.path()).args([
        "sandbox",
        "run",
        "-c",
        "import math\nmath.factorial(20)",
        "--json",
    ]));
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["stdout"], "2432902008176640000\n");
    assert_eq!(v["timed_out"], false);

    let out = run(host(home.path()).args([
        "sandbox",
        "run",
        "-c",
        "while True: pass",
        "--timeout",
        "0.5",
    ]));
    assert_eq!(out.status.code(), Some(124));
    assert!(
        texts(&out)
            .1
            .contains("Error: Code execution timed out after 0.5 seconds")
    );

    let stderr = run_err(host(home.path()).args(["sandbox", "run"]));
    assert!(stderr.contains("nothing to run"), "{stderr}");

    let stderr =
        run_err(host(home.path()).args(["sandbox", "run", "-c", "1", "--component", "/nope.wasm"]));
    assert!(stderr.contains("/nope.wasm does not exist"), "{stderr}");
}
