//! `host rl`'s configuration, prime-rl style: a trainer, an orchestrator and an inference
//! section, each loaded from TOML (`--trainer @ train.toml`) and overridable by dotted flags
//! (`--trainer.optim.lr 3e-6`, `--orchestrator.batch-size 64`; hyphens and underscores are the
//! same). `--model.name X` sets the model of every section. Unknown keys are errors naming the
//! key and where it came from. `host rl --plugin NAME` starts from `configs/NAME/rl/*.toml`
//! when they exist.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::loss::{AdvantageKind, LossConfig};
use super::trainer::OptimConfig;

/// The model a section uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// A folder or hub id.
    pub name: String,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            name: "Qwen/Qwen3-8B".into(),
        }
    }
}

/// Trainer data settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// Longest packed sequence (tokens).
    pub seq_len: usize,
    /// Sequences of `seq_len` per micro-batch (the token budget is the product).
    pub micro_batch_size: usize,
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            seq_len: 12_288,
            micro_batch_size: 1,
        }
    }
}

/// Checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CkptConfig {
    /// Steps between checkpoints (0: only at the end).
    pub interval: usize,
    /// Checkpoints kept (older ones are deleted).
    pub keep: usize,
}

impl Default for CkptConfig {
    fn default() -> Self {
        Self {
            interval: 25,
            keep: 2,
        }
    }
}

/// The trainer section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainerConfig {
    /// Optimiser steps.
    pub max_steps: usize,
    /// The policy.
    pub model: ModelConfig,
    /// AdamW and its schedule.
    pub optim: OptimConfig,
    /// The loss.
    pub loss: LossConfig,
    /// Packing.
    pub data: DataConfig,
    /// Checkpoints.
    pub ckpt: CkptConfig,
    /// `auto`, `cpu`, `cuda:N`.
    pub device: String,
}

impl Default for TrainerConfig {
    fn default() -> Self {
        Self {
            max_steps: 300,
            model: ModelConfig::default(),
            optim: OptimConfig::default(),
            loss: LossConfig::default(),
            data: DataConfig::default(),
            ckpt: CkptConfig::default(),
            device: "auto".into(),
        }
    }
}

/// The environment trained on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnvConfig {
    /// Installed plugin (`will/math-python`, `arith`).
    pub id: String,
    /// Environment arguments.
    pub args: toml::Table,
    /// Dataset split of the prompts.
    pub split: String,
}

impl Default for EnvConfig {
    fn default() -> Self {
        Self {
            id: "will/math-python".into(),
            args: toml::Table::new(),
            split: "train".into(),
        }
    }
}

/// Sampling of rollouts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SamplingConfig {
    /// Most new tokens per turn.
    pub max_tokens: u32,
    /// Temperature (the trainer's log-probs use the same).
    pub temperature: f64,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self {
            max_tokens: 8192,
            temperature: 1.0,
        }
    }
}

/// Where rollouts are generated.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientConfig {
    /// OpenAI-compatible servers (empty: the in-process engine, sharing the trainer's process).
    pub base_urls: Vec<String>,
    /// Environment variable with their API key.
    pub api_key_var: Option<String>,
}

/// The orchestrator section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OrchConfig {
    /// Steps (batches) to produce.
    pub max_steps: usize,
    /// Rollouts per step.
    pub batch_size: usize,
    /// Rollouts per prompt (the group size).
    pub rollouts_per_example: usize,
    /// Rollouts for step n may come from a policy at most this many steps old.
    pub async_level: usize,
    /// Seed of prompt order and sampling.
    pub seed: u64,
    /// Rollouts in flight.
    pub max_concurrent: usize,
    /// The policy served for rollouts.
    pub model: ModelConfig,
    /// The environment.
    pub environment: EnvConfig,
    /// Sampling.
    pub sampling: SamplingConfig,
    /// Group advantages.
    pub advantage: AdvantageKind,
    /// Drop groups whose rollouts all got the same reward (no signal).
    pub online_difficulty_filtering: bool,
    /// Train on truncated completions with zero weight.
    pub mask_truncated_completions: bool,
    /// Generation servers.
    pub client: ClientConfig,
    /// How later turns' prompts carry the conversation: `as_produced` (the token ids the model
    /// produced, then the new messages: prefix-cache hits and one merged training sample per
    /// rollout) or `template` (re-rendered each turn).
    pub history: crate::rollout::History,
}

