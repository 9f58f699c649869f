//! The `[orchestrator]` section of `host rl`: what rollouts are generated, from which
//! environments and how they become training batches; evaluations during training.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ModelConfig;
use crate::rl::loss::AdvantageKind;

/// One training environment of the mixture (`[[orchestrator.env]]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EnvConfig {
    /// Installed environment plugin (`will/math-python`, `arith`).
    pub id: String,
    /// Arguments passed to the environment (its own keys; checked by the plugin).
    #[schemars(with = "serde_json::Map<String, serde_json::Value>")]
    pub args: toml::Table,
    /// Dataset split the prompts come from.
    pub split: String,
    /// Share of each step's groups drawn from this environment, relative to the other
    /// entries' weights (> 0).
    pub weight: f64,
}

impl Default for EnvConfig {
    fn default() -> Self {
        Self {
            id: "will/math-python".into(),
            args: toml::Table::new(),
            split: "train".into(),
            weight: 1.0,
        }
    }
}

/// Sampling of rollouts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SamplingConfig {
    /// Most new tokens per model turn.
    pub max_tokens: u32,
    /// Sampling temperature (the trainer takes its log-probs at the same one).
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

/// DAPO's dynamic sampling (`[orchestrator.filter_groups]`, verl's name): a step keeps only
/// groups whose rollouts disagree on `metric`, generating more groups until it has the
/// configured number (`batch_size / rollouts_per_example`) or has run `max_num_gen_batches`
/// rounds; what it has then trains.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct FilterGroups {
    /// Dynamic sampling (DAPO), on when a key of this table is set: steps train only groups
    /// whose rollouts disagree on this, a metric of the environments' rubrics (raw correctness,
    /// `correct`, not a length-shaped reward) or `reward` (the reward before any length or
    /// overlong shaping).
    pub metric: String,
    /// Generation rounds per step at most (≥ 1): the first generates the step's groups, each
    /// later one the groups still missing divided by the informative share so far (at most
    /// the step's groups again).
    pub max_num_gen_batches: usize,
}

impl Default for FilterGroups {
    fn default() -> Self {
        Self {
            metric: "correct".into(),
            max_num_gen_batches: 10,
        }
    }
}

/// DAPO's soft overlong punishment (`[orchestrator.overlong_buffer]`, verl's name): a model turn
/// within `len` tokens of `sampling.max_tokens` loses reward in proportion to how far into that
/// buffer it ran, `penalty_factor` at the limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct OverlongBuffer {
    /// Soft overlong punishment (DAPO), on when a key of this table is set: the tokens before
    /// `sampling.max_tokens` where the penalty starts (1 ≤ len < max_tokens).
    pub len: usize,
    /// The penalty at `max_tokens` (≥ 0): reward − `penalty_factor` · (L − (max_tokens − len))
    /// / len for a longest turn of L > max_tokens − len tokens.
    pub penalty_factor: f64,
}

impl Default for OverlongBuffer {
    fn default() -> Self {
        Self {
            len: 1024,
            penalty_factor: 1.0,
        }
    }
}

/// The pass-rate curriculum (`[orchestrator.curriculum]`; see `rl::curriculum`): which
/// examples steps draw, by how their groups fared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CurriculumConfig {
    /// Pass-rate curriculum, on when a key of this table is set: an example whose groups were
    /// solved by every rollout the last this-many times it was drawn leaves the pool (≥ 1).
    pub easy_streak: usize,
    /// The weight (0 < w ≤ 1, against 1 for the others) examples drawn and never solved by any
    /// rollout are drawn with.
    pub hard_weight: f64,
}

impl Default for CurriculumConfig {
    fn default() -> Self {
        Self {
            easy_streak: 2,
            hard_weight: 0.25,
        }
    }
}

/// Where rollouts are generated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ClientConfig {
    /// OpenAI-compatible servers to generate on (empty: the colocated in-process engine).
    pub base_urls: Vec<String>,
    /// Environment variable holding the servers' API key.
    pub api_key_var: Option<String>,
    /// How the servers load each step's weights (remote mode only): the route of their kind.
    pub weight_sync: crate::rollout::WeightSync,
    /// Where turns become token ids (remote mode only): `client` renders them here with the
    /// trained model's template, earlier turns as produced, and generates from the ids on the
    /// servers' `/v1/completions` (multi-turn rollouts stay one token stream on any server);
    /// `server` sends the messages to `/v1/chat/completions`; `auto` is `server` for rlhost's
    /// servers and `client` for others.
    pub render: crate::rollout::Render,
    /// Tool-call format read from the output when rendering here (`hermes`, `qwen3_coder`).
    pub tool_call_parser: String,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            base_urls: Vec::new(),
            api_key_var: None,
            weight_sync: crate::rollout::WeightSync::default(),
            render: crate::rollout::Render::default(),
            tool_call_parser: "hermes".into(),
        }
    }
}

