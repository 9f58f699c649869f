//! The `host` command line. Thin by design: each subcommand parses its arguments, calls one library
//! function, and prints the result. No logic that a test would want to reach lives here.
//!
//! An unknown subcommand is a usage error (exit 2) that lists the group's subcommands
//! ([`unknown_subcommand_help`]); nothing parses as "not built yet".

mod bench;
mod doctor;
mod env;
mod eval;
mod inference;
mod model;
mod registry;
mod rl;
mod sandbox;
mod sft;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// rlhost: reinforcement learning of LLMs on verifiable tasks, in one binary.
///
/// Install sandboxed environment plugins from a registry, serve a model over an OpenAI-compatible
/// API, evaluate it, and train it with GRPO.
#[derive(Debug, Parser)]
#[command(name = "host", version = crate::VERSION, propagate_version = true)]
pub struct Cli {
    /// More log output (-v: debug, -vv: trace). `RLHOST_LOG` (tracing filter syntax) overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommand groups of `host`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Environment plugins: init, pack, publish, install, list, remove, search, info, yank.
    Env(env::EnvArgs),
    /// Plugin registries: create one, make publisher keys, accept keys.
    Registry(registry::RegistryArgs),
    /// Models: create tiny Qwen3-architecture models (`host model init`), inspect, convert.
    Model(model::ModelArgs),
    /// The Python tool sandbox (CPython in WebAssembly): run code as a model's tool would.
    Sandbox(sandbox::SandboxArgs),
    /// Serve a model over an OpenAI-compatible API with tool calling.
    #[command(args_override_self = true)]
    Inference(inference::InferenceArgs),
    /// Evaluate a model on environment plugins (Avg@k, Pass@k, vf-eval style metrics).
    Eval(Box<eval::EvalArgs>),
    /// Train a model with GRPO against an environment plugin (`host rl --plugin math-python`).
    Rl(rl::RlArgs),
    /// Supervised fine-tuning on conversations or `host eval` rollouts (warm start before RL).
    Sft(sft::SftArgs),
    /// Benchmarks that compare rlhost with a peer measured in the same run.
    Bench(bench::BenchArgs),
    /// Check this installation: versions, CUDA, threads, plugin ABIs, paths, registry.
    Doctor(doctor::DoctorArgs),
}

impl Command {
    /// The subcommand's name as typed on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Env(_) => "env",
            Command::Registry(_) => "registry",
            Command::Model(_) => "model",
            Command::Sandbox(_) => "sandbox",
            Command::Inference(_) => "inference",
            Command::Eval(_) => "eval",
            Command::Rl(_) => "rl",
            Command::Sft(_) => "sft",
            Command::Bench(_) => "bench",
            Command::Doctor(_) => "doctor",
        }
    }
}

/// Runs a parsed command line. Returns the process exit code for outcomes that are not errors
/// (e.g. `host doctor` found problems and said so).
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Doctor(args) => doctor::run(args),
        Command::Env(args) => env::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Sandbox(args) => sandbox::run(args),
        Command::Registry(args) => registry::run(args),
        Command::Model(args) => model::run(args),
        Command::Inference(args) => inference::run(args),
        Command::Eval(args) => eval::run(*args),
        Command::Rl(args) => rl::run(args),
        Command::Sft(args) => sft::run(args),
    }
}

/// A tokio runtime for commands that drive async work (plugins, servers).
pub(crate) fn async_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    use anyhow::Context;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// A plugin loader for environments that may call the python tool, with the WebAssembly sandbox
/// found for `home` ([`crate::plugin::LoadOptions::for_home`]); compiled components are cached
/// in the home.
pub(crate) fn env_loader(
    home: &crate::home::RlhostHome,
    allow_missing: bool,
) -> anyhow::Result<crate::plugin::PluginLoader> {
    Ok(crate::plugin::PluginLoader::new(
        crate::plugin::LoadOptions::for_home(home, allow_missing),
        Some(home.cache_dir()),
    )?)
}

/// Serialises a value by its text (`Display`), for the params monitors record.
pub(super) fn as_text<S: serde::Serializer>(
    v: &impl std::fmt::Display,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// An environment (or a reward plugin it declares) that does not load, as `host eval` and
/// `host rl` report it: a capability refusal says how to run anyway.
pub(crate) fn load_failure(e: crate::plugin::install::LoadInstalledError) -> anyhow::Error {
    match e {
        crate::plugin::install::LoadInstalledError::Load { name, dir, source } => {
            capability_hint(source).context(format!("loading {name} from {}", dir.display()))
        }
        other => anyhow::Error::new(other),
    }
}

/// The flag that runs plugins without a capability they declared: named in errors.
pub(crate) const ALLOW_MISSING_FLAG: &str = "--allow-missing-capabilities";

/// `err` (a plugin failing to load), with how to run anyway when what failed is a capability.
pub(crate) fn capability_hint(err: crate::plugin::PluginError) -> anyhow::Error {
    match *err.kind {
        crate::plugin::PluginErrorKind::CapabilitiesUnavailable(_) => {
            anyhow::Error::new(CapabilityRefusal(err))
        }
        _ => anyhow::Error::new(err),
    }
}

/// A plugin refused for a capability, with the way out (the plugin error's message holds its
/// whole chain, so it is shown, not kept as a source).
#[derive(Debug, thiserror::Error)]
#[error(
    "{0}\n  (without it, its tool calls fail and every score is wrong; \
     {ALLOW_MISSING_FLAG} runs it anyway, marking every rollout)"
)]
struct CapabilityRefusal(crate::plugin::PluginError);

