//! The traits plugin authors implement. Each is exported with one macro line,
//! [`export_environment!`](crate::export_environment) or [`export_reward!`](crate::export_reward),
//! which builds the WebAssembly component glue on `wasm32` targets and the native (C ABI) glue
//! everywhere else, so one source gives both kinds of plugin.
//!
//! Functions are associated functions (no `self`): a component instance lives for one rollout at
//! most, so per-rollout state belongs in the explicit `state` string, not in the type.

use crate::types::{
    DatasetPage, EnvInfo, EnvStep, EpisodeStart, Example, Message, Metric, PluginError, RewardInfo,
    Rollout,
};

/// An environment: a dataset, a prompt, optional multi-turn responses (tools), and a score.
pub trait Environment {
    /// What this environment is: name, tools, rubric, splits. Called once per load.
    fn info() -> EnvInfo;

    /// Rows `offset..offset + limit` of `split` and the split's size. Unknown split:
    /// [`PluginError::UnknownSplit`].
    fn dataset(split: &str, offset: u64, limit: u32) -> Result<DatasetPage, PluginError>;

    /// The prompt for `example`. `env_args` is a JSON object (`{}` when the user gave none); an
    /// invalid one is [`PluginError::InvalidArgs`] naming the argument.
    fn initial_prompt(example: Example, env_args: &str) -> Result<EpisodeStart, PluginError>;

    /// The environment's turn after an assistant message. The default ends the episode: right for
    /// single-turn environments.
    fn env_response(conversation: Vec<Message>, state: String) -> Result<EnvStep, PluginError> {
        let _ = conversation;
        Ok(EnvStep {
            messages: Vec::new(),
            state,
            done: true,
        })
    }

    /// Per-metric values for a finished rollout; the host weighs them with the rubric.
    fn score(rollout: Rollout) -> Result<Vec<Metric>, PluginError>;
}

/// A reusable reward function (e.g. math answer verification).
pub trait RewardFunction {
    /// What this reward function is.
    fn info() -> RewardInfo;

    /// Scores `completion` against the reference `answer`; `info` is JSON object text.
    fn score(completion: &str, answer: &str, info: &str) -> Result<Vec<Metric>, PluginError>;
}
