//! The native fallback: real CPython (with C extensions such as numpy and scipy) behind a
//! pre-forked zygote (`sandbox/native/zygote.py`, embedded in this binary). Each call is forked
//! from a zygote into new mount/network/IPC/PID namespaces (the code runs as PID 1 of its own)
//! with an empty root holding only the read-only Python installation, an unprivileged uid,
//! rlimits and a seccomp filter (no sockets, exec, fork, ptrace, signals to other processes,
//! pidfds, mounts). Zygotes start with an empty environment plus [`SANDBOX_ENV`], so nothing of
//! the host's environment (keys, tokens, paths) reaches the code. Opt-in, and never silently
//! weaker: a zygote that cannot isolate its self-check child refuses to start, and so does this
//! sandbox.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rlhost_sdk::types::{PythonLimits, PythonOutput};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{Sandbox, SandboxError, SandboxPolicy};

const ZYGOTE: &str = include_str!("../../../sandbox/native/zygote.py");
const RUNNER: &str = include_str!("../../../sandbox/python/runner.py");

/// The whole environment of a zygote and of the code it runs (which sees exactly this in
/// `os.environ`); everything else the host has is cleared. Each one is here for a reason:
///
/// - `PYTHONDONTWRITEBYTECODE=1`: the sandbox's root is read-only; no `.pyc` is ever written.
/// - `PYTHONUTF8=1`: no locale variables are passed, so I/O is UTF-8 whatever the host's locale.
/// - `PYTHONCOERCECLOCALE=0`: keeps Python from adding `LC_CTYPE` to the environment itself.
/// - `OMP_NUM_THREADS`, `OPENBLAS_NUM_THREADS`, `MKL_NUM_THREADS` `=1`: thread pools that
///   numpy/scipy start at import (in the zygote) do not survive a fork.
///
/// The zygote's own settings (its temporary folder, the preload list) travel as arguments.
pub const SANDBOX_ENV: &[(&str, &str)] = &[
    ("PYTHONDONTWRITEBYTECODE", "1"),
    ("PYTHONUTF8", "1"),
    ("PYTHONCOERCECLOCALE", "0"),
    ("OMP_NUM_THREADS", "1"),
    ("OPENBLAS_NUM_THREADS", "1"),
    ("MKL_NUM_THREADS", "1"),
];

/// Extra time a zygote gets past a call's own deadline before it is presumed hung.
const GRACE: Duration = Duration::from_secs(5);

/// How to start native zygotes.
#[derive(Debug, Clone)]
pub struct NativeOptions {
    /// The Python interpreter (its installation is what calls can import).
    pub python: PathBuf,
    /// Modules imported once in the zygote, e.g. `numpy`, `scipy`, `sympy`.
    pub preload: Vec<String>,
}

#[derive(Serialize)]
struct Request<'a> {
    code: &'a str,
    timeout_ms: u32,
    memory_mib: u32,
    max_output_bytes: u32,
}

#[derive(Deserialize)]
struct Hello {
    ready: bool,
    #[serde(default)]
    error: Option<String>,
}

struct Zygote {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Zygote {
    /// Starts a zygote of `python` (an interpreter's resolved path, see [`interpreter_path`]).
    async fn start(
        python: &Path,
        options: &NativeOptions,
        script: &Path,
    ) -> Result<Self, SandboxError> {
        let tmp = script.parent().and_then(Path::parent).unwrap_or(script);
        let mut command = Command::new(python);
        command
            .arg(script)
            // Its empty root folder goes next to the scripts, removed with them.
            .arg("--tmp")
            .arg(tmp)
            .arg("--preload")
            .arg(options.preload.join(","))
            .env_clear()
            .envs(SANDBOX_ENV.iter().copied());
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| SandboxError::Setup(format!("cannot start {}: {e}", python.display())))?;
        let stdin = child.stdin.take().expect("piped");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        let read = tokio::time::timeout(Duration::from_secs(120), stdout.read_line(&mut line));
        match read.await {
            Ok(Ok(n)) if n > 0 => {}
            _ => {
                return Err(SandboxError::Setup(format!(
                    "the native sandbox zygote ({}) did not start",
                    python.display()
                )));
            }
        }
        let hello: Hello = serde_json::from_str(&line).map_err(|e| {
            SandboxError::Setup(format!(
                "the zygote said something unexpected ({e}): {line}"
            ))
        })?;
        if !hello.ready {
            return Err(SandboxError::Setup(
                hello
                    .error
                    .unwrap_or_else(|| "the zygote refused to start".into()),
            ));
        }
        Ok(Self {
            child,
            stdin,
            stdout,
        })
    }