/// For a command line clap refused with an unknown subcommand: a line listing the subcommands of
/// the group it was given to (`host bench`), so the usage error says what exists (clap itself
/// only suggests a close spelling). `None` where the line names no group.
pub fn unknown_subcommand_help(args: &[std::ffi::OsString]) -> Option<String> {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    let mut path = vec![cmd.get_name().to_owned()];
    for arg in args.iter().skip(1) {
        let arg = arg.to_str()?;
        if arg.starts_with('-') {
            continue;
        }
        match cmd.find_subcommand(arg) {
            Some(sub) => {
                path.push(sub.get_name().to_owned());
                cmd = sub.clone();
            }
            None => break,
        }
    }
    let names: Vec<&str> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(|s| s.get_name())
        .filter(|n| *n != "help")
        .collect();
    (!names.is_empty()).then(|| format!("`{}` has: {}", path.join(" "), names.join(", ")))
}

/// Sets up `tracing` output on stderr: `RLHOST_LOG` if set, else a level from `-v` flags;
/// coloured only on a terminal, and never with `NO_COLOR` set (<https://no-color.org>), so a
/// piped or redirected log holds no escape codes.
pub fn init_logging(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    // Extism logs every failing plugin call itself; rlhost reports those failures already, with
    // the plugin's name, so its own events stay out of the way below -vv.
    let default = match verbose {
        0 => "warn,extism=off",
        1 => "debug,extism=warn",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_env("RLHOST_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    // A second initialisation (tests calling `run` twice) is harmless: keep the first.
    let colour = log_colour(
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .try_init();
}

/// Whether log lines carry ANSI colour codes: on a terminal, unless `NO_COLOR` is set to a
/// non-empty value.
fn log_colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Starts the monitors `cfg` asks for, for the command `command` writing to `out` (the run's
/// default name) with the resolved configuration `config` (MLflow params, TensorBoard's config
/// text). `resume`: a `host rl` run going on in `out`, which keeps its MLflow run id there.
pub(crate) fn start_monitors(
    cfg: &crate::monitor::MonitorConfig,
    command: &str,
    config: &impl serde::Serialize,
    out: &std::path::Path,
    resume: Option<bool>,
) -> anyhow::Result<crate::monitor::Monitors> {
    if !cfg.any() {
        return Ok(crate::monitor::Monitors::none());
    }
    let config_text = toml::to_string_pretty(config)
        .or_else(|_| serde_json::to_string_pretty(config).map_err(|e| e.to_string()))
        .unwrap_or_default();
    let name = std::path::absolute(out)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| command.replace(' ', "-"));
    let info = crate::monitor::RunInfo {
        command: command.to_owned(),
        default_name: name,
        params: crate::monitor::params(config),
        config_text,
        state_dir: resume.map(|_| out.to_owned()),
        resume: resume.unwrap_or(false),
    };
    Ok(crate::monitor::Monitors::start(cfg, &info)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Colour only on a terminal, and not with a non-empty `NO_COLOR`.
    #[test]
    fn logs_are_coloured_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(log_colour(true, None));
        assert!(log_colour(true, Some(OsStr::new(""))));
        assert!(!log_colour(true, Some(OsStr::new("1"))));
        assert!(!log_colour(false, None));
    }

    #[test]
    fn command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_group_name_matches_its_clap_name() {
        let cli = Cli::command();
        for sub in cli.get_subcommands() {
            // Groups with subcommands need one of theirs.
            let parsed = Cli::try_parse_from(["host", sub.get_name()])
                .or_else(|_| Cli::try_parse_from(["host", sub.get_name(), "products"]))
                .or_else(|_| Cli::try_parse_from(["host", sub.get_name(), "run", "-c", "1"]))
                .or_else(|_| Cli::try_parse_from(["host", sub.get_name(), "list"]))
                .or_else(|_| Cli::try_parse_from(["host", sub.get_name(), "trust"]))
                .or_else(|_| Cli::try_parse_from(["host", sub.get_name(), "info", "dir"]))
                .or_else(|_| Cli::try_parse_from(["host", sub.get_name(), "-m", "dir"]))
                .or_else(|_| Cli::try_parse_from(["host", sub.get_name(), "env", "-m", "dir"]))
                .or_else(|_| {
                    Cli::try_parse_from([
                        "host",
                        sub.get_name(),
                        "-m",
                        "m",
                        "--data",
                        "d",
                        "--out",
                        "o",
                    ])
                })
                .expect("parses");
            assert_eq!(parsed.command.name(), sub.get_name());
        }
    }

    #[test]
    fn an_unknown_subcommand_is_a_usage_error_listing_the_group() {
        let args: Vec<std::ffi::OsString> = ["host", "bench", "inference", "--model", "x"]
            .iter()
            .map(Into::into)
            .collect();
        let err = Cli::try_parse_from(&args).expect_err("no such benchmark");
        assert_eq!(err.kind(), clap::error::ErrorKind::InvalidSubcommand);
        let help = unknown_subcommand_help(&args).expect("bench is a group");
        assert!(
            help.starts_with("`host bench` has: plugins, sandbox,"),
            "{help}"
        );
        assert!(
            help.contains("products") && help.contains("serve"),
            "{help}"
        );
        let top: Vec<std::ffi::OsString> = ["host", "nope"].iter().map(Into::into).collect();
        assert!(unknown_subcommand_help(&top).unwrap().contains("inference"));
    }
}
