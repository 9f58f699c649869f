//! End-to-end: `host doctor` reports the real installation, as text and as JSON.

use serde_json::Value;

use crate::common::{self, host, reference_python, run, texts};

fn doctor_json(cmd: &mut std::process::Command) -> (Option<i32>, Value) {
    let out = run(cmd.args(["doctor", "--json"]));
    let (stdout, stderr) = texts(&out);
    let json = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("doctor --json is not JSON ({e}):\n{stdout}\n{stderr}"));
    (out.status.code(), json)
}

#[test]
fn json_report_describes_this_machine() {
    let home = tempfile::tempdir().unwrap();
    let (code, r) = doctor_json(&mut host(home.path()));
    assert_eq!(code, Some(0), "{r:#}");
    assert_eq!(r["problems"], Value::Array(vec![]), "{r:#}");
    assert_eq!(r["rlhost_version"], rlhost::VERSION);

    let torch = r["libtorch"]["version"].as_str().unwrap();
    assert!(torch.starts_with("2.13.0"), "libtorch {torch}");
    let lib = r["libtorch"]["library"].as_str().expect("library path");
    assert!(lib.ends_with("libtorch_cpu.so"), "{lib}");
    assert_eq!(r["libtorch"]["tch_version"], "0.26.0");

    let compiled = r["cuda"]["compiled"].as_bool().unwrap();
    assert_eq!(compiled, cfg!(feature = "cuda"));
    if !compiled {
        assert_eq!(r["cuda"]["available"], false);
        assert_eq!(r["cuda"]["device_count"], 0);
        let why = r["cuda"]["why_unavailable"].as_str().unwrap();
        assert!(
            why.contains("not compiled in") || why.contains("built without"),
            "{why}"
        );
    }
    // setup.sh's libtorch is PyPI's CUDA 13.0 build, whatever this binary links.
    assert_eq!(r["cuda"]["libtorch_cuda"], "13.0");
    if !rlhost::device::nvidia_driver_present() {
        assert_eq!(r["cuda"]["driver"], Value::Null);
        let err = r["cuda"]["driver_error"].as_str().unwrap();
        assert!(err.contains("no NVIDIA driver"), "{err}");
    }
    assert!(r["torch_threads"].as_i64().unwrap() >= 1);
    assert_eq!(r["wasmtime"]["version"], "49.0.5");
    assert_eq!(r["wasmtime"]["engine_ok"], true);

    let home_str = home.path().to_str().unwrap();
    assert_eq!(r["paths"]["home"], home_str);
    assert_eq!(r["paths"]["plugins"], format!("{home_str}/plugins"));
    assert_eq!(r["paths"]["config_exists"], false);
    assert_eq!(r["registry"]["url"], format!("file://{home_str}/registry"));
    assert_eq!(r["registry"]["source"], "default");
    assert_eq!(r["plugin_abis"], serde_json::json!(["rlhost:env@0.1.0"]));
    assert_eq!(r["plugin_runtimes"][1], "extism 1.41.0");
    assert_eq!(r["componentize_py"], "0.25.1");
}

#[test]
fn text_report_says_cuda_is_not_available_on_a_cpu_build() {
    let home = tempfile::tempdir().unwrap();
    let stdout = common::run_ok(host(home.path()).arg("doctor"));
    assert!(stdout.contains("libtorch: 2.13.0"), "{stdout}");
    if !cfg!(feature = "cuda") && !rlhost::device::nvidia_driver_present() {
        assert!(
            stdout.contains("cuda: not available: not compiled in (build with `make build CUDA=1`) (libtorch for CUDA 13.0, not linked in)"),
            "{stdout}"
        );
    }
    assert!(stdout.contains("no problems found"), "{stdout}");
}

#[test]
fn runs_without_library_path_thanks_to_rpath() {
    // Users run the binary without sourcing our env file: libtorch must be found via rpath.
    let home = tempfile::tempdir().unwrap();
    let mut cmd = host(home.path());
    cmd.env_remove("LD_LIBRARY_PATH");
    let (code, r) = doctor_json(&mut cmd);
    assert_eq!(code, Some(0), "{r:#}");
}

#[test]
fn registry_comes_from_settings_then_environment() {
    let home = tempfile::tempdir().unwrap();
    let settings = home.path().join("config.toml");
    std::fs::write(&settings, "[registry]\ndefault = \"http://127.0.0.1:9\"\n").unwrap();
    let (_, r) = doctor_json(&mut host(home.path()));
    assert_eq!(r["registry"]["url"], "http://127.0.0.1:9");
    assert_eq!(r["registry"]["source"], settings.to_str().unwrap());
    assert_eq!(r["paths"]["config_exists"], true);

    let (_, r) = doctor_json(host(home.path()).env("RLHOST_REGISTRY", "https://r.example"));
    assert_eq!(r["registry"]["url"], "https://r.example");
    assert_eq!(r["registry"]["source"], "$RLHOST_REGISTRY");
}

