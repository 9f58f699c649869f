//! `host bench sandbox`: the Python sandbox against the way verifiers runs the tool — a
//! `python -c CODE` subprocess per call — measured in the same run on the same code.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rlhost_sdk::types::PythonLimits;
use serde::Serialize;

use std::sync::Arc;

use crate::sandbox::{NativeSandbox, Sandbox, SandboxError, WasmSandbox};

/// One snippet to time.
#[derive(Debug, Clone)]
pub struct BenchCase {
    /// Short name.
    pub name: &'static str,
    /// Python source, run as is in every call.
    pub code: &'static str,
    /// Sequential calls per mode.
    pub calls: usize,
}

/// The snippets of the standard run: the cheapest call, and the sympy call math tools make.
pub fn standard_cases(scale: f64) -> Vec<BenchCase> {
    let n = |base: f64| ((base * scale).round() as usize).max(3);
    vec![
        BenchCase {
            name: "print(1+1)",
            code: "print(1+1)",
            calls: n(40.0),
        },
        BenchCase {
            name: "sympy integrate(sin(x)**2)",
            code: "from sympy import *\nx = symbols('x')\nprint(integrate(sin(x)**2, x))",
            calls: n(10.0),
        },
    ]
}

/// Latency statistics of one way of running a case.
#[derive(Debug, Clone, Serialize)]
pub struct Timings {
    /// Median milliseconds per call.
    pub p50_ms: f64,
    /// 95th percentile milliseconds per call.
    pub p95_ms: f64,
    /// Calls per second with `concurrency` calls in flight.
    pub calls_per_sec: f64,
}

/// Results of one case.
#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    /// The case's short name.
    pub name: String,
    /// Fresh interpreter per call.
    pub fresh: Timings,
    /// One interpreter kept across calls.
    pub repl: Timings,
    /// The native fallback (forked zygote), when measured.
    pub native: Option<Timings>,
    /// `python -c` per call; `None` when the peer cannot run the case (e.g. no sympy).
    pub subprocess: Option<Timings>,
    /// Why the peer could not run it.
    pub subprocess_note: Option<String>,
    /// subprocess p50 / fresh p50.
    pub speedup_p50: Option<f64>,
}

/// What `host bench sandbox` measured: each case's timings against `python -c` subprocesses.
#[derive(Debug, Clone, Serialize)]
pub struct SandboxBenchReport {
    /// The peer's interpreter.
    pub python: PathBuf,
    /// Calls in flight for the throughput figures.
    pub concurrency: usize,
    /// One entry per case.
    pub cases: Vec<CaseReport>,
}

fn stats(mut samples: Vec<Duration>, calls_per_sec: f64) -> Timings {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let pct = |p: f64| ms(samples[((samples.len() - 1) as f64 * p).round() as usize]);
    Timings {
        p50_ms: pct(0.5),
        p95_ms: pct(0.95),
        calls_per_sec,
    }
}

fn limits() -> PythonLimits {
    PythonLimits {
        timeout_ms: 60_000,
        memory_mib: 1024,
        max_output_bytes: 1 << 16,
    }
}

async fn time_fresh(
    sandbox: Arc<dyn Sandbox>,
    case: &BenchCase,
    concurrency: usize,
) -> Result<(Timings, String), SandboxError> {
    let mut samples = Vec::new();
    let mut stdout = String::new();
    for _ in 0..case.calls {
        let t = Instant::now();
        stdout = sandbox.run_python(case.code, limits()).await?.stdout;
        samples.push(t.elapsed());
    }
    let t = Instant::now();
    let batch = case.calls.max(concurrency);
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..batch {
        let sandbox = sandbox.clone();
        let code = case.code;
        set.spawn(async move { sandbox.run_python(code, limits()).await });
    }
    while let Some(r) = set.join_next().await {
        r.map_err(|e| SandboxError::Failed(e.to_string()))??;
    }
    let rate = batch as f64 / t.elapsed().as_secs_f64();
    Ok((stats(samples, rate), stdout))
}

async fn time_repl(sandbox: &WasmSandbox, case: &BenchCase) -> Result<Timings, SandboxError> {
    let mut repl = sandbox.repl();
    repl.run("pass", limits()).await?;
    let mut samples = Vec::new();
    let started = Instant::now();
    for _ in 0..case.calls {
        let t = Instant::now();
        repl.run(case.code, limits()).await?;
        samples.push(t.elapsed());
    }
    let rate = case.calls as f64 / started.elapsed().as_secs_f64();
    Ok(stats(samples, rate))
}