    async fn call(
        &mut self,
        code: &str,
        limits: PythonLimits,
    ) -> Result<PythonOutput, SandboxError> {
        let mut line = serde_json::to_string(&Request {
            code,
            timeout_ms: limits.timeout_ms,
            memory_mib: limits.memory_mib,
            max_output_bytes: limits.max_output_bytes,
        })
        .map_err(|e| SandboxError::Failed(e.to_string()))?;
        line.push('\n');
        let failed = |e: std::io::Error| SandboxError::Failed(format!("zygote: {e}"));
        self.stdin
            .write_all(line.as_bytes())
            .await
            .map_err(failed)?;
        self.stdin.flush().await.map_err(failed)?;
        let mut reply = String::new();
        let limit = Duration::from_millis(u64::from(limits.timeout_ms)) + GRACE;
        match tokio::time::timeout(limit, self.stdout.read_line(&mut reply)).await {
            Ok(Ok(n)) if n > 0 => {}
            Ok(Ok(_)) => return Err(SandboxError::Failed("the zygote exited".into())),
            Ok(Err(e)) => return Err(failed(e)),
            Err(_) => return Err(SandboxError::Failed("the zygote stopped answering".into())),
        }
        serde_json::from_str(&reply)
            .map_err(|e| SandboxError::Failed(format!("bad reply from the zygote ({e}): {reply}")))
    }
}

