//! What rlhost's math environments (`math-python`, `math500`, `aime2024`, `aime2025`,
//! `deepscaler`, `arith`) share, so each plugin is a short [`Spec`]:
//!
//! - verifiers' `python` tool contract ([`tool`]), fresh interpreter per call by default;
//! - scoring with [`rlhost_math_verify`] under either answer convention (`seed`: verifiers'
//!   `math_python`, bare answers; or verifiers' `MathRubric`), on the first `\boxed{}` of the last
//!   assistant message (verifiers' `extract_boxed_answer`: the whole message when there is none);
//! - the rubric metrics of verifiers' `math_python`: `correct`, `num_turns` (assistant messages),
//!   `num_tool_calls` (tool messages), `num_errors` (tool messages containing "error", any case);
//! - environment arguments, validated, carried in the episode state.

pub mod tool;

use rlhost_math_verify::{Convention, check, first_boxed};
use rlhost_sdk::prelude::*;
use rlhost_sdk::schema::tool as tool_schema;
use serde::{Deserialize, Serialize};

/// verifiers' `BOXED_SYSTEM_PROMPT`, the standard single-turn math instruction.
pub const BOXED_SYSTEM_PROMPT: &str =
    "Please reason step by step, and put your final answer within \\boxed{}.";

/// One math environment.
pub struct Spec {
    /// Plugin name.
    pub name: &'static str,
    /// One line for humans.
    pub description: &'static str,
    /// Dataset splits and the data file each is read from (in the plugin's `/data`).
    pub splits: &'static [(&'static str, &'static str)],
    /// The default system prompt.
    pub system_prompt: &'static str,
    /// Named alternative system prompts (`{"prompt": "<name>"}`).
    pub prompts: &'static [(&'static str, &'static str)],
    /// The system prompt when the tool is turned off and no prompt was chosen (else the
    /// default prompt is kept).
    pub no_tools_prompt: Option<&'static str>,
    /// The python tool is on by default.
    pub tools: bool,
    /// Default maximum assistant turns when the tool is on (1 without tools).
    pub max_turns: u32,
    /// Default answer convention.
    pub convention: Convention,
    /// Weight of `num_errors` in the reward (verifiers' `math_python`: −0.1).
    pub error_weight: f64,
}

/// Environment arguments (`-a '{"max_turns": 5}'`); unknown keys are refused.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Args {
    /// Maximum assistant turns.
    pub max_turns: Option<u32>,
    /// Score only what follows the last `</think>` of the answer (ThinkParser).
    pub use_think: bool,
    /// `"python"` or `"none"`.
    pub tools: Option<String>,
    /// `"fresh"` (default: variables do not persist) or `"persistent"` (one session per rollout).
    pub python_state: Option<String>,
    /// `"seed"` or `"math-rubric"`.
    pub answer_convention: Option<String>,
    /// A named system prompt of this environment.
    pub prompt: Option<String>,
    /// A system prompt of your own (wins over `prompt`).
    pub system_prompt: Option<String>,
}

/// Arguments resolved against the spec; kept in the episode state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resolved {
    /// Maximum assistant turns.
    pub max_turns: u32,
    /// Think parsing.
    pub use_think: bool,
    /// The python tool is offered.
    pub tools: bool,
    /// Variables persist across calls in a rollout.
    pub persistent: bool,
    /// `true` for the `seed` convention (verifiers' `math_python`), `false` for MathRubric.
    pub seed_convention: bool,
    /// The system prompt used.
    pub system_prompt: String,
}

/// The episode state. Besides the plugin's own fields it carries the two per-episode
/// narrowings the host honours (see the SDK guide, "Per-episode tools and turns"):
/// `max_turns` and `tools`, the names of the `info().tools` offered in this episode.
#[derive(Debug, Serialize, Deserialize)]
struct State {
    max_turns: u32,
    tools: Vec<String>,
    args: Resolved,
    turns: u32,
    /// Cells run so far (replayed in persistent sessions).
    #[serde(default)]
    cells: Vec<String>,
}

fn invalid(msg: impl Into<String>) -> PluginError {
    PluginError::InvalidArgs(msg.into())
}

