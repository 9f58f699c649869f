//! The chat pipeline, without HTTP: a request is planned ([`plan`]: tool choice, grammar,
//! template kwargs, prompt ids, sampling) and run on the [`Engine`]; its answer comes back
//! typed, whole ([`ChatOutput`], read into reasoning, content and tool calls by the configured
//! parsers) or as a stream of typed chunks ([`ChatCompletionChunk`]). Text completions
//! ([`completions`]) and token-in generation ([`generate`]) sit beside it.
//!
//! Two callers: `server/` (every HTTP dialect funnels here and only writes the answer in its
//! wire format) and the rollout loop's in-process generator, which reads [`ChatOutput`]
//! directly (token ids and log-probs as numbers: no wire objects built and thrown away). So the
//! same request gets the same answer either way.
//!
//! This module owns prompt rendering, output reading and admission to the engine. It must
//! never know about HTTP (no axum, no status lines, no server-sent-event framing): streams end
//! when their channel closes, and the `[DONE]` sentinel is the server's business.

pub mod completions;
pub mod constrain;
pub mod generate;
pub mod output;
pub mod plan;
pub mod request;
mod stream;
mod wire;

use std::sync::Arc;

use tokio::sync::{mpsc as tmpsc, oneshot};

use crate::engine::{Completion, Engine, EngineError};
use crate::model::reasoning::ReasoningParser;
use crate::model::tool_parsers::{self, ParsedCall, ToolCallParser};
use crate::openai::{ApiError, ChatCompletion, ChatCompletionChunk, ChatRequest};

pub use plan::{ChatPlan, continue_history};

/// How the pipeline presents the engine: the served name and how outputs are read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatConfig {
    /// The model name clients must use (`--served-model-name`, default the model path).
    pub served_name: String,
    /// Parse tool calls in `auto` mode (`--enable-auto-tool-choice`).
    pub enable_auto_tool_choice: bool,
    /// The tool-call wire format (`--tool-call-parser`).
    pub tool_call_parser: String,
    /// Split `<think>…</think>` into `reasoning_content` (`--reasoning-parser`; off: `None`).
    pub reasoning_parser: Option<String>,
}

/// The chat pipeline over an engine: the server's dialects and the in-process generator call
/// it, so both produce the same answers.
pub struct Pipeline {
    engine: Engine,
    cfg: ChatConfig,
    parser: Box<dyn ToolCallParser>,
    reasoning: Option<ReasoningParser>,
    created: u64,
    /// Where request grammars are compiled, off the threads that serve requests.
    grammars: constrain::GrammarPool,
}

/// An answer: whole, or a stream of typed chunks.
pub enum Reply<T, C> {
    /// A complete response.
    Full(T),
    /// The response's chunks, in order.
    Stream(Chunks<C>),
}

/// A streamed answer's chunks, in order, and whether its producer finished them: a stream cut
/// short (the producer failed midway) ends without [`Chunks::finished`] saying so.
pub struct Chunks<C> {
    rx: tmpsc::Receiver<C>,
    done: oneshot::Receiver<()>,
}

impl<C> Chunks<C> {
    /// The next chunk; `None` once the stream has ended.
    pub async fn recv(&mut self) -> Option<C> {
        self.rx.recv().await
    }

    /// After [`Chunks::recv`] gave `None`: whether the producer ended the stream itself (every
    /// chunk was sent) rather than failing midway.
    pub async fn finished(self) -> bool {
        self.done.await.is_ok()
    }
}

/// Chunks in flight between a producer and a slow reader.
const DEPTH: usize = 64;

/// A stream's channel: the sender of its chunks, the signal its producer sends once the last
/// is sent, and the [`Chunks`] a reader gets.
pub(crate) fn chunks<C>() -> (tmpsc::Sender<C>, oneshot::Sender<()>, Chunks<C>) {
    let (tx, rx) = tmpsc::channel(DEPTH);
    let (done_tx, done) = oneshot::channel();
    (tx, done_tx, Chunks { rx, done })
}

/// A chat request's answer, typed: the prompt and each sample read.
#[derive(Debug, Clone)]
pub struct ChatOutput {
    /// The prompt's token ids as the engine saw them.
    pub prompt_ids: Vec<u32>,
    /// The samples, in index order.
    pub answers: Vec<Answer>,
}

