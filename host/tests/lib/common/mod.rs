//! Helpers of the library tests: the folders `make plugins` and `make sandbox` build, and the one
//! Python sandbox every test of this binary shares.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use rlhost::sandbox::{SandboxPolicy, WasmSandbox};

mod base;
pub use base::*;

/// `plugins/target`, where `make plugins` builds the components, native libraries and folders.
pub fn plugins_target() -> PathBuf {
    repo_root().join("plugins/target")
}

/// A WebAssembly component `make plugins` builds from the crate `crate_name`.
pub fn wasm(crate_name: &str) -> PathBuf {
    let file = format!("{}.wasm", crate_name.replace('-', "_"));
    built(
        plugins_target().join("wasm32-wasip2/release").join(file),
        "plugins",
    )
}

/// The Python sandbox component `make sandbox` builds.
pub fn sandbox_component() -> PathBuf {
    built(
        repo_root().join("sandbox/target/python-sandbox.wasm"),
        "sandbox",
    )
}

/// One Python sandbox (default policy) for the whole test binary: compiling the component is the
/// slow part (cached on disk next to it after the first run), and one instance serves any number
/// of concurrent runs.
pub fn python_sandbox() -> &'static Arc<WasmSandbox> {
    static SANDBOX: OnceLock<Arc<WasmSandbox>> = OnceLock::new();
    SANDBOX.get_or_init(|| {
        let cache = repo_root().join("sandbox/target/cache");
        Arc::new(
            WasmSandbox::load(&sandbox_component(), Some(&cache), SandboxPolicy::default())
                .unwrap(),
        )
    })
}

/// `scripts/qwen3-reference.py` (transformers' side of the parity tests) under the reference
/// venv's `python`.
pub fn qwen3_reference(python: &Path) -> Command {
    let mut cmd = Command::new(python);
    cmd.arg(repo_root().join("scripts/qwen3-reference.py"));
    cmd
}

/// The expression an arith question asks about (`What is 3 + 4?` → `3 + 4`).
pub fn arith_expression(question: &str) -> String {
    question
        .trim_start_matches("What is ")
        .trim_end_matches('?')
        .to_owned()
}
