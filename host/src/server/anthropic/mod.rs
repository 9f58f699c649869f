//! `POST /v1/messages`: Anthropic's Messages API over the chat completions pipeline, as
//! `/v1/responses` is ([`super::responses`]): a request becomes a [`ChatRequest`] (the system
//! prompt and messages as chat messages, `tool_use` blocks as tool calls, `tool_result` blocks
//! as tool messages, client tools as function tools) served by [`Pipeline::chat`], and the chat
//! answer becomes thinking, text and `tool_use` blocks; a stream is built from the chat stream's
//! chunks.
//!
//! Requests are checked as Anthropic's API checks them: each content block has the fields its
//! type requires, of their types (a text block its non-empty `text`, a `tool_use` an object
//! `input`, …), a tool its `input_schema`; a refusal is a 400 `invalid_request_error` naming the
//! field's path. Errors are in Anthropic's shape (`{"type": "error", "error": {"type",
//! "message"}}`) with OpenAI's `param` and `code` kept inside `error`.
//!
//! This module must never render prompts or parse model output itself.

mod stream;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::routing::{MethodRouter, post};
use serde_json::Value;

use super::sse;
use crate::chat::{Pipeline, Reply, bad, random_id};
use crate::openai::anthropic::{
    AnthropicContent, AnthropicErrorBody, AnthropicUsage, ContentBlock, MessagesRequest,
    MessagesResponse, ResponseBlock,
};
use crate::openai::{
    self, ApiError, ChatMessage, ChatRequest, FunctionDef, FunctionName, GenerationParams,
    NamedToolChoice, Role, Stop, StreamOptions, ToolCall, ToolChoiceParam, ToolDef, Usage,
};

/// The `POST /v1/messages` route.
pub fn route() -> MethodRouter<Arc<Pipeline>> {
    post(|State(api): State<Arc<Pipeline>>, body: Bytes| async move {
        match create(api, &body).await {
            Ok(r) => r,
            Err(e) => error(e),
        }
    })
}

/// The route's error response: Anthropic's shape ([`AnthropicErrorBody`]), `Retry-After` on a
/// 503 as on every route.
pub(super) fn error(e: ApiError) -> HttpResponse {
    super::error_body(e.status, AnthropicErrorBody::of(&e))
}

/// What a request becomes.
struct Plan {
    chat: ChatRequest,
    /// `disable_parallel_tool_use`: keep only the first tool use.
    one_call: bool,
    stop_sequences: Vec<String>,
    model: String,
}