impl Spec {
    /// Resolves JSON environment arguments.
    pub fn resolve(&self, env_args: &str) -> Result<Resolved, PluginError> {
        let text = if env_args.trim().is_empty() {
            "{}"
        } else {
            env_args
        };
        let a: Args = serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let tools = match a.tools.as_deref() {
            None => self.tools,
            Some("python") => true,
            Some("none") => false,
            Some(other) => {
                return Err(invalid(format!(
                    "tools: unknown value {other:?} (expected \"python\" or \"none\")"
                )));
            }
        };
        let persistent = match a.python_state.as_deref() {
            None | Some("fresh") => false,
            Some("persistent") => true,
            Some(other) => {
                return Err(invalid(format!(
                    "python_state: unknown value {other:?} (expected \"fresh\" or \"persistent\")"
                )));
            }
        };
        let convention = match a.answer_convention.as_deref() {
            None => self.convention,
            Some(c) => c
                .parse::<Convention>()
                .map_err(|e| invalid(format!("answer_convention: {e}")))?,
        };
        let default_turns = if tools { self.max_turns } else { 1 };
        let max_turns = a.max_turns.unwrap_or(default_turns);
        if max_turns == 0 || max_turns > 100 {
            return Err(invalid(format!("max_turns: {max_turns} is not in 1..=100")));
        }
        let system_prompt = match (a.system_prompt, a.prompt.as_deref()) {
            (Some(p), _) => p,
            (None, None) => match self.no_tools_prompt.filter(|_| !tools) {
                Some(p) => p.to_string(),
                None => self.system_prompt.to_string(),
            },
            (None, Some("seed" | "default")) => self.system_prompt.to_string(),
            (None, Some(name)) => self
                .prompts
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, p)| p.to_string())
                .ok_or_else(|| {
                    let known: Vec<&str> = self.prompts.iter().map(|(n, _)| *n).collect();
                    invalid(format!(
                        "prompt: unknown prompt {name:?} (known: default, {})",
                        known.join(", ")
                    ))
                })?,
        };
        Ok(Resolved {
            max_turns,
            use_think: a.use_think,
            tools,
            persistent,
            seed_convention: convention == Convention::Seed,
            system_prompt,
        })
    }

    /// The environment's description for the host.
    pub fn info(&self, version: &str) -> EnvInfo {
        EnvInfo {
            name: self.name.into(),
            version: version.into(),
            description: self.description.into(),
            system_prompt: Some(self.system_prompt.into()),
            // Every tool the environment can offer; an episode narrows this in its state.
            tools: vec![python_tool()],
            max_turns: if self.tools { self.max_turns } else { 1 },
            sampling: SamplingArgs::default(),
            rubric: Rubric::new()
                .metric("correct", 1.0)
                .metric("num_turns", 0.0)
                .metric("num_tool_calls", 0.0)
                .metric("num_errors", self.error_weight)
                .metric("verify_timeout", 0.0)
                .build(),
            rewards: vec![],
            splits: self.splits.iter().map(|(s, _)| s.to_string()).collect(),
        }
    }

    /// Rows of a split.
    pub fn dataset(
        &self,
        split: &str,
        offset: u64,
        limit: u32,
    ) -> Result<DatasetPage, PluginError> {
        let file = self
            .splits
            .iter()
            .find(|(s, _)| *s == split)
            .map(|(_, f)| *f)
            .ok_or_else(|| PluginError::UnknownSplit(split.into()))?;
        let rows = rlhost_sdk::dataset::load_jsonl(file)?;
        Ok(rlhost_sdk::dataset::page(&rows, offset, limit))
    }

    /// The first prompt: the system prompt and the question.
    pub fn initial_prompt(
        &self,
        example: Example,
        env_args: &str,
    ) -> Result<EpisodeStart, PluginError> {
        let args = self.resolve(env_args)?;
        let mut messages = vec![];
        if !args.system_prompt.is_empty() {
            messages.push(system(args.system_prompt.clone()));
        }
        if example.prompt.is_empty() {
            messages.push(user(example.question));
        } else {
            messages.extend(example.prompt);
        }
        let state = State {
            max_turns: args.max_turns,
            tools: if args.tools {
                vec!["python".into()]
            } else {
                vec![]
            },
            args,
            turns: 0,
            cells: vec![],
        };
        Ok(EpisodeStart {
            messages,
            state: serde_json::to_string(&state).expect("state serialises"),
        })
    }

    /// Runs the tool calls of the last assistant message.
    pub fn env_response(
        &self,
        conversation: Vec<Message>,
        state: String,
    ) -> Result<EnvStep, PluginError> {
        let mut st: State = serde_json::from_str(&state)
            .map_err(|e| PluginError::InvalidInput(format!("state: {e}")))?;
        st.turns += 1;
        let last = rlhost_sdk::messages::last_assistant(&conversation)
            .ok_or_else(|| PluginError::InvalidInput("no assistant message".into()))?;
        let mut replies = vec![];
        if st.args.tools && !last.tool_calls.is_empty() && st.turns < st.args.max_turns {
            for call in &last.tool_calls {
                let text = match call.name.as_str() {
                    "python" => match python_code(&call.arguments) {
                        Ok(code) => {
                            let prior = if st.args.persistent {
                                st.cells.clone()
                            } else {
                                vec![]
                            };
                            let out = tool::run(&code, &prior);
                            st.cells.push(code);
                            out
                        }
                        Err(e) => e,
                    },
                    other => format!("Error: unknown tool {other:?} (available: python)"),
                };
                replies.push(tool_result(call.id.clone(), text));
            }
        }
        let done = replies.is_empty();
        Ok(EnvStep {
            messages: replies,
            state: serde_json::to_string(&st).expect("state serialises"),
            done,
        })
    }

    /// The rubric's metrics for a finished rollout.
    pub fn score(&self, rollout: Rollout) -> Result<Vec<Metric>, PluginError> {
        let args = match serde_json::from_str::<State>(&rollout.state) {
            Ok(st) => st.args,
            Err(_) => self.resolve("{}")?,
        };
        let answer = rlhost_sdk::messages::last_assistant(&rollout.messages)
            .map(|m| answer_text(&m.content, args.use_think))
            .unwrap_or_default();
        let convention = if args.seed_convention {
            Convention::Seed
        } else {
            Convention::MathRubric
        };
        let verdict = match answer {
            Some(text) if !text.is_empty() => {
                check(convention, first_boxed(text), &rollout.example.answer)
            }
            _ => rlhost_math_verify::Verdict {
                correct: false,
                timed_out: false,
            },
        };
        Ok(conversation_metrics(
            &rollout.messages,
            verdict.correct,
            verdict.timed_out,
        ))
    }
}

