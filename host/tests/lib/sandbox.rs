//! The Python sandbox against the real component (`make sandbox` builds
//! `sandbox/target/python-sandbox.wasm`): correctness, and hostile code contained with the
//! message a model should read.

use rlhost::sandbox::{REPL_RESET_NOTE, WasmSandbox};
use rlhost_sdk::types::{PythonLimits, PythonOutput};

use crate::common;

/// The test binary's one sandbox (default policy).
fn sandbox() -> &'static WasmSandbox {
    common::python_sandbox()
}

fn limits(timeout_ms: u32) -> PythonLimits {
    PythonLimits {
        timeout_ms,
        memory_mib: 512,
        max_output_bytes: 64 * 1024,
    }
}

async fn run(code: &str) -> PythonOutput {
    sandbox().run(code, limits(10_000)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prints_and_evaluates_like_a_notebook() {
    let out = run("print(1+1)").await;
    assert_eq!(
        (out.stdout.as_str(), out.exit_code, out.timed_out),
        ("2\n", 0, false)
    );
    let out = run("x = 6\nx * 7").await;
    assert_eq!(out.stdout, "42\n");
    let out = run("None").await;
    assert_eq!(out.stdout, "");
    let out = run("from fractions import Fraction\nFraction(1, 3) + Fraction(1, 6)").await;
    assert_eq!(out.stdout, "Fraction(1, 2)\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sympy_is_ready() {
    let out = run("from sympy import *\nx = symbols('x')\nintegrate(sin(x)**2, x)").await;
    assert_eq!(out.stdout, "x/2 - sin(x)*cos(x)/2\n", "{}", out.stderr);
    let out = run("import sympy\nsympy.solve(sympy.Symbol('y')**2 - 2)").await;
    assert_eq!(out.stdout, "[-sqrt(2), sqrt(2)]\n", "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracebacks_show_the_users_lines() {
    let out = run("a = 1\nb = 0\nprint(a / b)").await;
    assert_eq!(out.exit_code, 1);
    assert!(out.stderr.contains("line 3"), "{}", out.stderr);
    assert!(out.stderr.contains("print(a / b)"), "{}", out.stderr);
    assert!(
        out.stderr
            .trim_end()
            .ends_with("ZeroDivisionError: division by zero"),
        "{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("app.py"),
        "sandbox internals leak: {}",
        out.stderr
    );
    let out = run("def f(:\n  pass").await;
    assert!(out.stderr.contains("SyntaxError"), "{}", out.stderr);
    let out = run("import sys\nprint('bye')\nsys.exit(3)").await;
    assert_eq!((out.stdout.as_str(), out.exit_code), ("bye\n", 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_mode_forgets_and_repl_mode_remembers() {
    run("secret = 41").await;
    let out = run("print(secret)").await;
    assert!(out.stderr.contains("NameError"), "{}", out.stderr);
    let mut repl = sandbox().repl();
    repl.run("secret = 41", limits(10_000)).await.unwrap();
    let out = repl.run("secret + 1", limits(10_000)).await.unwrap();
    assert_eq!(out.stdout, "42\n");
    // A crash resets the session and says so.
    let out = repl.run("while True: pass", limits(300)).await.unwrap();
    assert!(out.timed_out);
    assert!(out.stderr.ends_with(REPL_RESET_NOTE), "{}", out.stderr);
    let out = repl.run("print(secret)", limits(10_000)).await.unwrap();
    assert!(out.stderr.contains("NameError"), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infinite_loop_times_out_with_the_seed_message() {
    let out = sandbox()
        .run("while True:\n    pass", limits(500))
        .await
        .unwrap();
    assert!(out.timed_out);
    assert_eq!(out.exit_code, 124);
    assert_eq!(
        out.stderr,
        "Error: Code execution timed out after 0.5 seconds"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_code_is_contained() {
    let cases: &[(&str, &str)] = &[
        ("x = []\nwhile True: x.append(' ' * 10**6)", "MemoryError"),
        ("def f(n): return f(n + 1)\nf(0)", "RecursionError"),
        ("eval('(' * 200000 + ')' * 200000)", "Error"),
        ("open('/etc/passwd').read()", "Error"),
        (
            "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 22))",
            "Error",
        ),
        ("import subprocess\nsubprocess.run(['ls'])", "Error"),
        ("import os\nos.fork()", "Error"),
        ("import os\nos.environ['HOME']", "KeyError"),
    ];
    for (code, expected) in cases {
        let out = sandbox().run(code, limits(10_000)).await.unwrap();
        assert_ne!(out.exit_code, 0, "{code}: {out:?}");
        assert!(!out.timed_out, "{code}: {out:?}");
        assert!(out.stderr.contains(expected), "{code}: {}", out.stderr);
        assert!(!out.stdout.contains("root:"), "{code} read host files");
    }
    // The sandbox still works afterwards.
    assert_eq!(run("print('still here')").await.stdout, "still here\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_floods_are_cut() {
    let mut l = limits(5_000);
    l.max_output_bytes = 1000;
    let out = sandbox()
        .run("while True: print('spam' * 100)", l)
        .await
        .unwrap();
    assert!(
        !out.timed_out,
        "a flood must fail fast, not run to its deadline"
    );
    assert!(out.stdout.starts_with("spamspam"), "{out:?}");
    assert!(
        out.stdout.ends_with("[output truncated after 1000 bytes]"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.len() < 1100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn os_exit_and_threads() {
    // WASI p2 can only say "failed": every non-zero exit status reads as 1.
    let out = run("import os\nprint('x', flush=True)\nos._exit(7)").await;
    assert_eq!((out.stdout.as_str(), out.exit_code), ("x\n", 1));
    let out = run("import os\nos._exit(0)").await;
    assert_eq!(out.exit_code, 0);
    let out = run("import threading\nt = threading.Thread(target=print)\nt.start()").await;
    assert_ne!(out.exit_code, 0);
    assert!(out.stderr.contains("Error"), "{}", out.stderr);
}

/// Resident memory of this process, from /proc.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kib * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_calls_queue_without_missing_deadlines() {
    // Warm up so the baseline includes one instantiated snapshot.
    run("pass").await;
    let before = rss_bytes();
    let calls: Vec<_> = (0..64)
        .map(|i| {
            tokio::spawn(async move {
                sandbox()
                    .run(&format!("sum(range({i} * 1000))"), limits(2_000))
                    .await
                    .unwrap()
            })
        })
        .collect();
    for (i, call) in calls.into_iter().enumerate() {
        let out = call.await.unwrap();
        assert!(!out.timed_out, "call {i} missed its deadline while queued");
        let n = i as u64 * 1000;
        assert_eq!(out.stdout, format!("{}\n", n * n.saturating_sub(1) / 2));
    }
    // Only `workers` interpreters are ever alive: 64 calls must not hold 64 snapshots (~100 MB
    // each) at once.
    let grown = rss_bytes().saturating_sub(before);
    assert!(
        grown < 1 << 30,
        "memory grew by {} MiB over 64 calls",
        grown >> 20
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_reach_the_sandbox_through_run_python() {
    use rlhost::plugin::{LoadOptions, PluginLoader};
    use std::sync::Arc;

    let probe = common::wasm("fixture-probe");
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(&probe, tmp.path().join("plugin.wasm")).unwrap();
    std::fs::write(
        tmp.path().join("plugin.toml"),
        "[plugin]\nowner = \"test\"\nname = \"probe\"\nversion = \"0.1.0\"\n\
         kind = \"environment\"\nabi = \"rlhost:env@0.1.0\"\nruntime = \"wasm\"\n\
         capabilities = [\"sandbox.python\"]\n",
    )
    .unwrap();
    let loader = PluginLoader::new(
        LoadOptions {
            sandbox: rlhost::plugin::SandboxOffer::Ready(Arc::new(sandbox().clone())),
            ..Default::default()
        },
        None,
    )
    .unwrap();
    let env = loader.load_environment(tmp.path()).await.unwrap();
    let mut session = env.start(1).await.unwrap();
    let step = session.env_response(&[], "{}").await.unwrap();
    assert_eq!(step.messages[0].content, "ok: 42\n");
}

/// Code that blocks in a host call (a WASI poll on a clock) rather than running wasm: the
/// deadline must interrupt it too (issue 18, item 5).
const BLOCKING: &[&str] = &[
    "import time\ntime.sleep(20)",
    "import select\nselect.select([], [], [], 20)",
    "import time\nfor _ in range(400):\n    time.sleep(0.05)",
    "import time\nprint('before', flush=True)\ntime.sleep(20)",
];

fn assert_stopped_in_time(code: &str, out: &PythonOutput, elapsed: std::time::Duration) {
    assert!(
        elapsed < std::time::Duration::from_millis(1_500 + 1_500),
        "{code}: a 1.5 s deadline took {elapsed:?}"
    );
    assert!(out.timed_out, "{code}: {out:?}");
    assert_eq!(out.exit_code, 124, "{code}: {out:?}");
    assert!(
        out.stderr
            .contains("Error: Code execution timed out after 1.5 seconds"),
        "{code}: {}",
        out.stderr
    );
    assert!(!out.stderr.contains("crashed"), "{code}: {}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_calls_end_at_the_deadline() {
    run("pass").await;
    for code in BLOCKING {
        let started = std::time::Instant::now();
        let out = sandbox().run(code, limits(1_500)).await.unwrap();
        assert_stopped_in_time(code, &out, started.elapsed());
        if code.contains("before") {
            assert_eq!(out.stdout, "before\n", "output before the wait is kept");
            assert_eq!(
                out.stderr,
                "Error: Code execution timed out after 1.5 seconds"
            );
        }
    }
    // The workers are free again.
    assert_eq!(run("print('still here')").await.stdout, "still here\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_calls_end_at_the_deadline_in_a_repl() {
    let mut repl = sandbox().repl();
    for code in BLOCKING {
        repl.run("kept = 1", limits(10_000)).await.unwrap();
        let started = std::time::Instant::now();
        let out = repl.run(code, limits(1_500)).await.unwrap();
        assert_stopped_in_time(code, &out, started.elapsed());
        assert!(out.stderr.ends_with(REPL_RESET_NOTE), "{}", out.stderr);
        // A fresh interpreter serves the next call.
        let out = repl.run("print(6 * 7)", limits(10_000)).await.unwrap();
        assert_eq!(out.stdout, "42\n", "{}", out.stderr);
    }
    // A short sleep within the deadline still just works, and keeps the session.
    repl.run("import time\nkept = 2", limits(10_000))
        .await
        .unwrap();
    let out = repl
        .run("time.sleep(0.2)\nprint(kept)", limits(10_000))
        .await
        .unwrap();
    assert_eq!((out.stdout.as_str(), out.exit_code), ("2\n", 0));
}

/// Printing past the cap keeps what fits, says so, and lets the program finish: no crash
/// message, no `BrokenPipeError`, and a REPL keeps its variables (issue 18, item 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overflowing_output_is_cut_not_crashed() {
    let note = "[output truncated after 65536 bytes]";
    let no_crash = |out: &PythonOutput| {
        for text in [&out.stdout, &out.stderr] {
            assert!(!text.contains("crashed"), "{out:?}");
            assert!(!text.contains("Error"), "{out:?}");
            assert!(!text.contains(REPL_RESET_NOTE), "{out:?}");
        }
    };
    let stderr_flood = "import sys\nsys.stderr.write('E' * 70000)\nprint('after')";
    let stdout_flood = "import sys\nprint('x' * 70000)\nsys.stderr.write('done\\n')";

    let out = sandbox().run(stderr_flood, limits(10_000)).await.unwrap();
    no_crash(&out);
    assert_eq!((out.stdout.as_str(), out.exit_code), ("after\n", 0));
    assert!(out.stderr.starts_with("EEEE") && out.stderr.ends_with(note));
    assert!(out.stderr.len() < 65536 + 100);

    let out = sandbox().run(stdout_flood, limits(10_000)).await.unwrap();
    no_crash(&out);
    assert_eq!((out.stderr.as_str(), out.exit_code), ("done\n", 0));
    assert!(out.stdout.starts_with("xxxx") && out.stdout.ends_with(note));

    let mut repl = sandbox().repl();
    repl.run("kept = 41", limits(10_000)).await.unwrap();
    for code in [stderr_flood, stdout_flood] {
        let out = repl.run(code, limits(10_000)).await.unwrap();
        no_crash(&out);
        assert_eq!(out.exit_code, 0, "{code}: {out:?}");
    }
    let out = repl.run("kept + 1", limits(10_000)).await.unwrap();
    assert_eq!(out.stdout, "42\n", "the session survived: {}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_printing_on_either_stream_is_stopped_early() {
    let mut l = limits(20_000);
    l.max_output_bytes = 1000;
    let note = "[output truncated after 1000 bytes]";
    for (code, on_stderr) in [
        ("while True: print(1)", false),
        (
            "import sys\nwhile True: sys.stderr.write('E' * 100 + '\\n')",
            true,
        ),
        ("import sys\nwhile True: sys.stderr.write('E')", true),
    ] {
        let started = std::time::Instant::now();
        let out = sandbox().run(code, l).await.unwrap();
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{code}: a flood must be stopped long before its deadline"
        );
        assert!(!out.timed_out, "{code}: {out:?}");
        assert_eq!(out.exit_code, 1, "{code}: {out:?}");
        let (flooded, other) = match on_stderr {
            true => (&out.stderr, &out.stdout),
            false => (&out.stdout, &out.stderr),
        };
        assert!(flooded.ends_with(note), "{code}: {flooded}");
        assert!(!other.contains("rror"), "{code}: {other}");
        assert!(!out.stderr.contains("crashed"), "{code}: {}", out.stderr);
    }
    let mut repl = sandbox().repl();
    let out = repl.run("while True: print(1)", l).await.unwrap();
    assert!(out.stderr.ends_with(REPL_RESET_NOTE), "{}", out.stderr);
    assert_eq!(repl.run("1 + 1", l).await.unwrap().stdout, "2\n");
}

/// Waits that nothing in the single-threaded guest can end (issue 36): each must last until the
/// deadline and end like `time.sleep` past it, not crash the interpreter. The last cases reach
/// past the guest's sleeping locks to what the host itself must catch: CPython's own lock type
/// (wasi-libc traps in `pthread_cond_wait`) and a poll on no descriptors (wasmtime refuses an
/// empty poll list).
const ENDLESS_WAITS: &[&str] = &[
    "import threading\nthreading.Event().wait()",
    "import threading\nc = threading.Condition()\nwith c:\n    c.wait()",
    "import threading\nc = threading.Condition(threading.Lock())\nwith c:\n    c.wait_for(lambda: False)",
    "import queue\nqueue.Queue().get()",
    "import queue\nq = queue.Queue(maxsize=1)\nq.put(1)\nq.put(2)",
    "import queue\nqueue.SimpleQueue().get()",
    "import threading\nlock = threading.Lock()\nlock.acquire()\nlock.acquire()",
    "import threading\nlock = threading.Lock()\nwith lock:\n    with lock:\n        pass",
    "import _thread\nlock = _thread.allocate_lock()\nlock.acquire()\nlock.acquire()",
    "import threading\nthreading.Semaphore(0).acquire()",
    "import threading\nthreading.Barrier(2).wait()",
    "import concurrent.futures\nconcurrent.futures.Future().result()",
    "import select\nselect.select([], [], [])",
    "import select\nselect.select([], [], [], 3600)",
    "import select\nselect.poll().poll()",
    "import threading\nCLock = next(t for t in object.__subclasses__() if t.__module__ == '_thread' \
     and t.__name__ == 'lock' and t is not threading.Lock)\nlock = CLock()\nlock.acquire()\n\
     lock.acquire()",
];

fn assert_waited_out(code: &str, out: &PythonOutput, elapsed: std::time::Duration) {
    assert!(out.timed_out, "{code}: {out:?}");
    assert_eq!(out.exit_code, 124, "{code}: {out:?}");
    assert!(
        elapsed >= std::time::Duration::from_millis(400),
        "{code}: ended after {elapsed:?}, before its 0.4 s deadline: {out:?}"
    );
    assert!(
        elapsed < std::time::Duration::from_millis(400 + 1_500),
        "{code}: a 0.4 s deadline took {elapsed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_waits_end_at_the_deadline() {
    run("pass").await;
    for code in ENDLESS_WAITS {
        let started = std::time::Instant::now();
        let out = sandbox().run(code, limits(400)).await.unwrap();
        assert_waited_out(code, &out, started.elapsed());
        assert_eq!(
            (out.stdout.as_str(), out.stderr.as_str()),
            ("", "Error: Code execution timed out after 0.4 seconds"),
            "{code}: the same note as a sleep past the deadline"
        );
        assert_eq!(run("print(6 * 7)").await.stdout, "42\n", "after {code}");
    }
    // Output before the wait is kept, as before a sleep.
    let out = sandbox()
        .run(
            "import threading\nprint('before', flush=True)\nthreading.Event().wait()",
            limits(400),
        )
        .await
        .unwrap();
    assert!(out.timed_out, "{out:?}");
    assert_eq!(out.stdout, "before\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_waits_end_at_the_deadline_in_a_repl() {
    let mut repl = sandbox().repl();
    for code in ENDLESS_WAITS {
        repl.run("kept = 1", limits(10_000)).await.unwrap();
        let started = std::time::Instant::now();
        let out = repl.run(code, limits(400)).await.unwrap();
        assert_waited_out(code, &out, started.elapsed());
        assert!(
            out.stderr
                .starts_with("Error: Code execution timed out after 0.4 seconds"),
            "{code}: {}",
            out.stderr
        );
        assert!(out.stderr.ends_with(REPL_RESET_NOTE), "{}", out.stderr);
        let out = repl.run("print(6 * 7)", limits(10_000)).await.unwrap();
        assert_eq!(out.stdout, "42\n", "after {code}: {}", out.stderr);
    }
}

/// The same waits with a timeout return after it, as CPython's do when no other thread ends
/// them (before issue 36 they returned at once); one that need not wait does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timed_waits_return_after_their_timeout() {
    let code = r#"
import _thread, queue, select, threading, time

def timed(name, wait, seconds=0.2):
    start = time.monotonic()
    try:
        result = wait()
    except Exception as e:
        result = type(e).__name__
    took = time.monotonic() - start
    print(name, result, "on-time" if seconds <= took < seconds + 1.0 else f"took {took:.3f} s")

held = threading.Lock()
held.acquire()
timed("event", lambda: threading.Event().wait(0.2))
timed("condition", lambda: (c := threading.Condition()).__enter__() and c.wait(0.2))
timed("wait_for", lambda: (c := threading.Condition()).__enter__() and c.wait_for(bool, 0.2))
timed("lock", lambda: held.acquire(timeout=0.2))
timed("lock_positional", lambda: held.acquire(True, 0.2))
timed("thread_lock", lambda: (l := _thread.allocate_lock()).acquire() and l.acquire(True, 0.2))
timed("queue", lambda: queue.Queue().get(timeout=0.2))
timed("queue_put", lambda: (q := queue.Queue(1)).put(1) or q.put(2, timeout=0.2))
timed("simple_queue", lambda: queue.SimpleQueue().get(timeout=0.2))
timed("semaphore", lambda: threading.Semaphore(0).acquire(timeout=0.2))
timed("barrier", lambda: threading.Barrier(2).wait(0.2))
timed("select", lambda: select.select([], [], [], 0.2))
timed("poll", lambda: select.poll().poll(200))
timed("no_wait", lambda: held.acquire(False), 0)
timed("no_wait_zero", lambda: held.acquire(True, 0), 0)
timed("queue_nowait", lambda: queue.Queue().get_nowait(), 0)
set_event = threading.Event()
set_event.set()
timed("set_event", lambda: set_event.wait(5), 0)
held.release()
timed("free_lock", lambda: held.acquire(timeout=5), 0)
print(held, held.locked())
for bad in [lambda: held.acquire(False, 1), lambda: held.acquire(timeout=-2)]:
    try:
        bad()
    except ValueError as e:
        print("ValueError:", e)
held.release()
try:
    held.release()
except RuntimeError as e:
    print("RuntimeError:", e)
"#;
    let out = sandbox().run(code, limits(20_000)).await.unwrap();
    let expected = "\
event False on-time
condition False on-time
wait_for False on-time
lock False on-time
lock_positional False on-time
thread_lock False on-time
queue Empty on-time
queue_put Full on-time
simple_queue Empty on-time
semaphore False on-time
barrier BrokenBarrierError on-time
select ([], [], []) on-time
poll [] on-time
no_wait False on-time
no_wait_zero False on-time
queue_nowait Empty on-time
set_event True on-time
free_lock True on-time
";
    assert_eq!(out.exit_code, 0, "{out:?}");
    let (timed, rest) = out.stdout.split_at(expected.len().min(out.stdout.len()));
    assert_eq!(timed, expected, "{}", out.stderr);
    let rest: Vec<&str> = rest.lines().collect();
    assert!(
        rest[0].starts_with("<locked _thread.lock object at 0x") && rest[0].ends_with("> True"),
        "{rest:?}"
    );
    assert_eq!(
        rest[1..],
        [
            "ValueError: can't specify a timeout for a non-blocking call",
            "ValueError: timeout value must be a non-negative number",
            "RuntimeError: release unlocked lock",
        ]
    );
}

/// stdin is empty and closed, as in the native sandbox (/dev/null there): reading it ends at
/// once, `input()` with EOFError, as CPython's does; nothing waits for input that never comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_is_empty_and_reading_it_ends_at_once() {
    let started = std::time::Instant::now();
    let out = sandbox().run("input('? ')", limits(5_000)).await.unwrap();
    assert!(!out.timed_out, "{out:?}");
    assert_eq!(out.exit_code, 1, "{out:?}");
    assert!(
        out.stderr
            .trim_end()
            .ends_with("EOFError: EOF when reading a line"),
        "{}",
        out.stderr
    );
    let out = run(
        "import os, select, sys\nprint(repr(sys.stdin.read()), repr(sys.stdin.readline()), \
         repr(os.read(0, 10)))\nprint(select.select([sys.stdin], [], [], 60)[0] == [sys.stdin])",
    )
    .await;
    assert_eq!(
        (out.stdout.as_str(), out.exit_code),
        ("'' '' b''\nTrue\n", 0),
        "{}",
        out.stderr
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(4));
}
