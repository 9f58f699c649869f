//! The native sandbox fallback (real CPython with C extensions, forked from a zygote into
//! namespaces + seccomp + rlimits): the same hostile suite as the WebAssembly sandbox. Skips, with
//! the reason printed, where this kernel does not allow the isolation. (Through `host sandbox run`:
//! `e2e::sandbox_native`.)

use std::path::PathBuf;
use std::sync::Arc;

use rlhost::sandbox::{NativeOptions, NativeSandbox, SANDBOX_ENV, SandboxError, SandboxPolicy};
use rlhost_sdk::types::PythonLimits;

use crate::common;

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

/// The code sees only the documented environment, nothing of the host's (issue 18, item 7).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_is_the_documented_set() {
    let Some(sb) = sandbox("the_environment_is_the_documented_set").await else {
        return;
    };
    let documented = [
        "MKL_NUM_THREADS",
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "PYTHONCOERCECLOCALE",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONUTF8",
    ];
    let mut exported: Vec<&str> = SANDBOX_ENV.iter().map(|(k, _)| *k).collect();
    exported.sort();
    assert_eq!(exported, documented);
    let out = sb
        .run(
            "import os, sys\nprint(sorted(os.environ))\nprint(sys.argv)",
            limits(10_000),
        )
        .await
        .unwrap();
    assert_eq!(
        out.stdout,
        format!("{documented:?}\n['']\n").replace('"', "'"),
        "{}",
        out.stderr
    );
}

/// Every syscall that signals or reaches another process, called by number, is refused; the code
/// is PID 1 of its own PID namespace (issue 18, item 8).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_and_pidfds_are_refused_and_pids_are_private() {
    let Some(sb) = sandbox("signals_and_pidfds_are_refused_and_pids_are_private").await else {
        return;
    };
    let code = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
L = ctypes.c_long
me = os.getpid()
info = ctypes.create_string_buffer(128)
calls = {
    "kill": (62, me, 0), "tkill": (200, me, 0), "tgkill": (234, me, me, 0),
    "rt_sigqueueinfo": (129, me, 0, info), "rt_tgsigqueueinfo": (297, me, me, 0, info),
    "pidfd_open": (434, me, 0), "pidfd_send_signal": (424, 0, 0, None, 0),
    "pidfd_getfd": (438, 0, 0, 0), "process_madvise": (440, 0, None, 0, 0, 0),
    "process_mrelease": (448, 0, 0), "kcmp": (312, me, me, 0, 0, 0),
    "setpgid": (109, 0, 0), "setsid": (112,), "ioprio_set": (251, 1, me, 0),
    "setpriority": (141, 0, 0, 0),
}
for name, (nr, *args) in calls.items():
    args = [a if isinstance(a, ctypes.Array) or a is None else L(a) for a in args]
    ctypes.set_errno(0)
    r = libc.syscall(L(nr), *args)
    print(name, r, ctypes.get_errno())
print("pids", os.getpid(), os.getppid())
"#;
    let out = sb.run(code, limits(10_000)).await.unwrap();
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 16, "{}", out.stdout);
    for line in &lines[..15] {
        let name = line.split(' ').next().unwrap();
        assert_eq!(*line, format!("{name} -1 1"), "{name} must fail with EPERM");
    }
    assert_eq!(
        lines[15], "pids 1 0",
        "the code is PID 1 of its own namespace"
    );
}

/// A real process outside the sandbox, of the same uid as the code, survives every way of
/// signalling it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_outside_cannot_be_signalled() {
    use std::os::unix::process::CommandExt;
    let Some(sb) = sandbox("a_process_outside_cannot_be_signalled").await else {
        return;
    };
    let mut canary = std::process::Command::new("sleep");
    canary.arg("60");
    // As root the sandboxed code runs as nobody (65534): so does the canary.
    if nix_is_root() {
        canary.uid(65534).gid(65534);
    }
    let mut canary = canary.spawn().unwrap();
    let pid = canary.id();
    let code = format!(
        r#"
import ctypes, os, struct
libc = ctypes.CDLL(None, use_errno=True)
L = ctypes.c_long
pid = {pid}
info = ctypes.create_string_buffer(128)
struct.pack_into("iii", info, 0, 9, 0, -1)  # SIGKILL, SI_QUEUE
for nr, *args in [(62, pid, 9), (200, pid, 9), (234, pid, pid, 9), (129, pid, 9, info),
                  (297, pid, pid, 9, info)]:
    libc.syscall(L(nr), *[a if isinstance(a, ctypes.Array) else L(a) for a in args])
fd = libc.syscall(L(434), L(pid), L(0))
libc.syscall(L(424), L(fd), L(9), None, L(0))
for p in (pid, -pid):
    try:
        os.kill(p, 9)
    except OSError:
        pass
print("tried")
"#
    );
    let out = sb.run(&code, limits(10_000)).await.unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let alive = canary.try_wait().unwrap().is_none();
    let _ = canary.kill();
    let _ = canary.wait();
    assert_eq!(out.stdout, "tried\n", "{}", out.stderr);
    assert!(alive, "the sandboxed code killed process {pid} outside it");
}