/// The metrics of a conversation, as verifiers' `math_python` rubric counts them.
pub fn conversation_metrics(messages: &[Message], correct: bool, timed_out: bool) -> Vec<Metric> {
    let assistant = messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .count();
    let tools: Vec<&Message> = messages.iter().filter(|m| m.role == Role::Tool).collect();
    let errors = tools
        .iter()
        .filter(|m| m.content.to_lowercase().contains("error"))
        .count();
    vec![
        flag("correct", correct),
        metric("num_turns", assistant as f64),
        metric("num_tool_calls", tools.len() as f64),
        metric("num_errors", errors as f64),
        flag("verify_timeout", timed_out),
    ]
}

/// The text the answer is read from: the message, or with think parsing only what follows its
/// last `</think>` (nothing when there is none).
pub fn answer_text(content: &str, use_think: bool) -> Option<&str> {
    if !use_think {
        return Some(content);
    }
    content
        .rfind("</think>")
        .map(|i| content[i + "</think>".len()..].trim())
}

/// Arguments of the python tool.
#[derive(Deserialize, rlhost_sdk::schemars::JsonSchema)]
#[schemars(crate = "rlhost_sdk::schemars")]
pub struct PythonArgs {
    /// A block of Python code
    pub code: String,
}

/// The `python` tool as offered to the model.
pub fn python_tool() -> Tool {
    tool_schema::<PythonArgs>("python", tool::DESCRIPTION)
}

fn python_code(arguments: &str) -> Result<String, String> {
    match rlhost_sdk::schema::parse_args::<PythonArgs>("python", arguments) {
        Ok(a) => Ok(a.code),
        Err(PluginError::InvalidInput(msg)) => Err(format!("Error: {msg}")),
        Err(other) => Err(format!("Error: {other}")),
    }
}