impl Default for OrchConfig {
    fn default() -> Self {
        Self {
            max_steps: 300,
            batch_size: 1024,
            rollouts_per_example: 16,
            async_level: 2,
            seed: 0,
            max_concurrent: 256,
            model: ModelConfig::default(),
            environment: EnvConfig::default(),
            sampling: SamplingConfig::default(),
            advantage: AdvantageKind::Drgrpo,
            online_difficulty_filtering: false,
            mask_truncated_completions: false,
            client: ClientConfig::default(),
            history: crate::rollout::History::AsProduced,
        }
    }
}

/// The inference section: the same keys as `host inference`'s flags, so one `infer.toml`
/// serves `host inference @ infer.toml` and `host rl --inference @ infer.toml`. `host rl` uses
/// the engine settings for its colocated engine (when no `client.base_urls`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InferConfig {
    /// Sequences decoded together.
    pub max_batch_size: usize,
    /// Most tokens per sequence.
    pub max_model_len: usize,
    /// Tool-call format.
    pub tool_call_parser: String,
    /// Parse tool calls (always on for rollouts).
    pub enable_auto_tool_choice: bool,
    /// The model served (normally the trainer's).
    pub model: ModelConfig,
    /// Served name (`host inference`).
    pub served_model_name: Option<String>,
    /// Listening address (`host inference`).
    pub host: String,
    /// Listening port (`host inference`).
    pub port: u16,
    /// `auto`, `f32`, `bf16`.
    pub dtype: String,
    /// `auto`, `cpu`, `cuda:N`.
    pub device: String,
    /// Requests in flight before 503 (`host inference`).
    pub max_queue: usize,
    /// CPU threads for libtorch.
    pub threads: Option<usize>,
    /// Reuse the keys and values of prompt prefixes computed before (the engine's prefix
    /// cache): a group's shared prompt and every earlier turn of a conversation.
    pub enable_prefix_caching: bool,
    /// Budget of the prefix cache in tokens (default: from the machine's memory).
    pub kv_cache_tokens: Option<usize>,
    /// Tokens per prefix-cache block.
    pub block_size: usize,
    /// Most prompt tokens prefilled per engine step.
    pub max_num_batched_tokens: usize,
}

impl Default for InferConfig {
    fn default() -> Self {
        Self {
            max_batch_size: 64,
            max_model_len: 12_288,
            tool_call_parser: "hermes".into(),
            enable_auto_tool_choice: true,
            model: ModelConfig::default(),
            served_model_name: None,
            host: "127.0.0.1".into(),
            port: 8000,
            dtype: "auto".into(),
            device: "auto".into(),
            max_queue: 1024,
            threads: None,
            enable_prefix_caching: true,
            kv_cache_tokens: None,
            block_size: 16,
            max_num_batched_tokens: 2048,
        }
    }
}

/// Everything `host rl` needs.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RlConfig {
    /// The trainer.
    pub trainer: TrainerConfig,
    /// The orchestrator.
    pub orchestrator: OrchConfig,
    /// The colocated inference engine.
    pub inference: InferConfig,
}

/// Options of a run that are not configuration.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Where checkpoints, metrics and plots go.
    pub output_dir: Option<PathBuf>,
    /// Continue from the last checkpoint in the output folder.
    pub resume: bool,
}

/// Errors of the command line and config files.
#[derive(Debug, thiserror::Error)]
pub enum RlConfigError {
    /// A flag is malformed or unknown.
    #[error("{0}")]
    Usage(String),
    /// A file cannot be read or parsed.
    #[error("config {path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The merged configuration is invalid (unknown key, wrong type).
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

const SECTIONS: [&str; 3] = ["trainer", "orchestrator", "inference"];

fn section_alias(s: &str) -> Option<&'static str> {
    match s {
        "trainer" => Some("trainer"),
        "orchestrator" | "orch" => Some("orchestrator"),
        "inference" | "infer" => Some("inference"),
        _ => None,
    }
}

