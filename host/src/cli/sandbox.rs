//! `host sandbox …`: run Python exactly as a model's `python` tool would.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use clap::{Args, Subcommand, ValueEnum};
use rlhost_sdk::types::PythonLimits;

use crate::home::RlhostHome;
use crate::sandbox::{
    NativeOptions, NativeSandbox, PythonMode, SandboxPolicy, WasmSandbox, locate_component,
};

/// `host sandbox run --file FILE`: a Python script, KBs; 16 MiB (generated code included) and
/// a regular file only, so a FIFO or `/dev/zero` named by mistake is refused at once.
const SCRIPT_FILE: rlhost_fs::FileLimit = rlhost_fs::FileLimit::new("script", 16 << 20);

/// Arguments of `host sandbox`.
#[derive(Debug, Args)]
pub struct SandboxArgs {
    #[command(subcommand)]
    command: SandboxCommand,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Backend {
    /// CPython in WebAssembly (sympy preloaded; no C extensions).
    Wasm,
    /// Real CPython forked from a zygote into namespaces + seccomp (C extensions allowed).
    Native,
}

#[derive(Debug, Subcommand)]
enum SandboxCommand {
    /// Run Python code in the sandbox and print what the model would see.
    Run {
        /// Code to run (repeatable: snippets run in order).
        #[arg(short = 'c', long = "code")]
        code: Vec<String>,
        /// A file of code to run (after any -c snippets).
        #[arg(long)]
        file: Option<PathBuf>,
        /// Fresh interpreter per snippet, or one kept across snippets.
        #[arg(long, value_enum, default_value = "fresh")]
        mode: PythonMode,
        /// Wall-clock limit per snippet, in seconds.
        #[arg(long, default_value_t = 10.0)]
        timeout: f64,
        /// Memory limit, in MiB.
        #[arg(long, default_value_t = 512)]
        memory_mib: u32,
        /// Output kept per stream, in bytes.
        #[arg(long, default_value_t = 64 * 1024)]
        max_output_bytes: u32,
        /// The sandbox component (default: $RLHOST_PYTHON_SANDBOX, $RLHOST_HOME/sandbox/, the
        /// install prefix's share/rlhost/, $RLHOST_SOURCE/sandbox/target/).
        #[arg(long)]
        component: Option<PathBuf>,
        /// Which sandbox runs the code.
        #[arg(long, value_enum, default_value = "wasm")]
        backend: Backend,
        /// Native backend: the interpreter (its installation is what the code can import).
        #[arg(long, default_value = "python3")]
        python: PathBuf,
        /// Native backend: modules imported once up front (comma-separated, e.g. numpy,scipy).
        #[arg(long, value_delimiter = ',')]
        preload: Vec<String>,
        /// Print one JSON object per snippet.
        #[arg(long)]
        json: bool,
    },
}

pub(super) fn run(args: SandboxArgs) -> anyhow::Result<ExitCode> {
    let SandboxCommand::Run {
        mut code,
        file,
        mode,
        timeout,
        memory_mib,
        max_output_bytes,
        component,
        backend,
        python,
        preload,
        json,
    } = args.command;
    if let Some(file) = file {
        code.push(rlhost_fs::read_to_string(&file, SCRIPT_FILE)?);
    }
    if code.is_empty() {
        bail!("nothing to run: give -c CODE or --file FILE");
    }
    if !(timeout.is_finite() && timeout > 0.0) {
        bail!("--timeout must be a positive number of seconds, got {timeout}");
    }
    let limits = PythonLimits {
        timeout_ms: (timeout * 1000.0).round() as u32,
        memory_mib,
        max_output_bytes,
    };
    let runtime = super::async_runtime()?;
    let outputs = match backend {
        Backend::Wasm => {
            let home = RlhostHome::from_env().ok();
            let path = locate_component(component.as_deref(), home.as_ref())
                .map_err(|e| anyhow::anyhow!(e.with_fix()))?;
            let cache = home.as_ref().map(|h| h.cache_dir());
            let sandbox = WasmSandbox::load(&path, cache.as_deref(), SandboxPolicy::default())?;
            runtime.block_on(async {
                let mut outputs = Vec::new();
                let mut repl = sandbox.repl();
                for snippet in &code {
                    outputs.push(match mode {
                        PythonMode::Fresh => sandbox.run(snippet, limits).await?,
                        PythonMode::Repl => repl.run(snippet, limits).await?,
                    });
                }
                anyhow::Ok(outputs)
            })?
        }
        Backend::Native => {
            if matches!(mode, PythonMode::Repl) {
                bail!("--mode repl needs --backend wasm: native calls always start fresh");
            }
            runtime.block_on(async {
                let policy = SandboxPolicy {
                    workers: 1,
                    ..Default::default()
                };
                let sandbox =
                    NativeSandbox::start(NativeOptions { python, preload }, policy).await?;
                let mut outputs = Vec::new();
                for snippet in &code {
                    outputs.push(sandbox.run(snippet, limits).await?);
                }
                anyhow::Ok(outputs)
            })?
        }
    };
    let mut last = 0;
    for out in &outputs {
        if json {
            println!("{}", serde_json::to_string(out)?);
        } else {
            print!("{}", out.stdout);
            eprint!("{}", out.stderr);
            if !out.stderr.is_empty() && !out.stderr.ends_with('\n') {
                eprintln!();
            }
        }
        last = out.exit_code;
    }
    std::io::stdout().flush()?;
    Ok(ExitCode::from(
        u8::try_from(last.clamp(0, 255)).unwrap_or(1),
    ))
}