fn nix_is_root() -> bool {
    let out = std::process::Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == "0"
}

/// Output past the cap is dropped while the program carries on; only an endless printer is
/// stopped (issue 18, item 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overflowing_output_is_cut_and_the_program_finishes() {
    let Some(sb) = sandbox("overflowing_output_is_cut_and_the_program_finishes").await else {
        return;
    };
    let note = "[output truncated after 4096 bytes]";
    let out = sb
        .run(
            "import sys\nsys.stderr.write('E' * 70000)\nprint('after')",
            limits(10_000),
        )
        .await
        .unwrap();
    assert_eq!(
        (out.stdout.as_str(), out.exit_code),
        ("after\n", 0),
        "{out:?}"
    );
    assert!(out.stderr.starts_with("EEEE") && out.stderr.ends_with(note));
    let out = sb
        .run(
            "import sys\nprint('x' * 70000)\nsys.stderr.write('done\\n')",
            limits(10_000),
        )
        .await
        .unwrap();
    assert_eq!(
        (out.stderr.as_str(), out.exit_code),
        ("done\n", 0),
        "{out:?}"
    );
    assert!(out.stdout.ends_with(note));
    let started = std::time::Instant::now();
    let out = sb
        .run("while True: print(1)", limits(20_000))
        .await
        .unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert!(!out.timed_out && out.exit_code == 1, "{out:?}");
    assert!(out.stdout.ends_with(note));
}

/// The model's side of a math-python rollout, fixed: one python tool call, then an answer.
struct ToolThenAnswer;

#[async_trait::async_trait]
impl rlhost::rollout::Generator for ToolThenAnswer {
    fn describe(&self) -> String {
        "scripted".into()
    }

    async fn complete(
        &self,
        req: &rlhost::openai::ChatRequest,
    ) -> Result<rlhost::rollout::Turn, rlhost::rollout::GenError> {
        let answered_by_tool = req
            .messages
            .iter()
            .any(|m| m.role == rlhost::openai::Role::Tool);
        let mut turn = rlhost::rollout::Turn {
            finish_reason: "stop".into(),
            prompt_tokens: 1,
            completion_tokens: 1,
            ..Default::default()
        };
        if answered_by_tool {
            turn.content = "$\\boxed{42}$".into();
        } else {
            turn.tool_calls = vec![rlhost_sdk::types::ToolCall {
                id: "c".into(),
                name: "python".into(),
                arguments: "{\"code\": \"print(6 * 7)\"}".into(),
            }];
        }
        Ok(turn)
    }
}

