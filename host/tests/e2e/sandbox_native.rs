//! End-to-end: `host sandbox run --backend native`, the native sandbox fallback as a user meets it
//! (the sandbox itself: `lib::sandbox_native`). Skips, with the reason printed, where this kernel
//! does not allow the isolation.

use rlhost::sandbox::SANDBOX_ENV;

use crate::common;

/// Through the CLI, with a secret in the caller's environment.
#[test]
fn a_secret_in_the_hosts_environment_does_not_reach_the_code() {
    let home = tempfile::tempdir().unwrap();
    let out = common::run(
        common::host(home.path())
            .env("MY_SECRET_API_KEY", "sk-rlhost-test-secret")
            .args([
                "sandbox",
                "run",
                "--backend",
                "native",
                "--timeout",
                "10",
                "-c",
            ])
            .arg("import os\nprint(os.environ.get('MY_SECRET_API_KEY'), len(os.environ))"),
    );
    let (stdout, stderr) = common::texts(&out);
    if stderr.contains("does not let the sandbox isolate") {
        common::skip(
            "a_secret_in_the_hosts_environment_does_not_reach_the_code",
            &stderr,
        );
        return;
    }
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(stdout, format!("None {}\n", SANDBOX_ENV.len()), "{stderr}");
    assert!(!stdout.contains("sk-rlhost") && !stderr.contains("sk-rlhost"));
}
