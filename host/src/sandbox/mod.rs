//! Running model-written Python: the `python` tool of math environments and the `run-python`
//! import of plugins.
//!
//! [`WasmSandbox`] runs CPython compiled to WebAssembly (`sandbox/python/`, built by
//! `make sandbox`): a fresh, isolated interpreter per call (or one per rollout in REPL mode),
//! with sympy pre-loaded in its memory snapshot, a deadline, a memory cap, capped output, and no
//! files, network, environment variables or subprocesses. Results read like what a model
//! expects from Python: a timeout is `Error: Code execution timed out after N seconds`, memory
//! exhaustion a `MemoryError`, runaway recursion a `RecursionError`.
//!
//! The deadline also ends a call blocked in a wait, the same way in both sandboxes: a sleep, a
//! `select`/`poll` (on no descriptors too), `threading.Event().wait()`, `Condition().wait()`,
//! `Semaphore`, `Barrier`, `queue.Queue().get()`/`put()`, a lock acquired while held. Each lasts
//! until the deadline and the call times out (exit 124, timed out, the interpreter replaced: the
//! next call runs normally); given a timeout, each returns after it as in CPython
//! (`Event().wait(0.2)` is `False` after 0.2 s). In the WebAssembly guest, which has no threads,
//! the locks behind these wait by `time.sleep` (`sandbox/python/app.py`), and a wait that still
//! reaches wasi-libc's thread stubs or polls nothing is held by the host until the deadline
//! instead of crashing. stdin is empty (`/dev/null` in the native sandbox): reading it returns
//! at once, `input()` with `EOFError`.
//!
//! This module must never run model code outside a sandbox.

mod capture;
mod native;
mod wasm;

use async_trait::async_trait;
use rlhost_sdk::types::{PythonLimits, PythonOutput};
use serde::{Deserialize, Serialize};

pub use capture::CapturePipe;
pub use native::{NativeOptions, NativeSandbox, SANDBOX_ENV};
pub use wasm::{PythonRepl, REPL_RESET_NOTE, WasmSandbox};

/// Errors from a sandbox itself (not the Python program's own errors, which are its output).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SandboxError {
    /// No sandbox component in any of the places searched.
    #[error("no Python sandbox component found (looked in: {})", places(.looked))]
    NotFound {
        /// Where it was looked for, in order.
        looked: Vec<std::path::PathBuf>,
    },
    /// The component named explicitly does not exist.
    #[error("the Python sandbox component {} does not exist", .0.display())]
    Missing(std::path::PathBuf),
    /// This host was set up without a sandbox (a library caller's choice).
    #[error("this host was set up without a Python sandbox")]
    NotOffered,
    /// The sandbox cannot be set up (invalid component, engine failure).
    #[error("the Python sandbox cannot start: {0}")]
    Setup(String),
    /// The sandbox failed while running a call.
    #[error("the Python sandbox failed: {0}")]
    Failed(String),
}

fn places(looked: &[std::path::PathBuf]) -> String {
    if looked.is_empty() {
        return "nowhere: no $RLHOST_HOME, $RLHOST_SOURCE or install prefix".into();
    }
    let places: Vec<String> = looked.iter().map(|p| p.display().to_string()).collect();
    places.join(", ")
}

impl SandboxError {
    /// What makes a sandbox available again, in words a user can act on.
    pub fn fix(&self) -> String {
        let install = format!(
            "build it with `make sandbox` in an rlhost checkout and install it (`make install`, \
             or copy sandbox/target/{COMPONENT_FILE} into $RLHOST_HOME/sandbox/), or point \
             ${COMPONENT_ENV} at one"
        );
        match self {
            SandboxError::NotFound { .. } | SandboxError::Missing(_) => install,
            SandboxError::NotOffered => {
                "give the plugin loader a sandbox (`LoadOptions::sandbox`)".into()
            }
            SandboxError::Setup(_) => format!("rebuild the component: {install}"),
            SandboxError::Failed(_) => {
                "see the cause above; rerun once the machine has the memory and threads the \
                 sandbox needs"
                    .into()
            }
        }
    }

    /// The error and its fix, on one line.
    pub fn with_fix(&self) -> String {
        format!("{self}; to fix: {}", self.fix())
    }
}

/// Runs model-written Python code in isolation.
#[async_trait]
pub trait Sandbox: Send + Sync {
    /// Runs `code` under `limits` in a fresh interpreter; a timeout or a crash of the program is
    /// a normal output (`timed_out`, non-zero `exit_code`), not an error.
    async fn run_python(
        &self,
        code: &str,
        limits: PythonLimits,
    ) -> Result<PythonOutput, SandboxError>;
}

/// How Python state lives across calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PythonMode {
    /// A fresh interpreter per call: variables do not persist (math-python's semantics).
    #[default]
    Fresh,
    /// One interpreter per rollout: variables persist between calls; after a crash the next
    /// call starts fresh and the output says so.
    Repl,
}

