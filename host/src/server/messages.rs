//! `POST /v1/messages`: Anthropic's Messages API over the chat completions pipeline, as
//! `/v1/responses` is ([`super::responses`]): a request becomes a [`ChatRequest`] (the system
//! prompt and messages as chat messages, `tool_use` blocks as tool calls, `tool_result` blocks
//! as tool messages, client tools as function tools) served by [`Api::chat`], and the chat
//! answer becomes thinking, text and `tool_use` blocks; a stream is built from the chat stream's
//! chunks.
//!
//! This module must never render prompts or parse model output itself. Errors keep the server's
//! one error shape (OpenAI's, with `param`), which Anthropic's clients read as API errors.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::routing::{MethodRouter, post};
use serde_json::Value;
use tokio::sync::mpsc as tmpsc;

use super::responses::{CallDeltaRead, ChunkRead, bad, new_id, sse};
use super::{Api, Reply, error};
use crate::openai::messages::{
    AnthropicContent, AnthropicUsage, BlockDelta, MessageDelta, MessagesEvent, MessagesRequest,
    MessagesResponse, ResponseBlock, StreamError,
};
use crate::openai::{
    self, ApiError, ChatMessage, ChatRequest, FunctionDef, FunctionName, GenerationParams,
    NamedToolChoice, Role, Stop, StreamOptions, ToolCall, ToolChoiceParam, ToolDef, Usage,
};

/// The `POST /v1/messages` route.
pub fn route() -> MethodRouter<Arc<Api>> {
    post(|State(api): State<Arc<Api>>, body: Bytes| async move {
        match create(api, &body).await {
            Ok(r) => r,
            Err(e) => error(e),
        }
    })
}

/// What a request becomes.
struct Plan {
    chat: ChatRequest,
    /// `disable_parallel_tool_use`: keep only the first tool use.
    one_call: bool,
    stop_sequences: Vec<String>,
    model: String,
}

async fn create(api: Arc<Api>, body: &[u8]) -> Result<HttpResponse, ApiError> {
    let req: MessagesRequest = openai::parse(body)?;
    let plan = plan(&api, &req)?;
    match api.chat(&plan.chat).await.map_err(rename_param)? {
        Reply::Full(done) => {
            let choice = done.choices.into_iter().next().ok_or_else(|| ApiError {
                status: 500,
                kind: "internal_error",
                message: "the chat pipeline returned no choice".into(),
                param: None,
            })?;
            if choice.finish_reason == "abort" {
                return Err(aborted());
            }
            let m = choice.message;
            let mut calls = m.tool_calls;
            if plan.one_call {
                calls.truncate(1);
            }
            let answer = Answer {
                thinking: m.reasoning_content.unwrap_or_default(),
                text: m.content.unwrap_or_default(),
                calls,
            };
            let (stop_reason, stop_sequence) = stop(
                &api,
                &plan,
                &choice.finish_reason,
                choice.token_ids.as_deref().unwrap_or_default(),
            );
            let usage = done.usage.unwrap_or_default();
            Ok(axum::Json(MessagesResponse {
                id: new_id("msg"),
                kind: "message".into(),
                role: "assistant".into(),
                model: plan.model.clone(),
                content: answer.blocks(),
                stop_reason: Some(stop_reason),
                stop_sequence,
                usage: anthropic_usage(&usage),
            })
            .into_response())
        }
        Reply::Stream(chunks) => Ok(sse(stream(api, plan, chunks))),
    }
}

fn aborted() -> ApiError {
    ApiError {
        status: 503,
        kind: "service_unavailable_error",
        message: "the server stopped before the message was finished".into(),
        param: None,
    }
}

/// Chat-side parameter names as this endpoint calls them.
fn rename_param(mut e: ApiError) -> ApiError {
    if let Some(p) = e.param.take() {
        e.param = Some(if p == "max_completion_tokens" {
            "max_tokens".to_string()
        } else if p == "stop" {
            "stop_sequences".to_string()
        } else if p.starts_with("tools[") {
            p.replacen(".function.parameters", ".input_schema", 1)
                .replacen(".function.", ".", 1)
        } else {
            p
        });
    }
    e
}

