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

/// Descriptors the caller of `host` left open without close-on-exec (a pipe, a file holding a
/// secret) do not reach the code: it sees exactly stdin (empty), stdout and stderr.
#[test]
fn descriptors_the_caller_leaves_open_do_not_reach_the_code() {
    let home = tempfile::tempdir().unwrap();
    let secret = home.path().join("secret.txt");
    std::fs::write(&secret, "sk-rlhost-fd-secret").unwrap();
    // Python opens an inheritable pipe and file, as a careless parent would, and runs `host`
    // with them open.
    let spawn = r#"
import os, subprocess, sys
r, w = os.pipe()
f = os.open(sys.argv[1], os.O_RDONLY)
for fd in (r, w, f):
    os.set_inheritable(fd, True)
code = (
    "import os\n"
    "fds = []\n"
    "for fd in range(1024):\n"
    "    try:\n"
    "        os.fstat(fd)\n"
    "        fds.append(fd)\n"
    "    except OSError:\n"
    "        pass\n"
    "print(fds)\n"
)
out = subprocess.run(
    [sys.argv[2], "sandbox", "run", "--backend", "native", "--timeout", "10", "-c", code],
    pass_fds=(r, w, f), capture_output=True, text=True,
)
sys.stdout.write(out.stdout)
sys.stderr.write(out.stderr)
sys.exit(out.returncode)
"#;
    let out = common::run(
        std::process::Command::new("python3")
            .env("RLHOST_HOME", home.path())
            .env_remove("RLHOST_REGISTRY")
            .env_remove("RLHOST_LOG")
            .args(["-c", spawn])
            .arg(&secret)
            .arg(common::host_bin()),
    );
    let (stdout, stderr) = common::texts(&out);
    if stderr.contains("does not let the sandbox isolate") {
        common::skip(
            "descriptors_the_caller_leaves_open_do_not_reach_the_code",
            &stderr,
        );
        return;
    }
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(stdout, "[0, 1, 2]\n", "{stderr}");
}
