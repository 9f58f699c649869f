//! Python tool execution for plugins (the `run-python` host import) and, later, for the rollout
//! loop. This module owns the seam: [`Sandbox`] is what the plugin runtime calls. The isolated
//! CPython-in-WebAssembly implementation arrives with the sandbox work; until a host is given one,
//! `run-python` answers "no Python sandbox configured".

use async_trait::async_trait;
use rlhost_sdk::types::{PythonLimits, PythonOutput};

/// Errors from a sandbox (not the Python program's own errors, which are in its output).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SandboxError {
    /// The sandbox could not start the program.
    #[error("the Python sandbox failed: {0}")]
    Failed(String),
}

/// Runs model-written Python code in isolation.
#[async_trait]
pub trait Sandbox: Send + Sync {
    /// Runs `code` under `limits`; a timeout or a crash of the program is a normal output
    /// (`timed_out`, non-zero `exit_code`), not an error.
    async fn run_python(
        &self,
        code: &str,
        limits: PythonLimits,
    ) -> Result<PythonOutput, SandboxError>;
}