fn anthropic_usage(u: &Usage) -> AnthropicUsage {
    let cached = u.cached_tokens();
    AnthropicUsage {
        input_tokens: u.prompt_tokens.saturating_sub(cached),
        output_tokens: u.completion_tokens,
        cache_read_input_tokens: Some(cached),
        cache_creation_input_tokens: Some(0),
    }
}

/// `stop_reason` and `stop_sequence` for a chat finish reason. A stop string's text is not in
/// the answer, so which one ended generation is read from the generated tokens: the first to
/// appear in their text (none appears earlier, or generation would have stopped there).
fn stop(api: &Api, plan: &Plan, finish: &str, ids: &[u32]) -> (String, Option<String>) {
    match finish {
        "length" => ("max_tokens".into(), None),
        "tool_calls" => ("tool_use".into(), None),
        _ if plan.stop_sequences.is_empty() => ("end_turn".into(), None),
        _ => {
            let text = api
                .engine()
                .info()
                .tokenizer
                .decode(ids, true)
                .unwrap_or_default();
            let hit = plan
                .stop_sequences
                .iter()
                .filter_map(|s| text.find(s.as_str()).map(|at| (at + s.len(), s)))
                .min_by_key(|(end, _)| *end)
                .map(|(_, s)| s.clone());
            match hit {
                Some(s) => ("stop_sequence".into(), Some(s)),
                None => ("end_turn".into(), None),
            }
        }
    }
}