/// Sets `path` (dotted, hyphens as underscores) in `root` to `value`.
fn set(root: &mut toml::Table, path: &[String], value: toml::Value) {
    let (last, parents) = path.split_last().expect("a key");
    let mut t = root;
    for p in parents {
        let entry = t
            .entry(p.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        t = entry.as_table_mut().expect("a table");
    }
    t.insert(last.clone(), value);
}

/// Deep-merges `over` into `base`.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

fn normalise(t: toml::Table) -> toml::Table {
    t.into_iter()
        .map(|(k, v)| {
            let v = match v {
                toml::Value::Table(t) if k != "args" => toml::Value::Table(normalise(t)),
                other => other,
            };
            (k.replace('-', "_"), v)
        })
        .collect()
}

fn read_toml(path: &Path) -> Result<toml::Table, RlConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| RlConfigError::File {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    text.parse::<toml::Table>()
        .map(normalise)
        .map_err(|e| RlConfigError::File {
            path: path.to_owned(),
            message: e.to_string(),
        })
}

/// A flag value as TOML: a number, boolean, array or inline table when it parses as one,
/// else a string.
fn value(text: &str) -> toml::Value {
    format!("v = {text}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(text.to_string()))
}

/// Parses `host rl`'s arguments (after `rl`). `configs` is the repository's `configs/` folder
/// for `--plugin` defaults.
pub fn parse(args: &[String], configs: &Path) -> Result<(RlConfig, RunOptions), RlConfigError> {
    let mut tree = toml::Table::new();
    let mut opts = RunOptions::default();
    let mut overrides: Vec<(Vec<String>, toml::Value)> = Vec::new();
    let mut files: Vec<(&'static str, PathBuf)> = Vec::new();
    let mut plugin: Option<String> = None;
    let mut i = 0;
    let next = |i: &mut usize, flag: &str| -> Result<String, RlConfigError> {
        *i += 1;
        args.get(*i)
            .cloned()
            .ok_or_else(|| RlConfigError::Usage(format!("{flag} needs a value")))
    };
    while i < args.len() {
        let a = &args[i];
        let Some(flag) = a.strip_prefix("--") else {
            return Err(RlConfigError::Usage(format!(
                "unexpected argument {a:?} (flags are --plugin, --trainer @ FILE, --orchestrator @ FILE, --inference @ FILE, --KEY VALUE, --output-dir, --resume)"
            )));
        };
        let (flag, inline) = match flag.split_once('=') {
            Some((f, v)) => (f, Some(v.to_string())),
            None => (flag, None),
        };
        match flag {
            "resume" => opts.resume = true,
            "output-dir" | "output_dir" => {
                opts.output_dir = Some(PathBuf::from(match inline {
                    Some(v) => v,
                    None => next(&mut i, a)?,
                }))
            }
            "plugin" => {
                let p = match inline {
                    Some(v) => v,
                    None => next(&mut i, a)?,
                };
                plugin = Some(p);
            }
            _ => {
                let v = match inline {
                    Some(v) => v,
                    None => next(&mut i, a)?,
                };
                if v == "@" {
                    let section = section_alias(flag).ok_or_else(|| {
                        RlConfigError::Usage(format!(
                            "`--{flag} @ FILE`: the sections are trainer, orchestrator, inference"
                        ))
                    })?;
                    files.push((section, PathBuf::from(next(&mut i, a)?)));
                } else {
                    let path: Vec<String> = flag.split('.').map(|p| p.replace('-', "_")).collect();
                    overrides.push((path, value(&v)));
                }
            }
        }
        i += 1;
    }
    if let Some(p) = &plugin {
        // Defaults from configs/<plugin>/rl/ (owner prefix dropped), when present.
        let short = p.rsplit('/').next().unwrap_or(p);
        for (section, file) in [
            ("trainer", "train.toml"),
            ("orchestrator", "orch.toml"),
            ("inference", "infer.toml"),
        ] {
            let path = configs.join(short).join("rl").join(file);
            if path.is_file() && !files.iter().any(|(s, _)| *s == section) {
                files.insert(0, (section, path));
            }
        }
    }
    for (section, path) in &files {
        let mut t = toml::Table::new();
        t.insert(section.to_string(), toml::Value::Table(read_toml(path)?));
        merge(&mut tree, t);
    }
    if let Some(p) = &plugin {
        set(
            &mut tree,
            &["orchestrator".into(), "environment".into(), "id".into()],
            toml::Value::String(p.clone()),
        );
    }
    for (path, v) in overrides {
        if path.first().map(String::as_str) == Some("model") {
            // `--model.name X` applies to every section.
            for s in SECTIONS {
                let mut p = vec![s.to_string()];
                p.extend(path.iter().cloned());
                set(&mut tree, &p, v.clone());
            }
            continue;
        }
        let Some(section) = path.first().and_then(|s| section_alias(s)) else {
            return Err(RlConfigError::Usage(format!(
                "unknown flag --{}: keys start with trainer., orchestrator., inference. or model.",
                path.join(".")
            )));
        };
        let mut p = vec![section.to_string()];
        p.extend(path[1..].iter().cloned());
        set(&mut tree, &p, v);
    }
    // The inference section's environment-facing settings follow the others when unset.
    let cfg: RlConfig = serde_path_to_error::deserialize(toml::Value::Table(tree))
        .map_err(|e| RlConfigError::Invalid(format!("{} (at `{}`)", e.inner(), e.path())))?;
    Ok((cfg, opts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn files_then_flags_and_model_everywhere() {
        let dir = tempfile::tempdir().unwrap();
        let train = dir.path().join("train.toml");
        std::fs::write(
            &train,
            "max_steps = 7\n[optim]\nlr = 1e-6\n[loss]\nclip-ratio = 4.0\n",
        )
        .unwrap();
        let (cfg, opts) = parse(
            &args(&[
                "--trainer",
                "@",
                train.to_str().unwrap(),
                "--trainer.optim.lr",
                "3e-6",
                "--orchestrator.batch-size",
                "64",
                "--orchestrator.environment.args",
                "{tools = \"none\"}",
                "--model.name",
                "/m",
                "--output-dir",
                "/out",
                "--resume",
            ]),
            dir.path(),
        )
        .unwrap();
        assert_eq!(cfg.trainer.max_steps, 7);
        assert_eq!(cfg.trainer.optim.lr, 3e-6);
        assert_eq!(cfg.trainer.loss.clip_ratio, 4.0);
        assert_eq!(cfg.orchestrator.batch_size, 64);
        assert_eq!(
            cfg.orchestrator.environment.args["tools"].as_str(),
            Some("none")
        );
        for m in [
            &cfg.trainer.model,
            &cfg.orchestrator.model,
            &cfg.inference.model,
        ] {
            assert_eq!(m.name, "/m");
        }
        assert!(opts.resume);
        assert_eq!(opts.output_dir.as_deref(), Some(Path::new("/out")));
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let e = parse(&args(&["--trainer.optim.lrr", "1"]), dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("lrr") && e.contains("trainer.optim"), "{e}");
        let e = parse(&args(&["--trainer.max-steps", "many"]), dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("trainer.max_steps"), "{e}");
        let e = parse(&args(&["--nope", "1"]), dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("--nope"), "{e}");
        let e = parse(&args(&["--trainer", "@", "/missing.toml"]), dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("/missing.toml"), "{e}");
    }

    #[test]
    fn the_repository_configs_parse() {
        let configs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
        let (cfg, _) = parse(&args(&["--plugin", "math-python"]), &configs).unwrap();
        assert_eq!(cfg.trainer.max_steps, 300);
        assert_eq!(cfg.orchestrator.batch_size, 1024);
        assert_eq!(cfg.orchestrator.rollouts_per_example, 16);
        assert_eq!(cfg.trainer.loss.clip_ratio, 8.0);
        assert_eq!(cfg.orchestrator.environment.id, "math-python");
        assert_eq!(cfg.trainer.model.name, "Qwen/Qwen3-8B");
        let (cfg, _) = parse(
            &args(&["--plugin", "arith", "--model.name", "/m"]),
            &configs,
        )
        .unwrap();
        assert_eq!(cfg.orchestrator.rollouts_per_example, 8);
        assert_eq!(cfg.inference.max_model_len, 1024);
        assert_eq!(cfg.inference.model.name, "/m");
    }
}
