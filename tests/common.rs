//! Helpers shared by the end-to-end tests: run the built `host` binary as a user would, in an
//! isolated `$RLHOST_HOME`.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `host` binary cargo built for these tests.
pub fn host_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_host"))
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ has a parent")
        .to_owned()
}

/// A `host` command with its own empty home folder and no registry override.
pub fn host(home: &Path) -> Command {
    let mut cmd = Command::new(host_bin());
    cmd.env("RLHOST_HOME", home)
        .env_remove("RLHOST_REGISTRY")
        .env_remove("RLHOST_LOG");
    cmd
}

/// Runs a command and returns its output, printing both streams on failure to read.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"))
}

/// stdout and stderr as text.
pub fn texts(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The reference venv's Python, if `scripts/setup-py-reference.sh` has been run; otherwise prints
/// why the calling test skips its reference comparison.
pub fn reference_python(test: &str) -> Option<PathBuf> {
    let python = repo_root().join(".venv-ref/bin/python");
    if python.is_file() {
        Some(python)
    } else {
        skip(
            test,
            &format!(
                "{} is absent; run `make setup-py-reference`",
                python.display()
            ),
        );
        None
    }
}

/// Records that `test` skipped (part of) its work and why: printed, and appended to the file named
/// by `$RLHOST_SKIP_LOG` so `make test` can show it (cargo hides passing tests' output).
pub fn skip(test: &str, why: &str) {
    let line = format!("SKIPPED {test}: {why}");
    println!("{line}");
    if let Some(path) = std::env::var_os("RLHOST_SKIP_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}