/// One sample of a chat request, read by the pipeline's parsers.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The reasoning, when a reasoning parser split it off.
    pub reasoning: Option<String>,
    /// The content: `None` when there is none to show (only calls, or only reasoning).
    pub content: Option<String>,
    /// Tool calls read from the output.
    pub calls: Vec<ParsedCall>,
    /// OpenAI's finish reason: `tool_calls` when a stopped sample made calls, else the engine's.
    pub finish_reason: &'static str,
    /// The parser's complaint when the output looked like calls but could not be read.
    pub tool_call_error: Option<String>,
    /// The engine's record: token ids, sampler log-probs, policy versions, cached tokens.
    pub completion: Completion,
}

impl Pipeline {
    /// The pipeline over `engine`; an unknown parser name is an error naming it.
    pub fn new(engine: Engine, cfg: ChatConfig) -> Result<Self, String> {
        let parser = tool_parsers::parser(&cfg.tool_call_parser)?;
        let reasoning = cfg
            .reasoning_parser
            .as_deref()
            .map(crate::model::reasoning::parser)
            .transpose()?;
        let grammars = constrain::GrammarPool::for_machine(engine.info().config.max_queue);
        Ok(Self {
            engine,
            cfg,
            parser,
            reasoning,
            created: now(),
            grammars,
        })
    }

    /// The engine behind the pipeline.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The served model name.
    pub fn served_name(&self) -> &str {
        &self.cfg.served_name
    }

    /// When the pipeline started (Unix seconds): the served model's `created`.
    pub fn created(&self) -> u64 {
        self.created
    }

    /// A chat completion, whole or streamed as `req.params.stream` asks; `prompt`, when given,
    /// is the prompt's token ids, used instead of the rendering of the messages (prime-rl's
    /// `/v1/chat/completions/tokens`).
    pub async fn chat(
        self: &Arc<Self>,
        req: &ChatRequest,
        prompt: Option<&[u32]>,
    ) -> Result<Reply<ChatCompletion, ChatCompletionChunk>, ApiError> {
        let plan = self.plan(req, prompt).await?;
        let rx = self.submit(&plan)?;
        if req.params.stream {
            return Ok(Reply::Stream(stream::chat(self.clone(), rx, plan)));
        }
        let out = self.collect(plan.prompt_ids.clone(), rx, &plan).await?;
        Ok(Reply::Full(wire::chat_completion(self, &plan, out)))
    }

    /// A chat request's answer, typed ([`ChatOutput`]): what the in-process generator reads.
    /// A streaming request is refused (`stream`): the answer is whole.
    pub async fn answer(&self, req: &ChatRequest) -> Result<ChatOutput, ApiError> {
        if req.params.stream {
            return Err(bad(
                "stream",
                "a typed answer is whole: stream must be false",
            ));
        }
        let plan = self.plan(req, None).await?;
        let rx = self.submit(&plan)?;
        self.collect(plan.prompt_ids.clone(), rx, &plan).await
    }

    /// Admits `plan` to the engine.
    fn submit(
        &self,
        plan: &ChatPlan,
    ) -> Result<tmpsc::UnboundedReceiver<crate::engine::Event>, ApiError> {
        self.engine
            .submit_to(
                plan.adapter.as_deref(),
                plan.prompt_ids.clone(),
                plan.params.clone(),
                plan.n,
            )
            .map_err(|e| engine_error(e, "messages"))
    }

    /// Waits for every sample and reads each into an [`Answer`].
    async fn collect(
        &self,
        prompt_ids: Vec<u32>,
        mut rx: tmpsc::UnboundedReceiver<crate::engine::Event>,
        plan: &ChatPlan,
    ) -> Result<ChatOutput, ApiError> {
        let done = crate::engine::collect(&mut rx, plan.n, prompt_ids.len())
            .await
            .map_err(|e| engine_error(e, "messages"))?;
        grammar_failure(&done)?;
        let answers = done.into_iter().map(|c| self.read(plan, c)).collect();
        Ok(ChatOutput {
            prompt_ids,
            answers,
        })
    }

