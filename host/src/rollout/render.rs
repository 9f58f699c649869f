//! Client-side rendering: a chat turn becomes token ids in this process — the trained model's
//! own chat template and tokenizer, the conversation's earlier turns as the model produced them
//! (`history_token_ids`) — and the server only generates from those ids (`POST
//! /v1/completions` with a token-id prompt, which every vLLM, SGLang and rlhost server serves).
//! The output text is read back into a chat message by the same tool-call parser the rlhost
//! server runs.
//!
//! This is how multi-turn rollouts stay one growing token stream on servers that do not know
//! rlhost's `history_token_ids`: a re-render by the server's template rewrites earlier turns
//! (Qwen3 drops reasoning, tool calls re-serialise, text re-tokenises), so the tokens trained on
//! would not be the tokens sampled.

use std::path::Path;
use std::sync::Arc;

use crate::chat::output::Reader;
use crate::chat::request;
use crate::model::tool_parsers::{self, ToolCallParser};
use crate::model::{ChatTemplate, Tokenizer};
use crate::openai::{
    ChatChoice, ChatCompletion, ChatLogprobs, ChatRequest, CompletionRequest, Prompt,
    ResponseHeader, ResponseMessage, TextCompletion, TokenLogprob, ToolCall, ToolChoiceParam,
    Usage,
};