async fn create(api: Arc<Pipeline>, body: &[u8]) -> Result<HttpResponse, ApiError> {
    let req: MessagesRequest = openai::parse(body)?;
    let plan = plan(&api, &req)?;
    match api.chat(&plan.chat, None).await.map_err(rename_param)? {
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
                id: random_id("msg", '_'),
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
        Reply::Stream(chunks) => Ok(sse::translated(
            chunks,
            stream::MessagesWriter::new(api, plan),
        )),
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
fn stop(api: &Pipeline, plan: &Plan, finish: &str, ids: &[u32]) -> (String, Option<String>) {
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

fn plan(api: &Pipeline, req: &MessagesRequest) -> Result<Plan, ApiError> {
    super::refuse_set(&[
        ("container", &req.container),
        ("mcp_servers", &req.mcp_servers),
        ("context_management", &req.context_management),
        ("output_config", &req.output_config),
        ("inference_geo", &req.inference_geo),
        ("diagnostics", &req.diagnostics),
    ])?;
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
    let tools = chat_tools(req)?;
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
    let model = api.model_name(&api.check_model(&chat.params.model)?);
    Ok(Plan {
        chat,
        one_call,
        stop_sequences,
        model,
    })
}

/// The request's client tools as chat function tools, checked as Anthropic checks them: a name
/// of 1 to 128 letters, digits, `_` and `-`; an `input_schema` object of type `object`. Server
/// tools are refused.
fn chat_tools(req: &MessagesRequest) -> Result<Vec<ToolDef>, ApiError> {
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
        if !is_identifier(&t.name, 128) {
            return Err(bad(
                &format!("tools[{i}].name"),
                format!(
                    "tools[{i}].name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$', got \
                 {:?}",
                    t.name
                ),
            ));
        }
        let at = format!("tools[{i}].input_schema");
        match &t.input_schema {
            None | Some(Value::Null) => {
                return Err(bad(
                    &at,
                    format!("{at}: Field required (the tool's input as a JSON schema object)"),
                ));
            }
            Some(Value::Object(schema)) => {
                if schema.get("type") != Some(&Value::String("object".into())) {
                    return Err(bad(
                        &format!("{at}.type"),
                        format!("{at}.type: Input should be 'object'"),
                    ));
                }
            }
            Some(s) => {
                return Err(bad(
                    &at,
                    format!(
                        "{at} must be a JSON schema object, got {}",
                        crate::chat::request::kind(s)
                    ),
                ));
            }
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
    Ok(tools)
}

/// Text content, or text blocks joined (each checked: [`check_block`]).
fn block_text(c: &AnthropicContent, at: &str) -> Result<String, ApiError> {
    match c {
        AnthropicContent::Text(t) => Ok(t.clone()),
        AnthropicContent::Blocks(blocks) => {
            let mut out = String::new();
            for (j, b) in blocks.iter().enumerate() {
                let here = format!("{at}[{j}]");
                if b.kind != "text" {
                    return Err(bad(
                        &here,
                        format!(
                            "{here}: `{}` blocks are not supported here; only text",
                            b.kind
                        ),
                    ));
                }
                check_block(b, &here)?;
                out.push_str(b.text.as_deref().unwrap_or_default());
            }
            Ok(out)
        }
    }
}

/// `s` is 1 to `max` letters, digits, `_` and `-` (Anthropic's pattern for tool names and ids).
fn is_identifier(s: &str, max: usize) -> bool {
    (1..=max).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Checks a content block of a type this route serves (`text`, `tool_use`, `tool_result`,
/// `thinking`) as Anthropic's API does: the fields its type requires, of their types, and none
/// that only another type has. `at` is the block's path (`messages[1].content[0]`); the error
/// names the field's. Other types pass here: the caller refuses them.
fn check_block(b: &ContentBlock, at: &str) -> Result<(), ApiError> {
    let field = |f: &str| format!("{at}.{f}");
    let allowed: &[&str] = match b.kind.as_str() {
        "text" => &["text", "citations", "cache_control"],
        "tool_use" => &["id", "name", "input", "cache_control"],
        "tool_result" => &["tool_use_id", "content", "is_error", "cache_control"],
        "thinking" => &["thinking", "signature"],
        _ => return Ok(()),
    };
    if let Some(f) = b.fields().into_iter().find(|f| !allowed.contains(f)) {
        return Err(bad(
            &field(f),
            format!(
                "{}: Extra inputs are not permitted (a {} block has {})",
                field(f),
                b.kind,
                allowed.join(", ")
            ),
        ));
    }
    let required = |v: Option<&String>, f: &str| -> Result<(), ApiError> {
        match v {
            None => Err(bad(&field(f), format!("{}: Field required", field(f)))),
            Some(_) => Ok(()),
        }
    };
    let identifier = |v: Option<&String>, f: &str| -> Result<(), ApiError> {
        required(v, f)?;
        let v = v.expect("checked above");
        if is_identifier(v, usize::MAX) {
            Ok(())
        } else {
            Err(bad(
                &field(f),
                format!(
                    "{}: String should match pattern '^[a-zA-Z0-9_-]+$', got {v:?}",
                    field(f)
                ),
            ))
        }
    };
    match b.kind.as_str() {
        "text" => {
            required(b.text.as_ref(), "text")?;
            if b.text.as_deref().is_some_and(str::is_empty) {
                return Err(bad(
                    &field("text"),
                    format!("{}: text content blocks must be non-empty", field("text")),
                ));
            }
            if let Some(c) = b
                .citations
                .as_ref()
                .filter(|c| !c.is_array() && !c.is_null())
            {
                return Err(bad(
                    &field("citations"),
                    format!(
                        "{}: Input should be a valid list, got {}",
                        field("citations"),
                        crate::chat::request::kind(c)
                    ),
                ));
            }
        }
        "tool_use" => {
            identifier(b.id.as_ref(), "id")?;
            required(b.name.as_ref(), "name")?;
            if b.name.as_deref().is_some_and(str::is_empty) {
                return Err(bad(
                    &field("name"),
                    format!("{}: String should have at least 1 character", field("name")),
                ));
            }
            match &b.input {
                None => {
                    return Err(bad(
                        &field("input"),
                        format!("{}: Field required", field("input")),
                    ));
                }
                Some(Value::Object(_)) => {}
                Some(v) => {
                    return Err(bad(
                        &field("input"),
                        format!(
                            "{}: Input should be a valid dictionary (the tool's arguments as an \
                             object), got {}",
                            field("input"),
                            crate::chat::request::kind(v)
                        ),
                    ));
                }
            }
        }
        "tool_result" => identifier(b.tool_use_id.as_ref(), "tool_use_id")?,
        "thinking" => {
            required(b.thinking.as_ref(), "thinking")?;
            required(b.signature.as_ref(), "signature")?;
        }
        _ => {}
    }
    Ok(())
}

/// Whether `c` has no content (an empty string or no blocks).
fn is_empty(c: &AnthropicContent) -> bool {
    match c {
        AnthropicContent::Text(t) => t.is_empty(),
        AnthropicContent::Blocks(b) => b.is_empty(),
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
        if is_empty(&m.content) && !(role == Role::Assistant && i + 1 == req.messages.len()) {
            return Err(bad(
                &format!("messages[{i}].content"),
                format!(
                    "messages[{i}]: all messages must have non-empty content except for the \
                     optional final assistant message"
                ),
            ));
        }
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
            check_block(b, &at(j, ""))?;
            match (role, b.kind.as_str()) {
                (_, "text") => {
                    text.push_str(b.text.as_deref().unwrap_or_default());
                    has_text = true;
                }
                (Role::Assistant, "tool_use") => {
                    // check_block made sure of id, name and an object input.
                    let input = b.input.clone().unwrap_or_default();
                    calls.push(ToolCall::function(
                        b.id.as_deref().unwrap_or_default(),
                        b.name.as_deref().unwrap_or_default(),
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
                    let id = b.tool_use_id.clone().unwrap_or_default();
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(v: Value) -> MessagesRequest {
        openai::parse(v.to_string().as_bytes()).unwrap()
    }

    /// The path and message of the refusal of `messages` (with a system prompt `system`).
    fn refusal(system: Value, messages: Value) -> (String, String) {
        let req = request(json!({"max_tokens": 8, "system": system, "messages": messages}));
        let e = req
            .system
            .as_ref()
            .map_or(Ok(String::new()), |s| block_text(s, "system"))
            .and_then(|_| chat_messages(&req))
            .unwrap_err();
        assert_eq!((e.status, e.kind), (400, "invalid_request_error"), "{e:?}");
        (e.param.unwrap_or_default(), e.message)
    }

    /// Blocks Anthropic's API refuses are refused, each naming the field's path: a text block
    /// without `text` or with an empty one, a `tool_use` whose `input` is not an object (or
    /// missing, or whose id is not an identifier), a `tool_result` without `tool_use_id` or with
    /// a text block without text inside, a `thinking` block without `signature`, a field of
    /// another block type, and a message with no content before the last.
    #[test]
    fn blocks_are_checked_as_anthropic_checks_them() {
        let user = |content: Value| json!([{"role": "user", "content": content}]);
        let after_call = |content: Value| {
            json!([
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                {"role": "user", "content": content},
            ])
        };
        let assistant = |content: Value| {
            json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": content},
                   {"role": "user", "content": "go on"}])
        };
        let cases = [
            (
                user(json!([{"type": "text"}])),
                "messages[0].content[0].text",
                "Field required",
            ),
            (
                user(json!([{"type": "text", "text": ""}])),
                "messages[0].content[0].text",
                "must be non-empty",
            ),
            (
                user(json!([{"type": "text", "text": "x", "input": {}}])),
                "messages[0].content[0].input",
                "Extra inputs are not permitted",
            ),
            (
                user(json!([{"type": "text", "text": "x", "citations": 3}])),
                "messages[0].content[0].citations",
                "valid list",
            ),
            (user(json!([])), "messages[0].content", "non-empty content"),
            (user(json!("")), "messages[0].content", "non-empty content"),
            (
                assistant(json!([{"type": "tool_use", "id": "t1", "name": "f", "input": [1]}])),
                "messages[1].content[0].input",
                "valid dictionary",
            ),
            (
                assistant(json!([{"type": "tool_use", "id": "t1", "name": "f", "input": "{}"}])),
                "messages[1].content[0].input",
                "valid dictionary",
            ),
            (
                assistant(json!([{"type": "tool_use", "id": "t1", "name": "f"}])),
                "messages[1].content[0].input",
                "Field required",
            ),
            (
                assistant(json!([{"type": "tool_use", "name": "f", "input": {}}])),
                "messages[1].content[0].id",
                "Field required",
            ),
            (
                assistant(json!([{"type": "tool_use", "id": "t 1", "name": "f", "input": {}}])),
                "messages[1].content[0].id",
                "should match pattern",
            ),
            (
                assistant(json!([{"type": "tool_use", "id": "t1", "name": "", "input": {}}])),
                "messages[1].content[0].name",
                "at least 1 character",
            ),
            (
                assistant(json!([{"type": "thinking", "thinking": "hm"}])),
                "messages[1].content[0].signature",
                "Field required",
            ),
            (
                assistant(json!([{"type": "thinking", "signature": ""}])),
                "messages[1].content[0].thinking",
                "Field required",
            ),
            (
                after_call(json!([{"type": "tool_result", "content": "1"}])),
                "messages[2].content[0].tool_use_id",
                "Field required",
            ),
            (
                after_call(
                    json!([{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text"}]}]),
                ),
                "messages[2].content[0].content[0].text",
                "Field required",
            ),
            (
                after_call(
                    json!([{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "image", "source": {}}]}]),
                ),
                "messages[2].content[0].content[0]",
                "only text",
            ),
        ];
        for (messages, param, says) in cases {
            let (p, m) = refusal(Value::Null, messages.clone());
            assert_eq!(p, param, "{messages}: {m}");
            assert!(m.contains(says), "{messages}: {m}");
        }
        let (p, m) = refusal(json!([{"type": "text"}]), user(json!("q")));
        assert_eq!(p, "system[0].text", "{m}");
        // What Anthropic accepts passes: an empty final assistant turn (a prefill), blocks with
        // cache_control and citations, a signed-nothing thinking block.
        let ok = request(json!({"max_tokens": 8, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "q",
                "cache_control": {"type": "ephemeral"}, "citations": []}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "", "signature": ""},
                {"type": "tool_use", "id": "toolu_01-x", "name": "f", "input": {"a": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01-x",
                "content": [{"type": "text", "text": "1"}], "is_error": false}]},
            {"role": "assistant", "content": []},
        ]}));
        chat_messages(&ok).unwrap();
    }

    /// A tool needs an `input_schema` of type `object` and a name Anthropic's pattern allows.
    #[test]
    fn tools_are_checked_as_anthropic_checks_them() {
        let tools = |t: Value| {
            chat_tools(&request(
                json!({"max_tokens": 8, "messages": [], "tools": [t]}),
            ))
        };
        for (tool, param, says) in [
            (
                json!({"name": "f"}),
                "tools[0].input_schema",
                "Field required",
            ),
            (
                json!({"name": "f", "input_schema": null}),
                "tools[0].input_schema",
                "Field required",
            ),
            (
                json!({"name": "f", "input_schema": {}}),
                "tools[0].input_schema.type",
                "'object'",
            ),
            (
                json!({"name": "f", "input_schema": {"type": "string"}}),
                "tools[0].input_schema.type",
                "'object'",
            ),
            (
                json!({"name": "f", "input_schema": [1]}),
                "tools[0].input_schema",
                "JSON schema object",
            ),
            (
                json!({"name": "a b", "input_schema": {"type": "object"}}),
                "tools[0].name",
                "pattern",
            ),
            (
                json!({"name": "", "input_schema": {"type": "object"}}),
                "tools[0].name",
                "pattern",
            ),
            (
                json!({"type": "bash_20250124", "name": "bash"}),
                "tools[0].type",
                "server tool",
            ),
        ] {
            let e = tools(tool.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{tool}: {}", e.message);
            assert!(e.message.contains(says), "{tool}: {}", e.message);
        }
        let ok =
            tools(json!({"name": "get_weather-2", "input_schema": {"type": "object"}})).unwrap();
        assert_eq!(ok[0].function.name, "get_weather-2");
    }

    /// Errors on this route are in Anthropic's shape, with OpenAI's `param` and `code` inside.
    #[test]
    fn errors_are_in_anthropics_shape() {
        let body = |status| {
            serde_json::to_value(AnthropicErrorBody::of(&ApiError {
                status,
                kind: "internal_error",
                message: "m".into(),
                param: Some("p".into()),
            }))
            .unwrap()
        };
        assert_eq!(
            body(400),
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "m",
                   "param": "p", "code": 400}})
        );
        assert_eq!(body(404)["error"]["type"], "not_found_error");
        assert_eq!(body(413)["error"]["type"], "request_too_large");
        assert_eq!(body(503)["error"]["type"], "overloaded_error");
        assert_eq!(body(500)["error"]["type"], "api_error");
    }

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