fn run_subprocess(python: &Path, code: &str) -> std::io::Result<(bool, String, String)> {
    let out = std::process::Command::new(python)
        .args(["-c", code])
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

fn time_subprocess(
    python: &Path,
    case: &BenchCase,
    expected: &str,
    concurrency: usize,
) -> Result<Timings, String> {
    let (ok, stdout, stderr) = run_subprocess(python, case.code).map_err(|e| e.to_string())?;
    if !ok || stdout != expected {
        let last = stderr
            .lines()
            .last()
            .unwrap_or("different output")
            .to_owned();
        return Err(format!("{} cannot run it: {last}", python.display()));
    }
    let mut samples = Vec::new();
    for _ in 0..case.calls {
        let t = Instant::now();
        run_subprocess(python, case.code).map_err(|e| e.to_string())?;
        samples.push(t.elapsed());
    }
    let batch = case.calls.max(concurrency);
    let t = Instant::now();
    std::thread::scope(|scope| {
        let per = batch.div_ceil(concurrency);
        for _ in 0..concurrency {
            scope.spawn(move || {
                for _ in 0..per {
                    let _ = run_subprocess(python, case.code);
                }
            });
        }
    });
    let rate = (batch.div_ceil(concurrency) * concurrency) as f64 / t.elapsed().as_secs_f64();
    Ok(stats(samples, rate))
}

/// Times every case in the sandbox (fresh and REPL) and as `python -c` subprocesses.
pub async fn run(
    sandbox: &WasmSandbox,
    native: Option<Arc<NativeSandbox>>,
    python: &Path,
    cases: &[BenchCase],
    progress: &dyn Fn(&str),
) -> Result<SandboxBenchReport, SandboxError> {
    let concurrency = sandbox.policy().workers;
    // Warm up: the first instantiation maps the snapshot.
    sandbox.run("pass", limits()).await?;
    let mut reports = Vec::new();
    for case in cases {
        progress(&format!("{}: sandbox", case.name));
        let (fresh, stdout) = time_fresh(Arc::new(sandbox.clone()), case, concurrency).await?;
        let repl = time_repl(sandbox, case).await?;
        let native = match &native {
            Some(n) => {
                progress(&format!("{}: native", case.name));
                Some(time_fresh(n.clone(), case, concurrency).await?.0)
            }
            None => None,
        };
        progress(&format!("{}: python -c", case.name));
        let peer = time_subprocess(python, case, &stdout, concurrency);
        let speedup = peer.as_ref().ok().map(|p| p.p50_ms / fresh.p50_ms);
        reports.push(CaseReport {
            name: case.name.to_owned(),
            fresh,
            repl,
            native,
            subprocess_note: peer.as_ref().err().cloned(),
            subprocess: peer.ok(),
            speedup_p50: speedup,
        });
    }
    Ok(SandboxBenchReport {
        python: python.to_owned(),
        concurrency,
        cases: reports,
    })
}

impl SandboxBenchReport {
    /// The table `host bench sandbox` prints without `--json`.
    pub fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "python tool calls: rlhost sandbox (CPython in WebAssembly) vs `{} -c` subprocesses \
             (verifiers' method); throughput with {} calls in flight\n",
            self.python.display(),
            self.concurrency
        );
        let _ = writeln!(
            out,
            "{:<30} {:<18} {:>9} {:>9} {:>9}",
            "code", "how", "p50 ms", "p95 ms", "calls/s"
        );
        for c in &self.cases {
            let mut row = |how: &str, t: &Timings| {
                let _ = writeln!(
                    out,
                    "{:<30} {:<18} {:>9.1} {:>9.1} {:>9.1}",
                    c.name, how, t.p50_ms, t.p95_ms, t.calls_per_sec
                );
            };
            row("sandbox, fresh", &c.fresh);
            row("sandbox, repl", &c.repl);
            if let Some(n) = &c.native {
                row("native fallback", n);
            }
            match &c.subprocess {
                Some(p) => row("python -c", p),
                None => {
                    let _ = writeln!(
                        out,
                        "{:<30} {:<18} {}",
                        c.name,
                        "python -c",
                        c.subprocess_note.as_deref().unwrap_or("unavailable")
                    );
                }
            }
        }
        out.push('\n');
        for c in &self.cases {
            if let Some(s) = c.speedup_p50 {
                let verdict = if s >= 10.0 { "met" } else { "NOT met" };
                let _ = writeln!(
                    out,
                    "{}: sandbox (fresh) is {s:.1}x faster than python -c at p50 (goal >= 10x: {verdict})",
                    c.name
                );
            }
        }
        out
    }
}