/// Why a turn could not be rendered or read back.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The model folder lacks a tokenizer or a chat template.
    #[error("client-side rendering needs the model's tokenizer and chat template: {0}")]
    Model(#[source] crate::model::ModelError),
    /// An unknown tool-call parser.
    #[error("orchestrator.client.tool_call_parser: {0}")]
    Parser(String),
    /// The request cannot be rendered here.
    #[error("rendering the turn: {0}")]
    Request(#[source] crate::openai::ApiError),
    /// The request asks for something client-side rendering does not do.
    #[error("client-side rendering {0}")]
    Unsupported(&'static str),
    /// The server's text completion is not what was asked for.
    #[error("the server's completion {0}")]
    Response(String),
}

/// The trained model's template, tokenizer and tool-call parser.
pub struct ClientRender {
    tokenizer: Arc<Tokenizer>,
    template: ChatTemplate,
    parser: Box<dyn ToolCallParser>,
}

impl ClientRender {
    /// The renderer of the model in `dir`, reading calls in the `tool_call_parser` format.
    pub fn load(dir: &Path, tool_call_parser: &str) -> Result<Self, RenderError> {
        Ok(Self {
            tokenizer: Arc::new(Tokenizer::load(dir).map_err(RenderError::Model)?),
            template: ChatTemplate::load(dir).map_err(RenderError::Model)?,
            parser: tool_parsers::parser(tool_call_parser).map_err(RenderError::Parser)?,
        })
    }

    /// The prompt ids of `req`: the template's rendering of its messages, or, with
    /// `history_token_ids`, those ids and the rendering of the messages after the last assistant
    /// message (as rlhost's server builds it).
    pub fn prompt(&self, req: &ChatRequest) -> Result<Vec<u32>, RenderError> {
        if req
            .tool_choice
            .as_ref()
            .is_some_and(|c| *c != ToolChoiceParam::Mode("auto".into()))
        {
            return Err(RenderError::Unsupported(
                "reads tool calls the model chose to make (tool_choice auto)",
            ));
        }
        if req.params.n.is_some_and(|n| n != 1) || req.params.stream {
            return Err(RenderError::Unsupported(
                "generates one whole sample per request",
            ));
        }
        let messages = request::template_messages(&req.messages).map_err(RenderError::Request)?;
        let (tools, _) = request::tools(req.tools.as_deref()).map_err(RenderError::Request)?;
        let kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
        match &req.history_token_ids {
            Some(history) => crate::chat::continue_history(
                &self.tokenizer,
                &self.template,
                history,
                &messages,
                tools.as_ref(),
                &kwargs,
            )
            .map_err(RenderError::Request),
            None => {
                let text = self
                    .template
                    .render(
                        &messages,
                        tools.as_ref(),
                        req.add_generation_prompt.unwrap_or(true),
                        &kwargs,
                    )
                    .map_err(RenderError::Model)?;
                self.tokenizer.encode(&text).map_err(RenderError::Model)
            }
        }
    }

    /// The text-completion request that generates `req`'s turn from the prompt `ids`: the same
    /// sampling, token ids and log-probs asked for.
    pub fn completion_request(&self, req: &ChatRequest, ids: Vec<u32>) -> CompletionRequest {
        let mut params = req.params.clone();
        params.return_token_ids = true;
        CompletionRequest {
            prompt: Some(Prompt::Ids(ids)),
            params,
            logprobs: Some(0),
            ..Default::default()
        }
    }

    /// The chat completion the server's text completion `c` of prompt `ids` stands for: the
    /// text read into content and tool calls, the token ids and log-probs as generated.
    pub fn chat_completion(
        &self,
        req: &ChatRequest,
        ids: Vec<u32>,
        c: TextCompletion,
    ) -> Result<ChatCompletion, RenderError> {
        let choice = c
            .choices
            .into_iter()
            .next()
            .ok_or_else(|| RenderError::Response("has no choices".into()))?;
        let token_ids = choice
            .token_ids
            .ok_or_else(|| RenderError::Response("lacks choices[0].token_ids".into()))?;
        let logprobs = choice
            .logprobs
            .ok_or_else(|| RenderError::Response("lacks choices[0].logprobs".into()))?;
        if logprobs.token_logprobs.len() != token_ids.len() {
            return Err(RenderError::Response(format!(
                "has {} token ids but {} log-probs",
                token_ids.len(),
                logprobs.token_logprobs.len()
            )));
        }
        if let Some(p) = &choice.prompt_token_ids
            && *p != ids
        {
            return Err(RenderError::Response(
                "answers a different prompt than the token ids sent".into(),
            ));
        }
        let (_, tools) = request::tools(req.tools.as_deref()).map_err(RenderError::Request)?;
        let reader = Reader {
            parser: self.parser.as_ref(),
            reasoning: None,
            opened: false,
            parse: !tools.is_empty(),
            single: false,
            tools: &tools,
        };
        let view = reader.read(&choice.text, true);
        let calls: Vec<ToolCall> = view
            .calls
            .iter()
            .enumerate()
            .map(|(i, call)| {
                ToolCall::function(
                    &format!("call_{}_{i}", c.header.id),
                    &call.name,
                    &call.arguments,
                )
            })
            .collect();
        let finish_reason = if !calls.is_empty() && choice.finish_reason == "stop" {
            "tool_calls".to_string()
        } else {
            choice.finish_reason
        };
        let content = (calls.is_empty() || !view.content.is_empty()).then_some(view.content);
        let usage = c
            .usage
            .unwrap_or_else(|| Usage::new(ids.len() as u64, token_ids.len() as u64, 0));
        let content_logprobs = token_ids
            .iter()
            .zip(&logprobs.token_logprobs)
            .map(|(&id, &lp)| TokenLogprob {
                token: format!("token_id:{id}"),
                logprob: lp,
                bytes: None,
                top_logprobs: Vec::new(),
            })
            .collect();
        Ok(ChatCompletion {
            header: ResponseHeader {
                object: "chat.completion".into(),
                ..c.header
            },
            choices: vec![ChatChoice {
                index: 0,
                message: ResponseMessage {
                    role: "assistant".into(),
                    content,
                    tool_calls: calls,
                    reasoning_content: None,
                },
                logprobs: Some(ChatLogprobs {
                    content: content_logprobs,
                }),
                finish_reason,
                stop_reason: choice.stop_reason,
                policy_version: choice.policy_version,
                tool_call_error: view.error,
                token_ids: Some(token_ids),
            }],
            usage: Some(usage),
            policy_version: c.policy_version,
            prompt_token_ids: Some(ids),
        })
    }
}