fn plan(api: &Api, req: &MessagesRequest) -> Result<Plan, ApiError> {
    for (name, v) in [
        ("container", &req.container),
        ("mcp_servers", &req.mcp_servers),
        ("context_management", &req.context_management),
        ("output_config", &req.output_config),
        ("inference_geo", &req.inference_geo),
        ("diagnostics", &req.diagnostics),
    ] {
        if v.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(bad(name, format!("{name} is not supported by this server")));
        }
    }
    if let Some(s) = req.speed.as_deref().filter(|s| *s != "standard") {
        return Err(bad(
            "speed",
            format!("speed {s:?} is not supported (only \"standard\")"),
        ));
    }
    if let Some(t) = req
        .service_tier
        .as_deref()
        .filter(|t| !matches!(*t, "auto" | "standard_only"))
    {
        return Err(bad(
            "service_tier",
            format!("service_tier {t:?} is not supported (use \"auto\" or \"standard_only\")"),
        ));
    }
    let max_tokens = match req.max_tokens {
        None => {
            return Err(bad("max_tokens", "max_tokens is required"));
        }
        Some(m) if m < 1 => {
            return Err(bad(
                "max_tokens",
                format!("max_tokens must be at least 1, got {m}"),
            ));
        }
        Some(m) => m,
    };
    let mut kwargs = serde_json::Map::new();
    if let Some(t) = &req.thinking {
        let on = match t.kind.as_str() {
            "disabled" => false,
            "adaptive" => true,
            "enabled" => {
                return Err(bad(
                    "thinking.budget_tokens",
                    "thinking {\"type\": \"enabled\"} sets a budget_tokens this server cannot \
                     enforce; use {\"type\": \"adaptive\"} (the model thinks as its chat template \
                     lets it) or {\"type\": \"disabled\"}",
                ));
            }
            other => {
                return Err(bad(
                    "thinking.type",
                    format!("thinking.type must be adaptive or disabled, got {other:?}"),
                ));
            }
        };
        kwargs.insert("enable_thinking".into(), Value::Bool(on));
    }
    let mut tools = Vec::new();
    for (i, t) in req.tools.iter().flatten().enumerate() {
        if let Some(kind) = t.kind.as_deref().filter(|k| *k != "custom") {
            return Err(bad(
                &format!("tools[{i}].type"),
                format!(
                    "tools[{i}] is the server tool `{kind}`, which this server does not run; \
                     only client tools (name, description, input_schema) are supported"
                ),
            ));
        }
        if t.name.is_empty() {
            return Err(bad(
                &format!("tools[{i}].name"),
                format!("tools[{i}].name must be a non-empty string"),
            ));
        }
        if let Some(s) = t
            .input_schema
            .as_ref()
            .filter(|s| !s.is_object() && !s.is_null())
        {
            return Err(bad(
                &format!("tools[{i}].input_schema"),
                format!(
                    "tools[{i}].input_schema must be a JSON schema object, got {}",
                    super::request::kind(s)
                ),
            ));
        }
        tools.push(ToolDef {
            kind: "function".into(),
            function: FunctionDef {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters: t.input_schema.clone(),
                strict: t.strict,
            },
        });
    }
    let (tool_choice, one_call) = match &req.tool_choice {
        None => (None, false),
        Some(c) => {
            let mode = |m: &str| Some(ToolChoiceParam::Mode(m.into()));
            let choice = match c.kind.as_str() {
                "auto" => mode("auto"),
                "any" => mode("required"),
                "none" => mode("none"),
                "tool" => {
                    let name = c.name.clone().ok_or_else(|| {
                        bad(
                            "tool_choice.name",
                            "a tool choice of type tool names the tool",
                        )
                    })?;
                    Some(ToolChoiceParam::Named(NamedToolChoice {
                        kind: "function".into(),
                        function: FunctionName { name },
                    }))
                }
                other => {
                    return Err(bad(
                        "tool_choice.type",
                        format!("tool_choice.type must be auto, any, tool or none, got {other:?}"),
                    ));
                }
            };
            (choice, c.disable_parallel_tool_use == Some(true))
        }
    };
    let mut messages = Vec::new();
    if let Some(system) = &req.system {
        messages.push(ChatMessage::text(
            Role::System,
            block_text(system, "system")?,
        ));
    }
    messages.extend(chat_messages(req)?);
    let stop_sequences = req.stop_sequences.clone().unwrap_or_default();
    let find_stop = !stop_sequences.is_empty();
    let chat = ChatRequest {
        messages,
        params: GenerationParams {
            model: req.model.clone(),
            temperature: req.temperature,
            top_p: req.top_p,
            top_k: req.top_k,
            max_tokens: Some(max_tokens),
            stop: find_stop.then(|| Stop::Many(stop_sequences.clone())),
            stream: req.stream,
            stream_options: req.stream.then_some(StreamOptions {
                include_usage: true,
            }),
            // The tokens tell which stop sequence ended generation; streamed, a chunk carries
            // every token only when log-probs are asked for.
            return_token_ids: find_stop,
            ..Default::default()
        },
        logprobs: find_stop && req.stream,
        tools: (!tools.is_empty()).then_some(tools),
        tool_choice,
        chat_template_kwargs: (!kwargs.is_empty()).then_some(kwargs),
        ..Default::default()
    };
    Ok(Plan {
        chat,
        one_call,
        stop_sequences,
        model: api.served_name().to_string(),
    })
}

/// Text content, or text blocks joined.
fn block_text(c: &AnthropicContent, at: &str) -> Result<String, ApiError> {
    match c {
        AnthropicContent::Text(t) => Ok(t.clone()),
        AnthropicContent::Blocks(blocks) => {
            let mut out = String::new();
            for (j, b) in blocks.iter().enumerate() {
                match (b.kind.as_str(), &b.text) {
                    ("text", Some(t)) => out.push_str(t),
                    (kind, _) => {
                        return Err(bad(
                            &format!("{at}[{j}]"),
                            format!("{at}[{j}]: `{kind}` blocks are not supported here; only text"),
                        ));
                    }
                }
            }
            Ok(out)
        }
    }
}

