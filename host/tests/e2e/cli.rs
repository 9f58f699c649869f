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

/// `host bench serve` refuses conflicting and empty flags, a tokenizer folder without a
/// tokenizer, before it makes a model (the 0.6b one is 1.2 GB and a minute) or starts a server.
#[test]
fn bench_serve_refuses_bad_flags_before_making_a_model() {
    let home = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let empty = tempfile::tempdir().unwrap();
    let serve = |args: &[&str]| {
        let mut cmd = host(home.path());
        cmd.env("TMPDIR", tmp.path())
            .args(["bench", "serve", "--vllm-url", "http://127.0.0.1:9/v1"])
            .args(args);
        run_err(&mut cmd)
    };
    let dir = empty.path().to_str().unwrap();
    let stderr = serve(&["--model", dir, "--tokenizer", dir]);
    assert!(
        stderr.contains("--tokenizer is for the model made without --model"),
        "{stderr}"
    );
    let stderr = serve(&["--preset", "0.6b", "--concurrency", "8,0"]);
    assert!(
        stderr.contains("every --concurrency level must be at least 1"),
        "{stderr}"
    );
    let stderr = serve(&["--preset", "0.6b", "--group-size", "0"]);
    assert!(
        stderr.contains("--group-size must be at least 1"),
        "{stderr}"
    );
    let stderr = serve(&["--preset", "0.6b", "--tokenizer", dir]);
    assert!(
        stderr.contains("--preset 0.6b without --model needs Qwen3's tokenizer"),
        "{stderr}"
    );
    let made: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(made.is_empty(), "a refused run wrote {made:?}");
}

/// `host bench products --dtype` measures each kernel the engine may run in that dtype, names
/// the CPU and, in bf16, the few-rows kernel's way (vdpbf16ps where the CPU has AVX-512 BF16);
/// oneDNN only in f32, the widened BLAS only in bf16.
#[test]
fn bench_products_measures_each_dtypes_kernels_and_names_the_cpu() {
    let home = tempfile::tempdir().unwrap();
    let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let avx2 = flags.contains(" avx2") && flags.contains(" fma");
    let bf16_dot = flags.contains(" avx512_bf16") && flags.contains(" avx512bw");
    for dtype in ["bf16", "f32"] {
        let out = run(host(home.path()).args([
            "bench",
            "products",
            "--preset",
            "tiny",
            "--rows",
            "1,5",
            "--repeats",
            "1",
            "--dtype",
            dtype,
            "--keys",
            "40",
            "--json",
        ]));
        let (stdout, stderr) = texts(&out);
        assert!(out.status.success(), "{stdout}{stderr}");
        let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(v["dtype"], dtype);
        assert!(v["cpu"].as_str().is_some_and(|c| c.contains("core")), "{v}");
        let rows = v["rows"].as_array().unwrap();
        assert_eq!(
            rows.iter()
                .map(|r| r["rows"].as_u64().unwrap())
                .collect::<Vec<_>>(),
            [1, 5]
        );
        for r in rows {
            let kernels: Vec<&str> = r["kernels"]
                .as_array()
                .unwrap()
                .iter()
                .map(|k| {
                    for t in ["layers_ms", "head_ms"] {
                        let ms = k[t].as_f64().unwrap();
                        assert!(ms > 0.0 && ms.is_finite(), "{t} {ms} in {k}");
                    }
                    k["kernel"].as_str().unwrap()
                })
                .collect();
            assert_eq!(kernels[0], "blas", "{kernels:?}");
            assert_eq!(kernels.contains(&"few_rows"), avx2, "{kernels:?}");
            assert_eq!(kernels.contains(&"widened"), dtype == "bf16", "{kernels:?}");
            if dtype == "bf16" {
                assert!(!kernels.contains(&"onednn"), "{kernels:?}");
            }
        }
        // The decode attention rows: both ways timed per row count over the keys asked for.
        let attention = v["attention"].as_array().unwrap();
        assert_eq!(attention.len(), 2, "{v}");
        for a in attention {
            assert_eq!(a["keys"], 40, "{a}");
            assert!(a["libtorch_ms"].as_f64().unwrap() > 0.0, "{a}");
            assert_eq!(
                a["kernel_ms"].as_f64().is_some_and(|k| k > 0.0),
                avx2,
                "{a}"
            );
        }
        let absent = v["absent"].as_array().unwrap();
        if dtype == "bf16" {
            assert!(
                absent.iter().any(|a| a["kernel"] == "onednn"
                    && a["reason"].as_str().unwrap().contains("f32 products only")),
                "{absent:?}"
            );
            let way = avx2.then_some(if bf16_dot { "vdpbf16ps" } else { "widened" });
            assert_eq!(v["few_rows_bf16"].as_str(), way, "{v}");
        } else {
            assert!(v["few_rows_bf16"].is_null(), "{v}");
        }
    }
}

/// Log lines on a stderr that is not a terminal (piped, or a file) carry no ANSI escape codes:
/// `host inference` logging at `info` to a file, as `host rl … 2> log` would, writes plain
/// text (the codes used to land in such logs).
#[test]
fn logs_written_off_a_terminal_hold_no_escape_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    crate::common::tiny_model(&model, 6);
    let cfg = rlhost::model::Qwen3Config::load(&model).unwrap();
    let adapter = tmp.path().join("adapter");
    crate::common::random_lora(&cfg, 8.0, 5)
        .save_peft(&adapter, "tiny", None)
        .unwrap();
    let log = tmp.path().join("log");
    let mut child = std::process::Command::new(crate::common::host_bin())
        .args([
            "inference",
            "--port",
            "0",
            "--dtype",
            "f32",
            "--enable-lora",
            "-m",
        ])
        .arg(&model)
        .arg("--lora-modules")
        .arg(format!("a={}", adapter.display()))
        .env("RLHOST_LOG", "info")
        .env_remove("NO_COLOR")
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // The adapter is logged before the server prints its address.
    let line = crate::common::first_line(&mut child);
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.contains("http://"), "{line}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains("INFO") && l.contains("serving adapter a")),
        "{text}"
    );
    assert!(
        !text.contains('\u{1b}'),
        "escape codes in the log: {text:?}"
    );
}
