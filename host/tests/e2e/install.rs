//! An installed `host` is self-contained: the binary in an empty prefix (what `cargo install
//! --path host` produces, plus the sandbox component `make install` puts in `share/rlhost/`),
//! run from an unrelated folder with a clean environment (no `$RLHOST_SOURCE`, no checkout, no
//! build tree), finds what it ships with and nothing of the folder it was compiled in.

use std::path::Path;
use std::process::Command;

use crate::common;

/// The installed binary with nothing of the checkout in its environment.
fn installed(bin: &Path, work: &Path, home: &Path) -> Command {
    let mut cmd = Command::new(bin);
    cmd.current_dir(work)
        .env_clear()
        .env("HOME", home.join("user"))
        .env("RLHOST_HOME", home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    cmd
}

#[test]
fn an_installed_host_runs_from_another_folder_without_the_build_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let prefix = tmp.path().join("prefix");
    let (work, home) = (tmp.path().join("work"), tmp.path().join("home"));
    for d in [
        prefix.join("bin"),
        prefix.join("share/rlhost"),
        work.clone(),
        home.clone(),
    ] {
        std::fs::create_dir_all(d).unwrap();
    }
    // `cargo install --path host --root PREFIX` builds this same binary and copies it to
    // PREFIX/bin (running cargo from a test would wait on the lock the test run holds).
    let bin = prefix.join("bin/host");
    std::fs::copy(common::host_bin(), &bin).unwrap();
    let component = common::built(
        common::repo_root().join("sandbox/target/python-sandbox.wasm"),
        "sandbox",
    );
    let shared = prefix.join("share/rlhost/python-sandbox.wasm");
    if std::fs::hard_link(&component, &shared).is_err() {
        std::fs::copy(&component, &shared).unwrap();
    }

    // The sandbox: found in the prefix's share folder.
    let out = common::run_ok(installed(&bin, &work, &home).args([
        "sandbox",
        "run",
        "-c",
        "print(6 * 7)",
    ]));
    assert_eq!(out.trim(), "42");

    // Without it, the error lists where it looked: the home and the prefix, no build tree.
    std::fs::remove_file(&shared).unwrap();
    let err = common::run_err(installed(&bin, &work, &home).args(["sandbox", "run", "-c", "1"]));
    assert!(err.contains("no Python sandbox component found"), "{err}");
    assert!(
        err.contains(&home.join("sandbox").display().to_string()),
        "{err}"
    );
    let repo = common::repo_root().display().to_string();
    assert!(
        !err.contains(&repo),
        "an installed host looked in the build tree: {err}"
    );

    // `host env init`: a project depending on the released SDK, not on the build tree's sdk/.
    common::run_ok(installed(&bin, &work, &home).args(["env", "init", "my-env"]));
    let manifest = std::fs::read_to_string(work.join("my-env/Cargo.toml")).unwrap();
    assert!(
        manifest.contains(&format!("rlhost-sdk = \"{}\"", rlhost_sdk::ABI_VERSION)),
        "{manifest}"
    );
    assert!(!manifest.contains(&repo), "{manifest}");

    // `host bench sandbox`: both sides measured, the component from the prefix again.
    std::fs::hard_link(&component, &shared)
        .or_else(|_| std::fs::copy(&component, &shared).map(|_| ()))
        .unwrap();
    let report = common::run_ok(
        installed(&bin, &work, &home).args(["bench", "sandbox", "--scale", "0.05", "--json"]),
    );
    let v: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert!(v.is_object(), "{report}");

    // `host rl --plugin arith`: the presets are built in; what is missing is the environment.
    let err = common::run_err(installed(&bin, &work, &home).args(["rl", "--plugin", "arith"]));
    assert!(err.contains("host env install arith"), "{err}");
    let preset = home.join(format!(
        "cache/configs-{}/arith/rl/train.toml",
        rlhost::VERSION
    ));
    assert_eq!(
        std::fs::read_to_string(preset).unwrap(),
        std::fs::read_to_string(common::repo_root().join("configs/arith/rl/train.toml")).unwrap()
    );
}