/// The conversation as chat messages: an assistant turn's thinking, text and tool uses are one
/// message; a user turn's tool results are tool messages, its text a user message.
fn chat_messages(req: &MessagesRequest) -> Result<Vec<ChatMessage>, ApiError> {
    if req.messages.is_empty() {
        return Err(bad(
            "messages",
            "messages must not be empty: an array of {role, content} is required",
        ));
    }
    let mut out = Vec::new();
    for (i, m) in req.messages.iter().enumerate() {
        let role = match m.role.as_str() {
            "user" => Role::User,
            "assistant" => Role::Assistant,
            other => {
                return Err(bad(
                    &format!("messages[{i}].role"),
                    format!(
                        "messages[{i}].role must be user or assistant, got {other:?} (the system \
                         prompt is the top-level system field)"
                    ),
                ));
            }
        };
        let blocks = match &m.content {
            AnthropicContent::Text(t) => {
                out.push(ChatMessage::text(role, t.clone()));
                continue;
            }
            AnthropicContent::Blocks(b) => b,
        };
        let at = |j: usize, f: &str| format!("messages[{i}].content[{j}]{f}");
        let mut text = String::new();
        let mut has_text = false;
        let mut calls = Vec::new();
        let mut thinking: Option<String> = None;
        for (j, b) in blocks.iter().enumerate() {
            match (role, b.kind.as_str()) {
                (_, "text") => {
                    text.push_str(b.text.as_deref().unwrap_or_default());
                    has_text = true;
                }
                (Role::Assistant, "tool_use") => {
                    let need = |v: &Option<String>, f: &str| {
                        v.clone()
                            .ok_or_else(|| bad(&at(j, f), format!("{} is required", at(j, f))))
                    };
                    let input = b
                        .input
                        .clone()
                        .unwrap_or_else(|| Value::Object(Default::default()));
                    calls.push(ToolCall::function(
                        &need(&b.id, ".id")?,
                        &need(&b.name, ".name")?,
                        &input.to_string(),
                    ));
                }
                (Role::Assistant, "thinking") => {
                    thinking
                        .get_or_insert_with(String::new)
                        .push_str(b.thinking.as_deref().unwrap_or_default());
                }
                (Role::User, "tool_result") => {
                    if b.is_error == Some(true) {
                        return Err(bad(
                            &at(j, ".is_error"),
                            "is_error tool results are not supported: chat templates have no \
                             place for the flag; send the error as the result's text",
                        ));
                    }
                    let id = b.tool_use_id.clone().ok_or_else(|| {
                        bad(
                            &at(j, ".tool_use_id"),
                            format!("{} is required", at(j, ".tool_use_id")),
                        )
                    })?;
                    // Text before a result is its own user turn, so the order stays.
                    if has_text {
                        out.push(ChatMessage::text(Role::User, std::mem::take(&mut text)));
                        has_text = false;
                    }
                    let content = match &b.content {
                        None => String::new(),
                        Some(c) => block_text(c, &at(j, ".content"))?,
                    };
                    let mut t = ChatMessage::text(Role::Tool, content);
                    t.tool_call_id = Some(id);
                    out.push(t);
                }
                (_, kind) => {
                    return Err(bad(
                        &at(j, ""),
                        format!(
                            "{}: `{kind}` blocks are not supported in a {} message",
                            at(j, ""),
                            m.role
                        ),
                    ));
                }
            }
        }
        match role {
            Role::Assistant => {
                let mut a = ChatMessage::text(Role::Assistant, text);
                if !has_text && !calls.is_empty() {
                    a.content = None;
                }
                if !calls.is_empty() {
                    a.tool_calls = Some(calls);
                }
                a.reasoning_content = thinking;
                out.push(a);
            }
            _ if has_text || !blocks.iter().any(|b| b.kind == "tool_result") => {
                out.push(ChatMessage::text(Role::User, text));
            }
            _ => {}
        }
    }
    Ok(out)
}

/// The answer, whichever way it arrived.
struct Answer {
    thinking: String,
    text: String,
    calls: Vec<ToolCall>,
}

impl Answer {
    fn blocks(&self) -> Vec<ResponseBlock> {
        let mut out = Vec::new();
        if !self.thinking.is_empty() {
            out.push(ResponseBlock::Thinking {
                thinking: self.thinking.clone(),
                signature: String::new(),
            });
        }
        if !self.text.is_empty() {
            out.push(ResponseBlock::Text {
                text: self.text.clone(),
            });
        }
        for c in &self.calls {
            out.push(ResponseBlock::ToolUse {
                id: c.id.clone(),
                name: c.function.name.clone(),
                input: tool_input(&c.function.arguments),
            });
        }
        out
    }
}