#[test]
fn malformed_settings_are_reported_with_file_and_key_and_fail() {
    let home = tempfile::tempdir().unwrap();
    let settings = home.path().join("config.toml");
    let original = "[registry]\nurl = \"http://x\"\n";
    std::fs::write(&settings, original).unwrap();
    let out = run(host(home.path()).arg("doctor"));
    let (stdout, _) = texts(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("problems:"), "{stdout}");
    assert!(stdout.contains(settings.to_str().unwrap()), "{stdout}");
    assert!(stdout.contains("unknown field `url`"), "{stdout}");
    // The rest of the report is still there, and the user's file is untouched.
    assert!(stdout.contains("libtorch: 2.13.0"), "{stdout}");
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), original);
}

#[test]
fn libtorch_matches_the_python_reference() {
    let Some(python) = reference_python("libtorch_matches_the_python_reference") else {
        return;
    };
    let out =
        run(std::process::Command::new(python)
            .args(["-c", "import torch; print(torch.__version__)"]));
    assert!(out.status.success(), "{}", texts(&out).1);
    let reference = texts(&out).0.trim().to_owned();
    let home = tempfile::tempdir().unwrap();
    let (_, r) = doctor_json(&mut host(home.path()));
    let ours = r["libtorch"]["version"].as_str().unwrap();
    // Same release; the local part (+cu130) may differ between wheels of one release.
    assert_eq!(
        ours.split('+').next(),
        reference.split('+').next(),
        "ours {ours}, reference {reference}"
    );
}

/// `RLHOST_CPU_BF16` overrides the CPU probe both ways (so the suite can run as either kind of
/// CPU would), `host doctor` says so, and a bad value is a problem naming the variable.
#[test]
fn the_cpu_bf16_probe_can_be_overridden_and_says_so() {
    let home = tempfile::tempdir().unwrap();
    for (value, auto) in [("1", "bf16"), ("0", "f32")] {
        let (code, r) = doctor_json(host(home.path()).env("RLHOST_CPU_BF16", value));
        assert_eq!(code, Some(0), "{r:#}");
        assert_eq!(r["cpu_dtype"]["auto"], auto, "{r:#}");
        let why = r["cpu_dtype"]["why"].as_str().unwrap();
        assert!(why.contains(&format!("RLHOST_CPU_BF16={value}")), "{why}");
        assert_eq!(r["cpu_dtype"]["bf16"]["forced"], value == "1", "{r:#}");
    }
    let (code, r) = doctor_json(host(home.path()).env("RLHOST_CPU_BF16", "yes"));
    assert_eq!(code, Some(1), "{r:#}");
    assert!(
        r["problems"][0]
            .as_str()
            .unwrap()
            .contains("invalid RLHOST_CPU_BF16=\"yes\""),
        "{r:#}"
    );
    // `--dtype auto` anywhere refuses the bad value too, naming it.
    let err = common::run_err(host(home.path()).env("RLHOST_CPU_BF16", "yes").args([
        "bench",
        "generate",
        "--model",
        "/nonexistent",
        "--no-peer",
    ]));
    assert!(err.contains("RLHOST_CPU_BF16"), "{err}");
}

/// `RLHOST_CPU_KERNELS` picks the path of a bf16 model's products (so the suite can run down the
/// AVX2 path and the AVX-512 BF16 one on any CPU), `host doctor` says which runs, and a bad value
/// is a problem naming the variable, refused by `host inference` before it reads a model.
#[test]
fn the_cpu_kernels_can_be_chosen_and_doctor_says_which_run() {
    let home = tempfile::tempdir().unwrap();
    let native = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .contains(" avx512_bf16");
    for (value, says) in [
        (
            "avx2",
            "widened to f32 in registers (RLHOST_CPU_KERNELS=avx2)",
        ),
        (
            "avx512-bf16",
            if native {
                "AVX-512 BF16 dot products (RLHOST_CPU_KERNELS=avx512-bf16)"
            } else {
                "the AVX-512 BF16 kernel on its emulation"
            },
        ),
    ] {
        let (_, r) = doctor_json(host(home.path()).env("RLHOST_CPU_KERNELS", value));
        let products = r["cpu_dtype"]["bf16_products"].as_str().unwrap();
        assert!(products.starts_with(says), "{value}: {products}");
        assert!(
            r["problems"]
                .as_array()
                .unwrap()
                .iter()
                .all(|p| !p.as_str().unwrap().contains("RLHOST_CPU_KERNELS")),
            "{r:#}"
        );
    }
    let (code, r) = doctor_json(host(home.path()).env("RLHOST_CPU_KERNELS", "avx1024"));
    assert_eq!(code, Some(1), "{r:#}");
    assert!(
        r["problems"].as_array().unwrap().iter().any(|p| p
            .as_str()
            .unwrap()
            .contains("invalid RLHOST_CPU_KERNELS=\"avx1024\"")),
        "{r:#}"
    );
    let err = common::run_err(
        host(home.path())
            .env("RLHOST_CPU_KERNELS", "avx1024")
            .args(["inference", "--model", "/nonexistent", "--port", "0"]),
    );
    assert!(err.contains("invalid RLHOST_CPU_KERNELS"), "{err}");
    assert!(
        !err.contains("/nonexistent"),
        "refused before the model: {err}"
    );
}
