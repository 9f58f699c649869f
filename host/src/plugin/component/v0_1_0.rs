//! Host adapter for plugin ABI `rlhost:env@0.1.0` (`sdk/wit/v0.1.0/`). Frozen with that WIT:
//! a new ABI version gets a new module beside this one; this one is never edited to fit it.

use rlhost_sdk::types as t;
use wasmtime::component::HasSelf;

use super::GuestState;

/// Bindings of the `environment` world (also the home of the shared `types` and `host`).
pub mod env_world {
    wasmtime::component::bindgen!({
        world: "environment",
        path: "../sdk/wit/v0.1.0",
        imports: {
            "rlhost:env/host.run-python": async,
            default: tracing,
        },
        exports: { default: async },
    });
}

/// Bindings of the `reward` world.
pub mod reward_world {
    wasmtime::component::bindgen!({
        world: "reward",
        path: "../sdk/wit/v0.1.0",
        with: {
            "rlhost:env/types": super::env_world::rlhost::env::types,
            "rlhost:env/host": super::env_world::rlhost::env::host,
        },
        exports: { default: async },
    });
}

use env_world::rlhost::env::host as whost;
use env_world::rlhost::env::types as w;

/// Adds this version's host imports to a linker.
pub fn add_to_linker(linker: &mut wasmtime::component::Linker<GuestState>) -> wasmtime::Result<()> {
    whost::add_to_linker::<GuestState, HasSelf<GuestState>>(linker, |s| s)
}

/// The `env` interface an environment component exports.
pub(super) fn env(world: &env_world::Environment) -> &env_world::exports::rlhost::env::env::Guest {
    world.rlhost_env_env()
}

/// The `reward-fn` interface a reward component exports.
pub(super) fn reward_fn(
    world: &reward_world::Reward,
) -> &reward_world::exports::rlhost::env::reward_fn::Guest {
    world.rlhost_env_reward_fn()
}

impl w::Host for GuestState {}

impl whost::Host for GuestState {
    fn log(&mut self, level: whost::LogLevel, message: String) {
        let level = match level {
            whost::LogLevel::Trace => t::LogLevel::Trace,
            whost::LogLevel::Debug => t::LogLevel::Debug,
            whost::LogLevel::Info => t::LogLevel::Info,
            whost::LogLevel::Warn => t::LogLevel::Warn,
            whost::LogLevel::Error => t::LogLevel::Error,
        };
        self.host.log(level, &message);
    }

    async fn run_python(
        &mut self,
        code: String,
        limits: whost::PythonLimits,
    ) -> Result<whost::PythonOutput, String> {
        let limits = t::PythonLimits {
            timeout_ms: limits.timeout_ms,
            memory_mib: limits.memory_mib,
            max_output_bytes: limits.max_output_bytes,
        };
        let host = self.host.clone();
        let clock = self.host_clock();
        let out = {
            let _running = clock.enter();
            host.run_python(&code, limits).await
        }?;
        Ok(whost::PythonOutput {
            stdout: out.stdout,
            stderr: out.stderr,
            exit_code: out.exit_code,
            timed_out: out.timed_out,
        })
    }

    fn read_data(&mut self, path: String) -> Result<Vec<u8>, String> {
        self.host.read_data(&path)
    }

    fn rollout_seed(&mut self) -> u64 {
        self.seed
    }
}

// --- conversions between the generated types and the SDK's -------------------------------------

fn role_in(r: t::Role) -> w::Role {
    match r {
        t::Role::System => w::Role::System,
        t::Role::User => w::Role::User,
        t::Role::Assistant => w::Role::Assistant,
        t::Role::Tool => w::Role::Tool,
    }
}

fn role_out(r: w::Role) -> t::Role {
    match r {
        w::Role::System => t::Role::System,
        w::Role::User => t::Role::User,
        w::Role::Assistant => t::Role::Assistant,
        w::Role::Tool => t::Role::Tool,
    }
}

