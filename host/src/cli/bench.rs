//! `host bench …`: benchmarks that print ratios against a peer measured in the same run.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use crate::bench::plugins::{self, PluginBenchOptions};
use crate::plugin::{LoadOptions, PluginLoader};

/// Arguments of `host bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Plugin runtime overhead per rollout: a WebAssembly component against the same environment
    /// built as a native library.
    Plugins {
        /// Plugin folder of the component.
        #[arg(long)]
        component: PathBuf,
        /// Plugin folder of the native build (the peer); loading it implies allowing native code.
        #[arg(long)]
        native: Option<PathBuf>,
        /// Rollouts per backend.
        #[arg(long, default_value_t = 2000)]
        rollouts: usize,
        /// Size of the assistant message in each rollout.
        #[arg(long, default_value_t = 2048)]
        message_bytes: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Python tool calls: the sandbox (fresh and REPL) against `python -c` subprocesses.
    Sandbox {
        /// The peer's interpreter (needs sympy for the sympy case).
        #[arg(long, default_value = "python3")]
        python: PathBuf,
        /// Scale the number of calls (1.0: 40 trivial and 10 sympy calls per way).
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        /// The sandbox component (default: see `host sandbox run --help`).
        #[arg(long)]
        component: Option<PathBuf>,
        /// Also measure the native fallback, with this interpreter.
        #[arg(long)]
        native_python: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Not built yet.
    #[command(external_subcommand)]
    Other(Vec<String>),
}

pub(super) fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        BenchCommand::Plugins {
            component,
            native,
            rollouts,
            message_bytes,
            json,
        } => {
            let options = PluginBenchOptions {
                rollouts,
                message_bytes,
                ..Default::default()
            };
            let loader = PluginLoader::new(
                LoadOptions {
                    allow_native: native.is_some(),
                    ..Default::default()
                },
                None,
            )?;
            let bar = ProgressBar::new(rollouts as u64).with_style(
                ProgressStyle::with_template("{msg:>28} {bar:30} {pos}/{len} rollouts")
                    .expect("valid template"),
            );
            if json {
                bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
            }
            let progress = |name: &str, done: usize, _total: usize| {
                bar.set_message(name.to_owned());
                bar.set_position(done as u64);
            };
            let report = super::async_runtime()?
                .block_on(plugins::run(
                    &loader,
                    &component,
                    native.as_deref(),
                    &options,
                    &progress,
                ))
                .context("benchmarking plugins")?;
            bar.finish_and_clear();
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.to_text());
            }
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Sandbox {
            python,
            scale,
            component,
            native_python,
            json,
        } => {
            use crate::sandbox::{SandboxPolicy, WasmSandbox, locate_component};
            let home = crate::home::RlhostHome::from_env().ok();
            let path = locate_component(component.as_deref(), home.as_ref())?;
            let cache = home.as_ref().map(|h| h.cache_dir());
            let sandbox = WasmSandbox::load(&path, cache.as_deref(), SandboxPolicy::default())?;
            let spinner = ProgressBar::new_spinner();
            if json {
                spinner.set_draw_target(indicatif::ProgressDrawTarget::hidden());
            }
            spinner.enable_steady_tick(std::time::Duration::from_millis(120));
            let progress = |what: &str| spinner.set_message(what.to_owned());
            let cases = crate::bench::sandbox::standard_cases(scale);
            let runtime = super::async_runtime()?;
            let native = match native_python {
                Some(python) => Some(std::sync::Arc::new(runtime.block_on(
                    crate::sandbox::NativeSandbox::start(
                        crate::sandbox::NativeOptions {
                            python,
                            preload: vec!["sympy".into()],
                        },
                        SandboxPolicy::default(),
                    ),
                )?)),
                None => None,
            };
            let report = runtime
                .block_on(crate::bench::sandbox::run(
                    &sandbox, native, &python, &cases, &progress,
                ))
                .context("benchmarking the sandbox")?;
            spinner.finish_and_clear();
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.to_text());
            }
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Other(words) => {
            let sub = words.first().map(String::as_str).unwrap_or("");
            Err(super::not_implemented(&format!("bench {sub}")))
        }
    }
}