/// Implements [`Environment`](rlhost_sdk::Environment) for `$ty` from a `Spec` and exports it.
#[macro_export]
macro_rules! math_environment {
    ($ty:ident, $spec:expr) => {
        struct $ty;
        impl ::rlhost_sdk::Environment for $ty {
            fn info() -> ::rlhost_sdk::types::EnvInfo {
                $spec.info(env!("CARGO_PKG_VERSION"))
            }
            fn dataset(
                split: &str,
                offset: u64,
                limit: u32,
            ) -> Result<::rlhost_sdk::types::DatasetPage, ::rlhost_sdk::types::PluginError> {
                $spec.dataset(split, offset, limit)
            }
            fn initial_prompt(
                example: ::rlhost_sdk::types::Example,
                env_args: &str,
            ) -> Result<::rlhost_sdk::types::EpisodeStart, ::rlhost_sdk::types::PluginError> {
                $spec.initial_prompt(example, env_args)
            }
            fn env_response(
                conversation: Vec<::rlhost_sdk::types::Message>,
                state: String,
            ) -> Result<::rlhost_sdk::types::EnvStep, ::rlhost_sdk::types::PluginError> {
                $spec.env_response(conversation, state)
            }
            fn score(
                rollout: ::rlhost_sdk::types::Rollout,
            ) -> Result<Vec<::rlhost_sdk::types::Metric>, ::rlhost_sdk::types::PluginError> {
                $spec.score(rollout)
            }
        }
        ::rlhost_sdk::export_environment!($ty);
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: Spec = Spec {
        name: "t",
        description: "",
        splits: &[("test", "test.jsonl")],
        system_prompt: "P",
        prompts: &[("other", "Q")],
        no_tools_prompt: None,
        tools: true,
        max_turns: 3,
        convention: Convention::Seed,
        error_weight: -0.1,
    };

    #[test]
    fn arguments_resolve_and_refuse_nonsense() {
        let r = SPEC.resolve("{}").unwrap();
        assert_eq!(
            (r.max_turns, r.tools, r.persistent, r.seed_convention),
            (3, true, false, true)
        );
        let r = SPEC
            .resolve(r#"{"tools":"none","answer_convention":"math-rubric","prompt":"other"}"#)
            .unwrap();
        assert_eq!(
            (
                r.max_turns,
                r.tools,
                r.seed_convention,
                r.system_prompt.as_str()
            ),
            (1, false, false, "Q")
        );
        for bad in [
            r#"{"max_turns":0}"#,
            r#"{"tools":"bash"}"#,
            r#"{"nope":1}"#,
            r#"{"prompt":"x"}"#,
        ] {
            assert!(
                matches!(SPEC.resolve(bad), Err(PluginError::InvalidArgs(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn metrics_count_turns_tools_and_errors() {
        let msgs = vec![
            user("q"),
            assistant("a"),
            tool_result("1", "Traceback ... NameError"),
            tool_result("2", "ERROR: x"),
            tool_result("3", "4"),
            assistant("\\boxed{4}"),
        ];
        let m = conversation_metrics(&msgs, true, false);
        let get = |n: &str| m.iter().find(|x| x.name == n).unwrap().value;
        assert_eq!(
            (
                get("correct"),
                get("num_turns"),
                get("num_tool_calls"),
                get("num_errors")
            ),
            (1.0, 2.0, 3.0, 2.0),
            "NameError counts: it contains \"error\""
        );
    }

    #[test]
    fn bad_tool_arguments_become_an_error_message() {
        assert_eq!(python_code(r#"{"code": "1+1"}"#).unwrap(), "1+1");
        let e = python_code("{code: 1}").unwrap_err();
        assert!(
            e.starts_with("Error: invalid arguments for `python`"),
            "{e}"
        );
    }

    #[test]
    fn think_parsing_reads_after_the_last_think() {
        assert_eq!(
            answer_text("<think>x</think> \\boxed{2}", true),
            Some("\\boxed{2}")
        );
        assert_eq!(answer_text("\\boxed{2}", true), None);
        assert_eq!(answer_text("\\boxed{2}", false), Some("\\boxed{2}"));
    }
}