/// A sandbox that dies while an evaluation runs stops it with that error: the rollouts before
/// are kept, none after is scored against the failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_dying_mid_run_stops_the_evaluation() {
    use rlhost::eval::{EvalOptions, EvalPlan};
    use rlhost::plugin::{LoadOptions, PluginLoader, SandboxOffer};
    let Some(sb) = sandbox("a_sandbox_dying_mid_run_stops_the_evaluation").await else {
        return;
    };
    let sb = Arc::new(sb);
    let zygotes = sb.zygote_pids().await;
    assert_eq!(zygotes.len(), 2);
    let loader = PluginLoader::new(
        LoadOptions {
            sandbox: SandboxOffer::Ready(sb.clone()),
            ..Default::default()
        },
        None,
    )
    .unwrap();
    let env = loader
        .load_environment(&common::dist("math-python"))
        .await
        .unwrap();
    let plan = EvalPlan {
        env: env.clone(),
        rewards: Vec::new(),
        split: "train".into(),
        num_examples: Some(4),
        rollouts: 1,
        env_args: "{}".into(),
    };
    let examples = rlhost::eval::examples(&plan).await.unwrap();
    let options = EvalOptions {
        concurrency: Some(1),
        sampling: Default::default(),
        seed: 1,
        retries: 0,
        model: "scripted".into(),
    };
    let done = std::sync::Mutex::new(Vec::new());
    let on_done = |r: &rlhost::rollout::RolloutRecord| {
        let mut done = done.lock().unwrap();
        done.push(r.clone());
        // After the first rollout the sandbox's processes die.
        if done.len() == 1 {
            for pid in &zygotes {
                let killed = std::process::Command::new("kill")
                    .args(["-9", &pid.to_string()])
                    .status()
                    .unwrap();
                assert!(killed.success(), "zygote {pid} killed");
            }
        }
    };
    let run = rlhost::eval::run(
        &plan,
        &examples,
        &ToolThenAnswer,
        &options,
        &on_done,
        std::future::pending::<()>(),
    )
    .await;
    let lost = run.expect_err("the run stops");
    assert_eq!(lost.capability, "sandbox.python");
    assert!(lost.plugin.starts_with("will/math-python v"), "{lost}");
    assert!(lost.source.to_string().contains("zygote"), "{lost:?}");
    // The one rollout before was real: its tool call ran (6 * 7) and it was scored.
    let done = done.into_inner().unwrap();
    assert_eq!(
        done.len(),
        1,
        "no rollout after the loss reached the caller"
    );
    let tool = done[0]
        .completion
        .iter()
        .find(|m| m.role == rlhost_sdk::types::Role::Tool)
        .unwrap();
    assert_eq!(tool.content.trim(), "42");
    assert!(done[0].error.is_none() && done[0].missing_capabilities.is_empty());
    assert!(env.capabilities().lost().is_some());
}

/// Calls dropped mid-flight at full concurrency (a client that went away, a rollout cancelled)
/// lose nothing: their zygotes are replaced, and the next calls at full concurrency all run
/// (before, the permit came back without its zygote and the next call panicked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_dropped_mid_flight_leave_every_worker_usable() {
    let Some(sb) = sandbox("calls_dropped_mid_flight_leave_every_worker_usable").await else {
        return;
    };
    let sb = Arc::new(sb);
    let before = sb.zygote_pids().await;
    assert_eq!(before.len(), 2);
    for round in 0..2 {
        // Both workers busy, then both calls dropped while their code sleeps.
        let calls: Vec<_> = (0..2)
            .map(|_| {
                let sb = sb.clone();
                tokio::spawn(async move {
                    tokio::time::timeout(
                        std::time::Duration::from_millis(700),
                        sb.run("import time\ntime.sleep(30)", limits(60_000)),
                    )
                    .await
                })
            })
            .collect();
        for c in calls {
            assert!(
                c.await.unwrap().is_err(),
                "round {round}: the call was not dropped"
            );
        }
        // Full concurrency again: every call runs (waiting for the replacements if need be).
        let calls: Vec<_> = (0..4)
            .map(|i| {
                let sb = sb.clone();
                tokio::spawn(async move { sb.run(&format!("print({i})"), limits(10_000)).await })
            })
            .collect();
        for (i, c) in calls.into_iter().enumerate() {
            let out = c.await.expect("no panic").expect("the call runs");
            assert_eq!(
                out.stdout,
                format!("{i}\n"),
                "round {round}: {}",
                out.stderr
            );
        }
    }
    // The dropped calls' zygotes were killed and replaced: two idle zygotes, new processes (a
    // replacement may still be starting: the calls above could all run on the first one back).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut after = sb.zygote_pids().await;
    while after.len() < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        after = sb.zygote_pids().await;
    }
    assert_eq!(after.len(), 2, "{after:?}");
    assert!(
        after.iter().all(|p| !before.contains(p)),
        "{before:?} {after:?}"
    );
}

/// The call's standard input is empty, at the file descriptor too: fd 0 is never the zygote's
/// request pipe (from which a call could read the requests that follow).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_is_empty_down_to_its_file_descriptor() {
    let Some(sb) = sandbox("stdin_is_empty_down_to_its_file_descriptor").await else {
        return;
    };
    let code = "import os, stat\nprint(repr(os.read(0, 10)), stat.S_ISCHR(os.fstat(0).st_mode))\n\
                try:\n    input()\nexcept EOFError:\n    print('EOF')";
    let out = sb.run(code, limits(5_000)).await.unwrap();
    assert_eq!(out.stdout, "b'' True\nEOF\n", "{out:?}");
    assert!(!out.timed_out);
}