/// A call's arguments as `input`: the JSON they are (an object, when the model wrote one), or
/// the text as a string when they are not JSON.
fn tool_input(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_string()))
}

/// The open block of a stream.
#[derive(Clone, Copy, PartialEq)]
enum Open {
    Thinking(usize),
    Text(usize),
    /// A tool use: the chat call's index, the block's index.
    Call(usize, usize),
}

/// Turns chat deltas into Messages events.
struct MessagesWriter {
    tx: tmpsc::Sender<String>,
    next: usize,
    open: Option<Open>,
    /// Chat call index → block index and call so far.
    calls: BTreeMap<usize, (usize, ToolCall)>,
    answer: Answer,
    one_call: bool,
}

impl MessagesWriter {
    async fn send(&mut self, e: MessagesEvent) -> bool {
        let data = serde_json::to_string(&e).expect("events serialise");
        self.tx
            .send(format!("event: {}\ndata: {data}\n\n", e.name()))
            .await
            .is_ok()
    }

    async fn close(&mut self) -> bool {
        match self.open.take() {
            None => true,
            Some(Open::Thinking(index) | Open::Text(index) | Open::Call(_, index)) => {
                self.send(MessagesEvent::ContentBlockStop { index }).await
            }
        }
    }

    /// More thinking or text, opening its block (and closing the open one) first.
    async fn text(&mut self, thinking: bool, delta: &str) -> bool {
        if delta.is_empty() {
            return true;
        }
        let index = match self.open {
            Some(Open::Thinking(i)) if thinking => i,
            Some(Open::Text(i)) if !thinking => i,
            _ => {
                if !self.close().await {
                    return false;
                }
                let index = self.next;
                self.next += 1;
                let content_block = if thinking {
                    self.open = Some(Open::Thinking(index));
                    ResponseBlock::Thinking {
                        thinking: String::new(),
                        signature: String::new(),
                    }
                } else {
                    self.open = Some(Open::Text(index));
                    ResponseBlock::Text {
                        text: String::new(),
                    }
                };
                if !self
                    .send(MessagesEvent::ContentBlockStart {
                        index,
                        content_block,
                    })
                    .await
                {
                    return false;
                }
                index
            }
        };
        let delta = if thinking {
            self.answer.thinking.push_str(delta);
            BlockDelta::ThinkingDelta {
                thinking: delta.into(),
            }
        } else {
            self.answer.text.push_str(delta);
            BlockDelta::TextDelta { text: delta.into() }
        };
        self.send(MessagesEvent::ContentBlockDelta { index, delta })
            .await
    }

    /// A tool call delta: a new call opens a `tool_use` block, arguments stream as JSON pieces.
    async fn call(&mut self, d: &CallDeltaRead) -> bool {
        let (name, args) = d.function.as_ref().map_or((None, None), |f| {
            (f.name.as_deref(), f.arguments.as_deref())
        });
        if !self.calls.contains_key(&d.index) {
            if self.one_call && !self.calls.is_empty() {
                return true;
            }
            if !self.close().await {
                return false;
            }
            let index = self.next;
            self.next += 1;
            let call = ToolCall::function(
                &d.id.clone().unwrap_or_else(|| new_id("toolu")),
                name.unwrap_or_default(),
                "",
            );
            let content_block = ResponseBlock::ToolUse {
                id: call.id.clone(),
                name: call.function.name.clone(),
                input: Value::Object(Default::default()),
            };
            self.calls.insert(d.index, (index, call));
            self.open = Some(Open::Call(d.index, index));
            if !self
                .send(MessagesEvent::ContentBlockStart {
                    index,
                    content_block,
                })
                .await
            {
                return false;
            }
        }
        let Some(args) = args.filter(|a| !a.is_empty()) else {
            return true;
        };
        let (index, call) = self.calls.get_mut(&d.index).expect("inserted above");
        call.function.arguments.push_str(args);
        let index = *index;
        // Pieces of a call whose block was closed (the chat stream went back to an earlier
        // call) still count in the answer but cannot be streamed.
        if self.open != Some(Open::Call(d.index, index)) {
            return true;
        }
        self.send(MessagesEvent::ContentBlockDelta {
            index,
            delta: BlockDelta::InputJsonDelta {
                partial_json: args.to_string(),
            },
        })
        .await
    }
}