    /// A finished sample read: content, calls, the finish reason and the parser's complaint.
    fn read(&self, plan: &ChatPlan, c: Completion) -> Answer {
        let view = plan.reader(self).read(&c.text, true);
        let finish_reason = match c.finish_reason {
            crate::engine::FinishReason::Stop if !view.calls.is_empty() => "tool_calls",
            other => other.as_str(),
        };
        // With calls, empty content is no content (as the parsers say); without, the text as is.
        let content = if view.calls.is_empty() {
            (!(view.content.is_empty() && view.reasoning.is_some())).then_some(view.content)
        } else {
            (!view.content.is_empty()).then_some(view.content)
        };
        Answer {
            reasoning: view.reasoning,
            content,
            calls: view.calls,
            finish_reason,
            tool_call_error: view.error,
            completion: c,
        }
    }

    /// The newest policy version among finished samples (the engine's current one if none says).
    fn policy_version(&self, done: &[&Completion]) -> u64 {
        done.iter()
            .filter_map(|c| c.versions.last().copied())
            .max()
            .unwrap_or(self.engine.info().version())
    }

    /// The adapter a request's `model` picks (`None`: the base model, also when `model` is
    /// absent or empty). A model this server does not serve gets vLLM's 404 (`NotFoundError`,
    /// `param` `model`); the message adds the names that are served.
    pub fn check_model(&self, model: &Option<String>) -> Result<Option<String>, ApiError> {
        let info = self.engine.info();
        match model {
            Some(m) if !m.is_empty() && *m != self.cfg.served_name => {
                if info.adapter(m).is_some() {
                    return Ok(Some(m.clone()));
                }
                let names: Vec<String> = std::iter::once(self.cfg.served_name.clone())
                    .chain(info.adapters().into_iter().map(|a| a.name))
                    .collect();
                Err(ApiError {
                    status: 404,
                    kind: "NotFoundError",
                    message: format!(
                        "The model `{m}` does not exist. Valid aliases: {}.",
                        names.join(", ")
                    ),
                    param: Some("model".into()),
                })
            }
            _ => Ok(None),
        }
    }

    /// The name a response reports: the adapter's, else the served model's.
    pub fn model_name(&self, adapter: &Option<String>) -> String {
        adapter
            .clone()
            .unwrap_or_else(|| self.cfg.served_name.clone())
    }
}

/// A request whose grammar failed in some sample is a 500 naming the grammar's complaint (a
/// streamed one ends that choice with `finish_reason: "error"` instead).
fn grammar_failure(done: &[Completion]) -> Result<(), ApiError> {
    match done
        .iter()
        .find(|c| c.finish_reason == crate::engine::FinishReason::Error)
    {
        Some(c) => Err(ApiError {
            status: 500,
            kind: "internal_error",
            message: format!(
                "sample {}: {}",
                c.index,
                c.error
                    .as_deref()
                    .unwrap_or("grammar-constrained decoding failed")
            ),
            param: None,
        }),
        None => Ok(()),
    }
}

/// An engine refusal as the API's error: a bad request names `param`; a full queue or a
/// stopped engine is a 503; a model failure a 500.
pub fn engine_error(e: EngineError, param: &str) -> ApiError {
    match e {
        EngineError::Invalid(m) => ApiError::bad(Some(param.to_string()), m),
        EngineError::NoAdapter(_) => ApiError {
            status: 404,
            kind: "NotFoundError",
            message: e.to_string(),
            param: Some("model".into()),
        },
        EngineError::Overloaded(_) => ApiError {
            status: 503,
            kind: "overloaded_error",
            message: e.to_string(),
            param: None,
        },
        EngineError::Stopped => ApiError {
            status: 503,
            kind: "service_unavailable_error",
            message: e.to_string(),
            param: None,
        },
        // libtorch's text (C++ frames, source paths) is logged, not sent.
        EngineError::Model(m) => ApiError {
            status: 500,
            kind: "internal_error",
            message: m.client_message("serving the request"),
            param: None,
        },
    }
}

/// A random id: `prefix`, `separator`, 26 hex digits. The OpenAI chat dialect writes
/// `chatcmpl-…`; the Responses and Messages dialects `resp_…`, `msg_…`.
pub fn random_id(prefix: &str, separator: char) -> String {
    let mut rng = crate::engine::Rng::from_entropy();
    let a = (rng.uniform() * 2f64.powi(52)) as u64;
    let b = (rng.uniform() * 2f64.powi(52)) as u64;
    format!("{prefix}{separator}{a:013x}{b:013x}")
}

/// A 400 naming the request field at fault, in every dialect's error shape.
pub fn bad(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad(Some(param.to_string()), message)
}

/// Now, in Unix seconds.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub use crate::engine::panic_message;
