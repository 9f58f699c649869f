//! Component glue for `wasm32` guests: the WIT bindings of `rlhost:env@0.1.0` and adapters from
//! the SDK traits to the generated `Guest` traits. Used through the export macros only.

#![allow(missing_docs)]

use core::marker::PhantomData;

use crate::plugin::{Environment, RewardFunction};
use crate::types as t;

pub use wit_bindgen;

/// Bindings of the `environment` world.
pub mod env_world {
    wit_bindgen::generate!({
        world: "environment",
        path: "wit/v0.1.0",
        pub_export_macro: true,
        export_macro_name: "__export_environment_world",
        default_bindings_module: "::rlhost_sdk::__wasm::env_world",
        runtime_path: "::rlhost_sdk::__wasm::wit_bindgen::rt",
    });
}

/// Bindings of the `reward` world; types and host imports are shared with `env_world`.
pub mod reward_world {
    wit_bindgen::generate!({
        world: "reward",
        path: "wit/v0.1.0",
        pub_export_macro: true,
        export_macro_name: "__export_reward_world",
        default_bindings_module: "::rlhost_sdk::__wasm::reward_world",
        runtime_path: "::rlhost_sdk::__wasm::wit_bindgen::rt",
        type_section_suffix: "reward",
        with: {
            "rlhost:env/types@0.1.0": super::env_world::rlhost::env::types,
            "rlhost:env/host@0.1.0": super::env_world::rlhost::env::host,
        },
    });
}

use env_world::exports::rlhost::env::env as wenv;
use env_world::rlhost::env::host as whost;
use env_world::rlhost::env::types as w;
use reward_world::exports::rlhost::env::reward_fn as wreward;

/// Adapts an [`Environment`] to the generated export trait.
pub struct EnvAdapter<T>(PhantomData<T>);

impl<T: Environment> wenv::Guest for EnvAdapter<T> {
    fn info() -> w::EnvInfo {
        T::info().into()
    }
    fn dataset(split: String, offset: u64, limit: u32) -> Result<w::DatasetPage, w::PluginError> {
        T::dataset(&split, offset, limit)
            .map(Into::into)
            .map_err(Into::into)
    }
    fn initial_prompt(
        example: w::Example,
        env_args: String,
    ) -> Result<w::EpisodeStart, w::PluginError> {
        T::initial_prompt(example.into(), &env_args)
            .map(Into::into)
            .map_err(Into::into)
    }
    fn env_response(
        conversation: Vec<w::Message>,
        state: String,
    ) -> Result<w::EnvStep, w::PluginError> {
        T::env_response(conversation.into_iter().map(Into::into).collect(), state)
            .map(Into::into)
            .map_err(Into::into)
    }
    fn score(rollout: w::Rollout) -> Result<Vec<w::Metric>, w::PluginError> {
        T::score(rollout.into())
            .map(|ms| ms.into_iter().map(Into::into).collect())
            .map_err(Into::into)
    }
}

/// Adapts a [`RewardFunction`] to the generated export trait.
pub struct RewardAdapter<T>(PhantomData<T>);

impl<T: RewardFunction> wreward::Guest for RewardAdapter<T> {
    fn info() -> wreward::RewardInfo {
        let i = T::info();
        wreward::RewardInfo {
            name: i.name,
            version: i.version,
            description: i.description,
            metrics: i.metrics,
        }
    }
    fn score(
        completion: String,
        answer: String,
        info: String,
    ) -> Result<Vec<w::Metric>, w::PluginError> {
        T::score(&completion, &answer, &info)
            .map(|ms| ms.into_iter().map(Into::into).collect())
            .map_err(Into::into)
    }
}

// --- host imports -------------------------------------------------------------------------------

pub(crate) fn log(level: t::LogLevel, message: &str) {
    let level = match level {
        t::LogLevel::Trace => whost::LogLevel::Trace,
        t::LogLevel::Debug => whost::LogLevel::Debug,
        t::LogLevel::Info => whost::LogLevel::Info,
        t::LogLevel::Warn => whost::LogLevel::Warn,
        t::LogLevel::Error => whost::LogLevel::Error,
    };
    whost::log(level, message);
}

pub(crate) fn run_python(code: &str, limits: t::PythonLimits) -> Result<t::PythonOutput, String> {
    let limits = whost::PythonLimits {
        timeout_ms: limits.timeout_ms,
        memory_mib: limits.memory_mib,
        max_output_bytes: limits.max_output_bytes,
    };
    whost::run_python(code, limits).map(|o| t::PythonOutput {
        stdout: o.stdout,
        stderr: o.stderr,
        exit_code: o.exit_code,
        timed_out: o.timed_out,
    })
}

pub(crate) fn read_data(path: &str) -> Result<Vec<u8>, String> {
    whost::read_data(path)
}

pub(crate) fn rollout_seed() -> u64 {
    whost::rollout_seed()
}

// --- conversions --------------------------------------------------------------------------------