/// The interpreter's own path (`sys.executable`), asked of it once with the host's environment:
/// `options.python` may be a bare name found on `$PATH` or a launcher (pyenv's shims) that needs
/// variables the zygote will not have.
async fn interpreter_path(python: &Path) -> Result<PathBuf, SandboxError> {
    let failed = |why: String| {
        SandboxError::Setup(format!(
            "cannot start {}: {why} (is it a Python interpreter?)",
            python.display()
        ))
    };
    let out = Command::new(python)
        .args(["-E", "-S", "-c", "import sys; print(sys.executable)"])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .map_err(|_| failed("it did not answer within 60 s".into()))?
        .map_err(|e| failed(e.to_string()))?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || path.is_empty() {
        return Err(failed(format!(
            "asking it for its path failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(PathBuf::from(path))
}

/// Native CPython behind isolated forks of pre-started zygotes.
pub struct NativeSandbox {
    pool: Arc<Pool>,
    policy: SandboxPolicy,
    _dir: tempfile::TempDir,
}

/// The zygotes and what starts a fresh one. Invariant: every permit the semaphore has available
/// stands for an idle zygote, so a call that holds a permit always finds one. A zygote goes back
/// to `idle` before its permit is released; a zygote that is lost (its call failed, or the call's
/// future was dropped mid-call) keeps its permit until a fresh one replaces it, and when even that
/// fails the semaphore is closed, so later calls fail at once instead of waiting for a zygote that
/// will never come back.
struct Pool {
    options: NativeOptions,
    python: PathBuf,
    script: PathBuf,
    idle: std::sync::Mutex<Vec<Zygote>>,
    permits: Arc<Semaphore>,
}

impl Pool {
    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Zygote>> {
        // The lock is never held across an await nor while anything can panic.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts `zygote` back, then releases the permit that counted it.
    fn give_back(&self, zygote: Zygote, permit: OwnedSemaphorePermit) {
        self.idle().push(zygote);
        drop(permit);
    }

    /// Starts a fresh zygote in place of a lost one (already killed) and returns it with
    /// `permit`; closes the pool when it cannot.
    async fn replace(self: Arc<Self>, permit: OwnedSemaphorePermit) -> Result<(), SandboxError> {
        match Zygote::start(&self.python, &self.options, &self.script).await {
            Ok(fresh) => {
                self.give_back(fresh, permit);
                Ok(())
            }
            Err(e) => {
                tracing::error!("the native sandbox lost a zygote and cannot start another: {e}");
                self.permits.close();
                Err(e)
            }
        }
    }

    /// Replaces a lost zygote on a task of its own, so the replacement completes even when the
    /// caller's future is dropped; where there is no runtime to run it, closes the pool.
    fn replace_in_background(
        self: &Arc<Self>,
        permit: OwnedSemaphorePermit,
    ) -> Option<tokio::task::JoinHandle<Result<(), SandboxError>>> {
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => Some(rt.spawn(self.clone().replace(permit))),
            Err(_) => {
                self.permits.close();
                None
            }
        }
    }
}

/// A zygote lent to one call, with the permit that counts it. Dropped while still holding the
/// zygote (the call's future was dropped mid-call, so the zygote may be half-way through a
/// request), it kills that zygote and starts a fresh one in the background.
struct Lent {
    pool: Arc<Pool>,
    zygote: Option<Zygote>,
    permit: Option<OwnedSemaphorePermit>,
}

impl Lent {
    /// The zygote and its permit, taken out so that dropping `self` does nothing.
    fn take(mut self) -> (Zygote, OwnedSemaphorePermit) {
        match (self.zygote.take(), self.permit.take()) {
            (Some(z), Some(p)) => (z, p),
            _ => unreachable!("a Lent holds both until taken or dropped"),
        }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let (Some(mut zygote), Some(permit)) = (self.zygote.take(), self.permit.take()) {
            let _ = zygote.child.start_kill();
            drop(zygote);
            self.pool.replace_in_background(permit);
        }
    }
}

impl NativeSandbox {
    /// Starts `policy.workers` zygotes. Fails (and runs nothing) when the interpreter cannot be
    /// started, a preload module is missing, or this kernel does not allow the isolation.
    pub async fn start(
        options: NativeOptions,
        policy: SandboxPolicy,
    ) -> Result<Self, SandboxError> {
        if !cfg!(all(target_os = "linux", target_arch = "x86_64")) {
            return Err(SandboxError::Setup(
                "the native sandbox needs Linux on x86_64".into(),
            ));
        }
        let dir = tempfile::Builder::new()
            .prefix("rlhost-zygote-")
            .tempdir()
            .map_err(|e| SandboxError::Setup(format!("temporary folder: {e}")))?;
        let write = |rel: &str, text: &str| {
            let path = dir.path().join(rel);
            std::fs::create_dir_all(path.parent().expect("has a parent"))
                .and_then(|_| std::fs::write(&path, text))
                .map_err(|e| SandboxError::Setup(format!("{}: {e}", path.display())))
                .map(|_| path)
        };
        let script = write("native/zygote.py", ZYGOTE)?;
        write("python/runner.py", RUNNER)?;
        let python = interpreter_path(&options.python).await?;
        let mut zygotes = Vec::new();
        for _ in 0..policy.workers.max(1) {
            zygotes.push(Zygote::start(&python, &options, &script).await?);
        }
        Ok(Self {
            pool: Arc::new(Pool {
                permits: Arc::new(Semaphore::new(zygotes.len())),
                idle: std::sync::Mutex::new(zygotes),
                options,
                python,
                script,
            }),
            policy,
            _dir: dir,
        })
    }

    /// Process ids of the zygotes idle now (all of them between calls): for monitoring, and
    /// for tests that take the sandbox down under a run.
    pub async fn zygote_pids(&self) -> Vec<u32> {
        self.pool
            .idle()
            .iter()
            .filter_map(|z| z.child.id())
            .collect()
    }

    /// Runs `code` in a fresh isolated child of a zygote. Cancellation-safe: dropping the
    /// returned future mid-call kills that call's zygote and replaces it in the background, so
    /// the sandbox keeps its full number of workers.
    pub async fn run(
        &self,
        code: &str,
        limits: PythonLimits,
    ) -> Result<PythonOutput, SandboxError> {
        let limits = self.policy.clamp(limits);
        let shut = || SandboxError::Failed("the sandbox is shut down".into());
        let permit = self
            .pool
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| shut())?;
        // A permit stands for an idle zygote (see `Pool`); none here would be a bookkeeping bug,
        // reported as a failed call rather than a panic.
        let zygote = self.pool.idle().pop().ok_or_else(|| {
            SandboxError::Failed("internal error: a worker permit without an idle zygote".into())
        })?;
        let mut lent = Lent {
            pool: self.pool.clone(),
            zygote: Some(zygote),
            permit: Some(permit),
        };
        let result = match lent.zygote.as_mut() {
            Some(z) => z.call(code, limits).await,
            None => unreachable!("just lent"),
        };
        let (mut zygote, permit) = lent.take();
        if result.is_ok() {
            self.pool.give_back(zygote, permit);
            return result;
        }
        // Replace a zygote that failed, on a task of its own (the replacement outlives this
        // future if it is dropped); when even that fails the pool is closed and this call
        // reports why.
        let _ = zygote.child.start_kill();
        drop(zygote);
        if let Some(replacing) = self.pool.replace_in_background(permit) {
            match replacing.await {
                Ok(Err(e)) => return Err(e),
                Err(e) => return Err(SandboxError::Failed(format!("replacing a zygote: {e}"))),
                Ok(Ok(())) => {}
            }
        }
        result
    }
}

#[async_trait]
impl Sandbox for NativeSandbox {
    async fn run_python(
        &self,
        code: &str,
        limits: PythonLimits,
    ) -> Result<PythonOutput, SandboxError> {
        self.run(code, limits).await
    }
}
