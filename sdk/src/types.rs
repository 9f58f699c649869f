//! The data plugins and the host exchange, as plain Rust types.
//!
//! These mirror the WIT records of `rlhost:env@0.1.0` one to one (same names, `snake_case`), and
//! their serde form is the JSON of the native plugin ABI. Plugin authors and the host both use
//! these types; the WIT bindings are converted at the boundary.

use serde::{Deserialize, Serialize};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions to the model.
    System,
    /// The user (or the environment speaking as the user).
    User,
    /// The model.
    Assistant,
    /// A tool's result.
    Tool,
}

/// A tool call made by the model, in OpenAI's shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Unique within the conversation; tool results refer to it.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments as JSON text, exactly as the model wrote them (may be invalid JSON).
    pub arguments: String,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// Its text.
    pub content: String,
    /// Tool calls of an assistant message; empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For `tool` messages: the call this answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant's reasoning text, when the model produced one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

/// A tool the environment offers the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tool {
    /// The tool's name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of the arguments object, as JSON text.
    pub parameters: String,
}

/// Default sampling arguments an environment recommends; the user's flags win.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplingArgs {
    /// Sampling temperature.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Nucleus sampling mass.
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Top-k cut-off.
    #[serde(default)]
    pub top_k: Option<u32>,
    /// Maximum new tokens per turn.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Stop strings.
    #[serde(default)]
    pub stop: Vec<String>,
}

/// A named metric and its weight in the reward.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricWeight {
    /// Metric name.
    pub name: String,
    /// Weight in the reward (0 = reported only).
    pub weight: f64,
}

/// A reward plugin an environment uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RewardDep {
    /// `owner/name` of the reward plugin.
    pub plugin: String,
    /// Semver requirement, e.g. `^0.1`.
    pub version: String,
}

/// What an environment is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvInfo {
    /// Plugin name.
    pub name: String,
    /// Plugin version (semver).
    pub version: String,
    /// One line for humans.
    pub description: String,
    /// System prompt prepended to every conversation, if any.
    pub system_prompt: Option<String>,
    /// Tools offered to the model.
    pub tools: Vec<Tool>,
    /// Maximum assistant turns per rollout.
    pub max_turns: u32,
    /// Recommended sampling arguments.
    pub sampling: SamplingArgs,
    /// Metrics and their weights.
    pub rubric: Vec<MetricWeight>,
    /// Reward plugins used.
    pub rewards: Vec<RewardDep>,
    /// Dataset splits offered.
    pub splits: Vec<String>,
}

/// One dataset row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Example {
    /// Unique within its split.
    pub id: String,
    /// Prompt messages, when the row carries a ready conversation; else empty.
    #[serde(default)]
    pub prompt: Vec<Message>,
    /// The question text (used when `prompt` is empty).
    #[serde(default)]
    pub question: String,
    /// Reference answer.
    pub answer: String,
    /// Anything else, as JSON object text.
    #[serde(default = "empty_object")]
    pub info: String,
}

fn empty_object() -> String {
    "{}".to_owned()
}

/// A page of a dataset split.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetPage {
    /// The rows.
    pub examples: Vec<Example>,
    /// Number of rows in the whole split.
    pub total: u64,
}

/// The start of an episode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpisodeStart {
    /// The prompt.
    pub messages: Vec<Message>,
    /// The environment's opaque state.
    pub state: String,
}

/// The environment's answer to an assistant turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvStep {
    /// Messages to append.
    pub messages: Vec<Message>,
    /// New state.
    pub state: String,
    /// The episode is over.
    pub done: bool,
}

/// A finished rollout, to score.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollout {
    /// The example it came from.
    pub example: Example,
    /// The whole conversation, prompt included.
    pub messages: Vec<Message>,
    /// Final state.
    pub state: String,
    /// Stopped by a token or turn limit.
    pub truncated: bool,
}

/// One metric value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    /// Metric name.
    pub name: String,
    /// Its value.
    pub value: f64,
}

/// What a reward function is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RewardInfo {
    /// Plugin name.
    pub name: String,
    /// Plugin version.
    pub version: String,
    /// One line for humans.
    pub description: String,
    /// Names of the metrics `score` returns.
    pub metrics: Vec<String>,
}

/// Log levels of the host's `log` import.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Very detailed.
    Trace,
    /// Detailed.
    Debug,
    /// Normal.
    Info,
    /// Something looks wrong.
    Warn,
    /// Something is wrong.
    Error,
}

/// Limits of one Python run in the host's sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PythonLimits {
    /// Wall-clock limit.
    pub timeout_ms: u32,
    /// Memory limit.
    pub memory_mib: u32,
    /// Output beyond this is cut.
    pub max_output_bytes: u32,
}

impl Default for PythonLimits {
    fn default() -> Self {
        Self {
            timeout_ms: 10_000,
            memory_mib: 512,
            max_output_bytes: 64 * 1024,
        }
    }
}

/// What a Python run printed and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PythonOutput {
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// Exit code (0 = success).
    pub exit_code: i32,
    /// Stopped by the time limit.
    pub timed_out: bool,
}

/// Why a plugin call failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "message", rename_all = "kebab-case")]
pub enum PluginError {
    /// The environment arguments are invalid.
    InvalidArgs(String),
    /// An input (example, conversation, state) is invalid.
    InvalidInput(String),
    /// The dataset split does not exist.
    UnknownSplit(String),
    /// Anything else.
    Internal(String),
}

impl std::fmt::Display for PluginError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PluginError::InvalidArgs(m) => write!(f, "invalid environment arguments: {m}"),
            PluginError::InvalidInput(m) => write!(f, "invalid input: {m}"),
            PluginError::UnknownSplit(m) => write!(f, "unknown dataset split: {m}"),
            PluginError::Internal(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for PluginError {}