pub(super) fn message_in(m: &t::Message) -> w::Message {
    w::Message {
        role: role_in(m.role),
        content: m.content.clone(),
        tool_calls: m
            .tool_calls
            .iter()
            .map(|c| w::ToolCall {
                id: c.id.clone(),
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            })
            .collect(),
        tool_call_id: m.tool_call_id.clone(),
        reasoning: m.reasoning.clone(),
    }
}

fn message_out(m: w::Message) -> t::Message {
    t::Message {
        role: role_out(m.role),
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

fn messages_out(ms: Vec<w::Message>) -> Vec<t::Message> {
    ms.into_iter().map(message_out).collect()
}

pub(super) fn example_in(e: &t::Example) -> w::Example {
    w::Example {
        id: e.id.clone(),
        prompt: e.prompt.iter().map(message_in).collect(),
        question: e.question.clone(),
        answer: e.answer.clone(),
        info: e.info.clone(),
    }
}

fn example_out(e: w::Example) -> t::Example {
    t::Example {
        id: e.id,
        prompt: messages_out(e.prompt),
        question: e.question,
        answer: e.answer,
        info: e.info,
    }
}

pub(super) fn rollout_in(r: &t::Rollout) -> w::Rollout {
    w::Rollout {
        example: example_in(&r.example),
        messages: r.messages.iter().map(message_in).collect(),
        state: r.state.clone(),
        truncated: r.truncated,
    }
}

pub(super) fn env_info_out(i: w::EnvInfo) -> t::EnvInfo {
    t::EnvInfo {
        name: i.name,
        version: i.version,
        description: i.description,
        system_prompt: i.system_prompt,
        tools: i
            .tools
            .into_iter()
            .map(|x| t::Tool {
                name: x.name,
                description: x.description,
                parameters: x.parameters,
            })
            .collect(),
        max_turns: i.max_turns,
        sampling: t::SamplingArgs {
            temperature: i.sampling.temperature,
            top_p: i.sampling.top_p,
            top_k: i.sampling.top_k,
            max_tokens: i.sampling.max_tokens,
            stop: i.sampling.stop,
        },
        rubric: i
            .rubric
            .into_iter()
            .map(|m| t::MetricWeight {
                name: m.name,
                weight: m.weight,
            })
            .collect(),
        rewards: i
            .rewards
            .into_iter()
            .map(|r| t::RewardDep {
                plugin: r.plugin,
                version: r.version,
            })
            .collect(),
        splits: i.splits,
    }
}

pub(super) fn page_out(p: w::DatasetPage) -> t::DatasetPage {
    t::DatasetPage {
        examples: p.examples.into_iter().map(example_out).collect(),
        total: p.total,
    }
}

pub(super) fn episode_start_out(s: w::EpisodeStart) -> t::EpisodeStart {
    t::EpisodeStart {
        messages: messages_out(s.messages),
        state: s.state,
    }
}

pub(super) fn env_step_out(s: w::EnvStep) -> t::EnvStep {
    t::EnvStep {
        messages: messages_out(s.messages),
        state: s.state,
        done: s.done,
    }
}

pub(super) fn metrics_out(ms: Vec<w::Metric>) -> Vec<t::Metric> {
    ms.into_iter()
        .map(|m| t::Metric {
            name: m.name,
            value: m.value,
        })
        .collect()
}

pub(super) fn error_out(e: w::PluginError) -> t::PluginError {
    match e {
        w::PluginError::InvalidArgs(m) => t::PluginError::InvalidArgs(m),
        w::PluginError::InvalidInput(m) => t::PluginError::InvalidInput(m),
        w::PluginError::UnknownSplit(m) => t::PluginError::UnknownSplit(m),
        w::PluginError::Internal(m) => t::PluginError::Internal(m),
    }
}

pub(super) fn reward_info_out(
    i: reward_world::exports::rlhost::env::reward_fn::RewardInfo,
) -> t::RewardInfo {
    t::RewardInfo {
        name: i.name,
        version: i.version,
        description: i.description,
        metrics: i.metrics,
    }
}