/// Sandbox-wide policy. Per-call [`PythonLimits`] are clamped to these maxima.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxPolicy {
    /// Calls running at once; more wait in a queue, and their deadline starts when they run.
    /// Default: the number of CPU cores.
    pub workers: usize,
    /// Largest timeout a call may ask for, in milliseconds. Default 60 000.
    pub max_timeout_ms: u32,
    /// Largest memory a call may ask for, in MiB. Default 2048.
    pub max_memory_mib: u32,
    /// Largest output a call may ask for, per stream, in bytes. Default 1 MiB.
    pub max_output_bytes: u32,
}

impl Default for SandboxPolicy {
    fn default() -> Self {
        Self {
            workers: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2),
            max_timeout_ms: 60_000,
            max_memory_mib: 2048,
            max_output_bytes: 1 << 20,
        }
    }
}

impl SandboxPolicy {
    /// `limits`, clamped to this policy's maxima (and to sane minima).
    pub fn clamp(&self, limits: PythonLimits) -> PythonLimits {
        PythonLimits {
            timeout_ms: limits.timeout_ms.clamp(1, self.max_timeout_ms),
            memory_mib: limits.memory_mib.clamp(64, self.max_memory_mib),
            max_output_bytes: limits.max_output_bytes.clamp(1, self.max_output_bytes),
        }
    }
}

/// Environment variable naming the sandbox component.
pub const COMPONENT_ENV: &str = "RLHOST_PYTHON_SANDBOX";
/// File name of the sandbox component.
pub const COMPONENT_FILE: &str = "python-sandbox.wasm";

/// Finds the sandbox component: `explicit`, else `$RLHOST_PYTHON_SANDBOX`, else
/// `$RLHOST_HOME/sandbox/python-sandbox.wasm` (`make sandbox` installs it there), else the
/// install prefix's `share/rlhost/python-sandbox.wasm`, else `$RLHOST_SOURCE`'s
/// `sandbox/target/python-sandbox.wasm` (where `make sandbox` builds it). The error lists every
/// place it looked.
pub fn locate_component(
    explicit: Option<&std::path::Path>,
    home: Option<&crate::home::RlhostHome>,
) -> Result<std::path::PathBuf, SandboxError> {
    use std::path::PathBuf;
    if let Some(p) = explicit {
        return match p.is_file() {
            true => Ok(p.to_owned()),
            false => Err(SandboxError::Missing(p.to_owned())),
        };
    }
    let mut looked: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os(COMPONENT_ENV).filter(|v| !v.is_empty()) {
        looked.push(PathBuf::from(p));
    }
    if let Some(h) = home {
        looked.push(h.root().join("sandbox").join(COMPONENT_FILE));
    }
    if let Some(share) = crate::home::share_dir() {
        looked.push(share.join(COMPONENT_FILE));
    }
    if let Some(src) = crate::home::source_tree() {
        looked.push(src.join("sandbox/target").join(COMPONENT_FILE));
    }
    match looked.iter().find(|p| p.is_file()) {
        Some(found) => Ok(found.clone()),
        None => Err(SandboxError::NotFound { looked }),
    }
}

/// The sandbox component (CPython and its standard library in WebAssembly): about 100 MB; 1 GiB
/// refuses what cannot be one before it is read.
pub const COMPONENT_LIMIT: rlhost_fs::FileLimit =
    rlhost_fs::FileLimit::new("sandbox component", 1 << 30);

/// Checks that `path` holds a WebAssembly component (its header), without compiling it: what a
/// quick check (`host doctor`, install-time validation) can say about a sandbox found.
pub fn check_component(path: &std::path::Path) -> Result<(), SandboxError> {
    // `\0asm`, then the component encoding's version and layer (core modules have 1, 0, 0, 0).
    const COMPONENT_HEADER: [u8; 8] = [0, b'a', b's', b'm', 0x0d, 0x00, 0x01, 0x00];
    let header = rlhost_fs::read_prefix(path, 8, COMPONENT_LIMIT)
        .map_err(|e| SandboxError::Setup(e.to_string()))?;
    match header == COMPONENT_HEADER {
        true => Ok(()),
        false => Err(SandboxError::Setup(format!(
            "{} is not a WebAssembly component",
            path.display()
        ))),
    }
}

/// The message a model reads when its code ran out of time (verifiers' exact wording).
pub fn timeout_message(timeout_ms: u32) -> String {
    let secs = f64::from(timeout_ms) / 1000.0;
    if secs.fract() == 0.0 {
        format!("Error: Code execution timed out after {secs:.0} seconds")
    } else {
        format!("Error: Code execution timed out after {secs} seconds")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_message_matches_the_seed() {
        assert_eq!(
            timeout_message(10_000),
            "Error: Code execution timed out after 10 seconds"
        );
        assert_eq!(
            timeout_message(1_500),
            "Error: Code execution timed out after 1.5 seconds"
        );
    }

    #[test]
    fn limits_are_clamped_to_the_policy() {
        let policy = SandboxPolicy {
            workers: 1,
            max_timeout_ms: 5_000,
            max_memory_mib: 256,
            max_output_bytes: 100,
        };
        let asked = PythonLimits {
            timeout_ms: 99_000,
            memory_mib: 1,
            max_output_bytes: 0,
        };
        assert_eq!(
            policy.clamp(asked),
            PythonLimits {
                timeout_ms: 5_000,
                memory_mib: 64,
                max_output_bytes: 1
            }
        );
    }
}