impl From<w::Role> for t::Role {
    fn from(r: w::Role) -> Self {
        match r {
            w::Role::System => t::Role::System,
            w::Role::User => t::Role::User,
            w::Role::Assistant => t::Role::Assistant,
            w::Role::Tool => t::Role::Tool,
        }
    }
}

impl From<t::Role> for w::Role {
    fn from(r: t::Role) -> Self {
        match r {
            t::Role::System => w::Role::System,
            t::Role::User => w::Role::User,
            t::Role::Assistant => w::Role::Assistant,
            t::Role::Tool => w::Role::Tool,
        }
    }
}

impl From<w::Message> for t::Message {
    fn from(m: w::Message) -> Self {
        t::Message {
            role: m.role.into(),
            content: m.content,
            tool_calls: m
                .tool_calls
                .into_iter()
                .map(|c| t::ToolCall {
                    id: c.id,
                    name: c.name,
                    arguments: c.arguments,
                })
                .collect(),
            tool_call_id: m.tool_call_id,
            reasoning: m.reasoning,
        }
    }
}

impl From<t::Message> for w::Message {
    fn from(m: t::Message) -> Self {
        w::Message {
            role: m.role.into(),
            content: m.content,
            tool_calls: m
                .tool_calls
                .into_iter()
                .map(|c| w::ToolCall {
                    id: c.id,
                    name: c.name,
                    arguments: c.arguments,
                })
                .collect(),
            tool_call_id: m.tool_call_id,
            reasoning: m.reasoning,
        }
    }
}

impl From<w::Example> for t::Example {
    fn from(e: w::Example) -> Self {
        t::Example {
            id: e.id,
            prompt: e.prompt.into_iter().map(Into::into).collect(),
            question: e.question,
            answer: e.answer,
            info: e.info,
        }
    }
}

impl From<t::Example> for w::Example {
    fn from(e: t::Example) -> Self {
        w::Example {
            id: e.id,
            prompt: e.prompt.into_iter().map(Into::into).collect(),
            question: e.question,
            answer: e.answer,
            info: e.info,
        }
    }
}

impl From<t::EnvInfo> for w::EnvInfo {
    fn from(i: t::EnvInfo) -> Self {
        w::EnvInfo {
            name: i.name,
            version: i.version,
            description: i.description,
            system_prompt: i.system_prompt,
            tools: i
                .tools
                .into_iter()
                .map(|t| w::Tool {
                    name: t.name,
                    description: t.description,
                    parameters: t.parameters,
                })
                .collect(),
            max_turns: i.max_turns,
            sampling: w::SamplingArgs {
                temperature: i.sampling.temperature,
                top_p: i.sampling.top_p,
                top_k: i.sampling.top_k,
                max_tokens: i.sampling.max_tokens,
                stop: i.sampling.stop,
            },
            rubric: i
                .rubric
                .into_iter()
                .map(|m| w::MetricWeight {
                    name: m.name,
                    weight: m.weight,
                })
                .collect(),
            rewards: i
                .rewards
                .into_iter()
                .map(|r| w::RewardDep {
                    plugin: r.plugin,
                    version: r.version,
                })
                .collect(),
            splits: i.splits,
        }
    }
}

impl From<t::DatasetPage> for w::DatasetPage {
    fn from(p: t::DatasetPage) -> Self {
        w::DatasetPage {
            examples: p.examples.into_iter().map(Into::into).collect(),
            total: p.total,
        }
    }
}

impl From<t::EpisodeStart> for w::EpisodeStart {
    fn from(s: t::EpisodeStart) -> Self {
        w::EpisodeStart {
            messages: s.messages.into_iter().map(Into::into).collect(),
            state: s.state,
        }
    }
}

impl From<t::EnvStep> for w::EnvStep {
    fn from(s: t::EnvStep) -> Self {
        w::EnvStep {
            messages: s.messages.into_iter().map(Into::into).collect(),
            state: s.state,
            done: s.done,
        }
    }
}

impl From<w::Rollout> for t::Rollout {
    fn from(r: w::Rollout) -> Self {
        t::Rollout {
            example: r.example.into(),
            messages: r.messages.into_iter().map(Into::into).collect(),
            state: r.state,
            truncated: r.truncated,
        }
    }
}

impl From<t::Metric> for w::Metric {
    fn from(m: t::Metric) -> Self {
        w::Metric {
            name: m.name,
            value: m.value,
        }
    }
}

impl From<t::PluginError> for w::PluginError {
    fn from(e: t::PluginError) -> Self {
        match e {
            t::PluginError::InvalidArgs(m) => w::PluginError::InvalidArgs(m),
            t::PluginError::InvalidInput(m) => w::PluginError::InvalidInput(m),
            t::PluginError::UnknownSplit(m) => w::PluginError::UnknownSplit(m),
            t::PluginError::Internal(m) => w::PluginError::Internal(m),
        }
    }
}
