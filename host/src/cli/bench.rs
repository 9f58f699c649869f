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
        BenchCommand::Other(words) => {
            let sub = words.first().map(String::as_str).unwrap_or("");
            Err(super::not_implemented(&format!("bench {sub}")))
        }
    }
}
