//! The native sandbox fallback (real CPython with C extensions, forked from a zygote into
//! namespaces + seccomp + rlimits): the same hostile suite as the WebAssembly sandbox. Skips, with
//! the reason printed, where this kernel does not allow the isolation.

mod common;

use std::path::PathBuf;

use rlhost::sandbox::{NativeOptions, NativeSandbox, SandboxError, SandboxPolicy};
use rlhost_sdk::types::PythonLimits;

/// The reference venv's interpreter has numpy; otherwise the system's.
fn python() -> (PathBuf, Vec<String>) {
    let venv = common::repo_root().join(".venv-ref/bin/python");
    if venv.is_file() {
        (venv, vec!["numpy".into(), "sympy".into()])
    } else {
        (PathBuf::from("python3"), vec![])
    }
}

async fn sandbox(test: &str) -> Option<NativeSandbox> {
    let (python, preload) = python();
    let policy = SandboxPolicy {
        workers: 2,
        ..Default::default()
    };
    match NativeSandbox::start(NativeOptions { python, preload }, policy).await {
        Ok(s) => Some(s),
        Err(SandboxError::Setup(why)) if why.contains("does not let the sandbox isolate") => {
            common::skip(test, &why);
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn limits(timeout_ms: u32) -> PythonLimits {
    PythonLimits {
        timeout_ms,
        memory_mib: 512,
        max_output_bytes: 4096,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_python_with_c_extensions() {
    let Some(sb) = sandbox("runs_python_with_c_extensions").await else {
        return;
    };
    let out = sb.run("print(1+1)\n6*7", limits(10_000)).await.unwrap();
    assert_eq!((out.stdout.as_str(), out.exit_code), ("2\n42\n", 0));
    if python().1.contains(&"numpy".to_string()) {
        let out = sb
            .run(
                "import numpy as np\nint(np.arange(10).sum())",
                limits(10_000),
            )
            .await
            .unwrap();
        assert_eq!(out.stdout, "45\n", "{}", out.stderr);
    } else {
        common::skip("runs_python_with_c_extensions", "numpy check: no .venv-ref");
    }
    let out = sb
        .run("import os\nos._exit(7)", limits(10_000))
        .await
        .unwrap();
    assert_eq!(out.exit_code, 7);
    let out = sb.run("x = 1 / 0", limits(10_000)).await.unwrap();
    assert!(out.stderr.contains("ZeroDivisionError") && out.stderr.contains("line 1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_code_is_contained() {
    let Some(sb) = sandbox("native hostile_code_is_contained").await else {
        return;
    };
    let cases: &[(&str, &str)] = &[
        ("x = []\nwhile True: x.append(' ' * 10**6)", "MemoryError"),
        ("def f(n): return f(n + 1)\nf(0)", "RecursionError"),
        ("eval('(' * 200000 + ')' * 200000)", "Error"),
        ("open('/etc/passwd').read()", "FileNotFoundError"),
        ("open('/tmp/x', 'w').write('x')", "Error"),
        (
            "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 22))",
            "PermissionError",
        ),
        ("import subprocess\nsubprocess.run(['ls'])", "Error"),
        ("import os\nos.fork()", "PermissionError"),
        ("import os\nos.kill(1, 9)", "PermissionError"),
    ];
    for (code, expected) in cases {
        let out = sb.run(code, limits(10_000)).await.unwrap();
        assert_ne!(out.exit_code, 0, "{code}: {out:?}");
        assert!(!out.timed_out, "{code}: {out:?}");
        assert!(out.stderr.contains(expected), "{code}: {}", out.stderr);
    }
    let out = sb.run("while True: pass", limits(500)).await.unwrap();
    assert!(out.timed_out);
    assert_eq!(
        out.stderr,
        "Error: Code execution timed out after 0.5 seconds"
    );
    let out = sb
        .run("while True: print('spam' * 100)", limits(10_000))
        .await
        .unwrap();
    assert!(!out.timed_out, "a flood must fail fast");
    assert!(
        out.stdout.ends_with("[output truncated after 4096 bytes]"),
        "{out:?}"
    );
    let out = sb
        .run("import threading\nt = threading.Thread(target=print, args=('t',))\nt.start(); t.join()", limits(10_000))
        .await
        .unwrap();
    assert_eq!(out.stdout, "t\n", "threads work: {}", out.stderr);
    // Still serving.
    assert_eq!(
        sb.run("print('ok')", limits(10_000)).await.unwrap().stdout,
        "ok\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_preload_refuses_to_start() {
    let options = NativeOptions {
        python: python().0,
        preload: vec!["no_such_module_rlhost".into()],
    };
    let policy = SandboxPolicy {
        workers: 1,
        ..Default::default()
    };
    let err = NativeSandbox::start(options, policy).await.err().unwrap();
    assert!(
        err.to_string()
            .contains("cannot preload no_such_module_rlhost"),
        "{err}"
    );
}