/// One environment evaluated during training (`[[orchestrator.eval.env]]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EvalEnvConfig {
    /// Installed environment plugin.
    pub id: String,
    /// Arguments passed to the environment.
    #[schemars(with = "serde_json::Map<String, serde_json::Value>")]
    pub args: toml::Table,
    /// Dataset split evaluated.
    pub split: String,
    /// Examples evaluated (unset: the whole split).
    pub num_examples: Option<usize>,
    /// Rollouts per example.
    pub rollouts_per_example: usize,
    /// Sampling of the evaluation (unset: the orchestrator's `sampling`).
    pub sampling: Option<SamplingConfig>,
}

impl Default for EvalEnvConfig {
    fn default() -> Self {
        Self {
            id: String::new(),
            args: toml::Table::new(),
            split: "test".into(),
            num_examples: None,
            rollouts_per_example: 1,
            sampling: None,
        }
    }
}

/// Evaluations on the current weights during training (`[orchestrator.eval]`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EvalConfig {
    /// Steps between evaluations (0: none); the weights after step N·interval are evaluated.
    pub interval: usize,
    /// Also evaluate the initial weights, before the first step.
    pub at_start: bool,
    /// The environments evaluated.
    pub env: Vec<EvalEnvConfig>,
}

/// The `[orchestrator]` section: environments, rollouts, sampling, servers and evaluations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct OrchConfig {
    /// Steps (batches) to produce.
    pub max_steps: usize,
    /// Rollouts per step.
    pub batch_size: usize,
    /// Rollouts per prompt (the GRPO group size, at least 2).
    pub rollouts_per_example: usize,
    /// The batch of step n is generated by a policy at most this many steps old.
    pub async_level: usize,
    /// Rollouts with a turn from weights more than this many versions older than the
    /// trainer's are stopped before their next turn and redone on the current weights when
    /// their batch is consumed, so steps train full batches (counted in `stale_dropped`; at or
    /// above `async_level` nothing is ever that old; unset: off).
    pub max_off_policy_steps: Option<usize>,
    /// Seed of prompt order, environment mixture and sampling.
    pub seed: u64,
    /// Rollouts in flight at once.
    pub max_concurrent: usize,
    /// The policy served for rollouts.
    pub model: ModelConfig,
    /// Training environments, sampled by `weight`.
    pub env: Vec<EnvConfig>,
    /// Sampling of rollouts.
    pub sampling: SamplingConfig,
    /// Group advantages.
    pub advantage: AdvantageKind,
    /// Kimi k1.5 length penalty on rewards within a group (0: off).
    pub length_penalty: f64,
    /// Drop groups whose rollouts all got the same reward (no signal).
    pub online_difficulty_filtering: bool,
    /// Train on truncated completions with zero weight.
    pub mask_truncated_completions: bool,
    /// Dynamic sampling: steps of informative groups only (unset: off).
    pub filter_groups: Option<FilterGroups>,
    /// Soft overlong punishment of rewards (unset: off).
    pub overlong_buffer: Option<OverlongBuffer>,
    /// Pass-rate curriculum over the environments' examples (unset: every example in turn).
    pub curriculum: Option<CurriculumConfig>,
    /// Generation servers.
    pub client: ClientConfig,
    /// How later turns' prompts carry the conversation: `as_produced` (the token ids the model
    /// produced, then the new messages: prefix-cache hits and one merged training sample per
    /// rollout) or `template` (re-rendered each turn).
    pub history: crate::rollout::History,
    /// Evaluations during training.
    pub eval: EvalConfig,
}

impl Default for OrchConfig {
    fn default() -> Self {
        Self {
            max_steps: 300,
            batch_size: 1024,
            rollouts_per_example: 16,
            async_level: 2,
            max_off_policy_steps: None,
            seed: 0,
            max_concurrent: 256,
            model: ModelConfig::default(),
            env: vec![EnvConfig::default()],
            sampling: SamplingConfig::default(),
            advantage: AdvantageKind::Drgrpo,
            length_penalty: 0.0,
            online_difficulty_filtering: false,
            mask_truncated_completions: false,
            filter_groups: None,
            overlong_buffer: None,
            curriculum: None,
            client: ClientConfig::default(),
            history: crate::rollout::History::AsProduced,
            eval: EvalConfig::default(),
        }
    }
}