/// Streams a message from the chat stream's chunks.
fn stream(
    api: Arc<Api>,
    plan: Plan,
    mut chunks: tmpsc::Receiver<String>,
) -> tmpsc::Receiver<String> {
    let (tx, out) = tmpsc::channel(64);
    tokio::spawn(async move {
        let mut w = MessagesWriter {
            tx,
            next: 0,
            open: None,
            calls: BTreeMap::new(),
            answer: Answer {
                thinking: String::new(),
                text: String::new(),
                calls: Vec::new(),
            },
            one_call: plan.one_call,
        };
        let start = MessagesResponse {
            id: new_id("msg"),
            kind: "message".into(),
            role: "assistant".into(),
            model: plan.model.clone(),
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage: AnthropicUsage::default(),
        };
        if !w
            .send(MessagesEvent::MessageStart {
                message: Box::new(start),
            })
            .await
        {
            return;
        }
        let mut usage = Usage::default();
        let mut finish = "stop".to_string();
        let mut ids = Vec::new();
        while let Some(payload) = chunks.recv().await {
            if payload == "[DONE]" {
                break;
            }
            let chunk: ChunkRead = match serde_json::from_str(&payload) {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!("unreadable chat chunk {payload}: {e}");
                    finish = "abort".into();
                    break;
                }
            };
            if let Some(u) = chunk.usage {
                usage = u;
            }
            for c in chunk.choices {
                if let Some(r) = &c.delta.reasoning_content
                    && !w.text(true, r).await
                {
                    return;
                }
                if let Some(t) = &c.delta.content
                    && !w.text(false, t).await
                {
                    return;
                }
                for call in c.delta.tool_calls.iter().flatten() {
                    if !w.call(call).await {
                        return;
                    }
                }
                ids.extend(c.delta.token_ids.iter().flatten());
                if let Some(f) = c.finish_reason {
                    finish = f;
                }
            }
        }
        if !w.close().await {
            return;
        }
        if finish == "abort" {
            let e = aborted();
            w.send(MessagesEvent::Error {
                error: StreamError {
                    kind: "api_error".into(),
                    message: e.message,
                },
            })
            .await;
            return;
        }
        let (stop_reason, stop_sequence) = stop(&api, &plan, &finish, &ids);
        if w.send(MessagesEvent::MessageDelta {
            delta: MessageDelta {
                stop_reason: Some(stop_reason),
                stop_sequence,
            },
            usage: anthropic_usage(&usage),
        })
        .await
        {
            w.send(MessagesEvent::MessageStop).await;
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_round_trip_becomes_the_chat_conversation() {
        let req: MessagesRequest = openai::parse(
            serde_json::json!({"max_tokens": 8, "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hm", "signature": ""},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "1"},
                    {"type": "text", "text": "and?"}]},
            ]})
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        let m = chat_messages(&req).unwrap();
        assert_eq!(m.len(), 4, "{m:?}");
        assert_eq!(m[1].content, None);
        assert_eq!(m[1].reasoning_content.as_deref(), Some("hm"));
        let calls = m[1].tool_calls.as_ref().unwrap();
        assert_eq!(calls[0].function.arguments, r#"{"x":1}"#);
        assert_eq!(m[2].role, Role::Tool);
        assert_eq!(m[2].tool_call_id.as_deref(), Some("t1"));
        assert_eq!(m[3].role, Role::User);
        let mut bad_req = req.clone();
        bad_req.messages[2].role = "system".into();
        let e = chat_messages(&bad_req).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[2].role"));
    }
}
