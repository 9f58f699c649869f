//! Anthropic's Messages API as types (`POST /v1/messages`, which recent vLLM also serves): the
//! request ([`MessagesRequest`]), the message it returns ([`MessagesResponse`]) and the events of
//! a streamed one ([`MessagesEvent`]). Field names follow the `anthropic` Python client's
//! `types/`.
//!
//! Reading is tolerant as the OpenAI types are: unknown fields are ignored, `null` is absent,
//! and a field the server cannot honour is still read so it can be refused by name.

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::null_as_default;

fn is_false(b: &bool) -> bool {
    !*b
}

/// `POST /v1/messages`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MessagesRequest {
    /// Served model name (checked against the server's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Most tokens to generate (required, as on Anthropic's API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<i64>,
    /// The conversation: alternating `user` and `assistant` messages.
    #[serde(default, deserialize_with = "null_as_default")]
    pub messages: Vec<AnthropicMessage>,
    /// The system prompt: text, or text blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<AnthropicContent>,
    /// Strings that end generation; the one that did is `stop_sequence`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_sequences: Option<Vec<String>>,
    /// Server-sent events.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "is_false"
    )]
    pub stream: bool,
    /// Sampling temperature (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus mass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Top-k.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    /// Client tools (`{"name", "description", "input_schema"}`); server tools are read by
    /// `type` so they can be refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<AnthropicTool>>,
    /// `{"type": "auto" | "any" | "tool" | "none", "name", "disable_parallel_tool_use"}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<AnthropicToolChoice>,
    /// `{"user_id"}`: accepted (nothing here depends on the user).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<AnthropicMetadata>,
    /// `{"type": "disabled"}` or `{"type": "adaptive"}`, given to the chat template as
    /// `enable_thinking`; `enabled` with a `budget_tokens` is refused (no budget is enforced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<ThinkingConfig>,
    /// `auto` or `standard_only` (one tier here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<String>,
    /// Prompt caching: accepted (every prompt prefix is cached here anyway).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<Value>,
    /// Code-execution containers: refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<Value>,
    /// Remote MCP servers: refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_servers: Option<Value>,
    /// Context editing: refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_management: Option<Value>,
    /// Output format and effort: refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_config: Option<Value>,
    /// Where inference runs: refused (this server runs where it runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference_geo: Option<Value>,
    /// Request diagnostics: refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostics: Option<Value>,
    /// `standard`; `fast` is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed: Option<String>,
    /// An opaque user profile id: accepted (nothing here depends on it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_profile_id: Option<String>,
    /// An opaque workspace id: accepted (nothing here depends on it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_id: Option<String>,
}

/// A message of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnthropicMessage {
    /// `user` or `assistant`.
    pub role: String,
    /// Text or content blocks.
    pub content: AnthropicContent,
}

/// Content: a string or blocks.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum AnthropicContent {
    /// Plain text.
    Text(String),
    /// Content blocks.
    Blocks(Vec<ContentBlock>),
}

impl<'de> Deserialize<'de> for AnthropicContent {
    /// By hand rather than `untagged`, so an error inside a block names its path.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = AnthropicContent;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or an array of content blocks")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(AnthropicContent::Text(s.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut blocks = Vec::new();
                while let Some(b) = seq.next_element()? {
                    blocks.push(b);
                }
                Ok(AnthropicContent::Blocks(blocks))
            }
        }
        d.deserialize_any(V)
    }
}

/// One content block of a request. Blocks are told apart by `type`; one struct reads them all
/// and the server checks, as Anthropic's API does, that each has the fields its type requires
/// (of their types) and none that another type owns:
/// - `text`: `text`, a non-empty string (`citations`, `cache_control` accepted);
/// - `tool_use` (assistant): `id` and `name`, strings of letters, digits, `_` and `-`; `input`,
///   an object;
/// - `tool_result` (user): `tool_use_id`; `content`, text or text blocks (optional);
/// - `thinking` (assistant): `thinking` and `signature`, strings (the signature is not checked:
///   this server signs nothing).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ContentBlock {
    /// `text`, `tool_use`, `tool_result`, `thinking`; `image`, `document`, … are refused.
    #[serde(rename = "type")]
    pub kind: String,
    /// A text block's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// A tool use's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// A tool use's tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A tool use's arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// The tool use a result answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_id: Option<String>,
    /// A tool result's content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<AnthropicContent>,
    /// A failed tool's result: refused when true (chat templates have no place for the flag).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_error: Option<bool>,
    /// A thinking block's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    /// A thinking block's signature (this server signs nothing, so none is checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// A text block's citations (accepted: what the model is shown is the text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub citations: Option<Value>,
    /// Prompt caching on a block: accepted (every prompt prefix is cached here anyway).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<Value>,
}

impl ContentBlock {
    /// The fields this block carries, by their wire names (`type` aside).
    pub fn fields(&self) -> Vec<&'static str> {
        [
            ("text", self.text.is_some()),
            ("id", self.id.is_some()),
            ("name", self.name.is_some()),
            ("input", self.input.is_some()),
            ("tool_use_id", self.tool_use_id.is_some()),
            ("content", self.content.is_some()),
            ("is_error", self.is_error.is_some()),
            ("thinking", self.thinking.is_some()),
            ("signature", self.signature.is_some()),
            ("citations", self.citations.is_some()),
            ("cache_control", self.cache_control.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect()
    }
}

/// A tool in a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnthropicTool {
    /// Absent or `custom` for a client tool; a server tool's versioned type otherwise
    /// (`web_search_20250305`, `bash_20250124`, …), refused.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The tool's name.
    #[serde(default)]
    pub name: String,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Its input as a JSON schema object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Value>,
    /// Strict schema adherence (templates may read it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnthropicToolChoice {
    /// `auto`, `any` (some tool must be used), `tool` (this one), `none`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The tool a `tool` choice forces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// At most one tool use (the first the model makes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_parallel_tool_use: Option<bool>,
}

/// `metadata`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AnthropicMetadata {
    /// An opaque user id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
}

/// `thinking`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThinkingConfig {
    /// `enabled`, `adaptive`, `disabled`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Most thinking tokens (`enabled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_tokens: Option<i64>,
}

/// An error response as Anthropic's API writes it, `{"type": "error", "error": {"type",
/// "message"}}`, with OpenAI's `param` and `code` kept inside `error` so a client of either
/// shape reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnthropicErrorBody {
    /// `error`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The error.
    pub error: AnthropicErrorDetail,
}

/// What an [`AnthropicErrorBody`] says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnthropicErrorDetail {
    /// Anthropic's error type for the status: `invalid_request_error` (400, 405),
    /// `not_found_error` (404), `request_too_large` (413), `rate_limit_error` (429),
    /// `overloaded_error` (503, 529), `api_error` (other 5xx).
    #[serde(rename = "type")]
    pub kind: String,
    /// What went wrong.
    pub message: String,
    /// The request field at fault (`messages[1].content[0].input`), when one is.
    #[serde(default)]
    pub param: Option<String>,
    /// The HTTP status.
    #[serde(default)]
    pub code: Option<u16>,
}

impl AnthropicErrorBody {
    /// The body of `e` in Anthropic's shape.
    pub fn of(e: &super::ApiError) -> Self {
        let kind = match e.status {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            500.. => "api_error",
            _ => "invalid_request_error",
        };
        Self {
            kind: "error".into(),
            error: AnthropicErrorDetail {
                kind: kind.into(),
                message: e.message.clone(),
                param: e.param.clone(),
                code: Some(e.status),
            },
        }
    }
}

/// A content block of the returned message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseBlock {
    /// The model's reasoning (`signature` empty: nothing is signed here).
    Thinking {
        /// The reasoning.
        thinking: String,
        /// Empty.
        signature: String,
    },
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// A call of a client tool.
    ToolUse {
        /// `toolu_…`; a `tool_result` answers it.
        id: String,
        /// The tool.
        name: String,
        /// Its arguments.
        input: Value,
    },
}

/// Token counts. As on Anthropic's API, `input_tokens` counts the prompt tokens not read from
/// the cache; the prompt is `input_tokens + cache_read_input_tokens`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AnthropicUsage {
    /// Prompt tokens computed.
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// Prompt tokens from the prefix cache.
    #[serde(default)]
    pub cache_read_input_tokens: Option<u64>,
    /// Tokens written to a cache on request (0: caching here is automatic).
    #[serde(default)]
    pub cache_creation_input_tokens: Option<u64>,
}

/// The returned message (`type: "message"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessagesResponse {
    /// `msg_…`.
    pub id: String,
    /// `message`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `assistant`.
    pub role: String,
    /// The served model.
    pub model: String,
    /// Thinking, text and tool use blocks.
    pub content: Vec<ResponseBlock>,
    /// `end_turn`, `max_tokens`, `stop_sequence`, `tool_use` (`null` while streaming).
    pub stop_reason: Option<String>,
    /// The stop sequence that ended generation.
    pub stop_sequence: Option<String>,
    /// Token counts.
    pub usage: AnthropicUsage,
}

/// A content block's increment in a stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockDelta {
    /// More text.
    TextDelta {
        /// The text.
        text: String,
    },
    /// More of a tool use's input, as JSON text.
    InputJsonDelta {
        /// The piece.
        partial_json: String,
    },
    /// More reasoning.
    ThinkingDelta {
        /// The text.
        thinking: String,
    },
}

/// `message_delta`'s change to the message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageDelta {
    /// Why generation ended.
    pub stop_reason: Option<String>,
    /// The stop sequence that ended it.
    pub stop_sequence: Option<String>,
}

/// An error event's body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamError {
    /// `api_error`, `overloaded_error`, …
    #[serde(rename = "type")]
    pub kind: String,
    /// What happened.
    pub message: String,
}

/// A streamed message's event, tagged by `type` (also its SSE `event:` name).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MessagesEvent {
    /// The message begins (no content; `usage.input_tokens` is 0 until `message_delta`).
    MessageStart {
        /// The message so far.
        message: Box<MessagesResponse>,
    },
    /// A content block begins.
    ContentBlockStart {
        /// Its position in `content`.
        index: usize,
        /// The block, empty.
        content_block: ResponseBlock,
    },
    /// A content block grows.
    ContentBlockDelta {
        /// Its position in `content`.
        index: usize,
        /// What it gains.
        delta: BlockDelta,
    },
    /// A content block is whole.
    ContentBlockStop {
        /// Its position in `content`.
        index: usize,
    },
    /// The stop reason and the final token counts (cumulative).
    MessageDelta {
        /// Stop reason and sequence.
        delta: MessageDelta,
        /// Token counts.
        usage: AnthropicUsage,
    },
    /// The message is complete: the last event of a stream that did not fail.
    MessageStop,
    /// The stream failed.
    Error {
        /// Why.
        error: StreamError,
    },
}

impl MessagesEvent {
    /// The event's `type`, which is also its SSE `event:` name.
    pub fn name(&self) -> &'static str {
        match self {
            MessagesEvent::MessageStart { .. } => "message_start",
            MessagesEvent::ContentBlockStart { .. } => "content_block_start",
            MessagesEvent::ContentBlockDelta { .. } => "content_block_delta",
            MessagesEvent::ContentBlockStop { .. } => "content_block_stop",
            MessagesEvent::MessageDelta { .. } => "message_delta",
            MessagesEvent::MessageStop => "message_stop",
            MessagesEvent::Error { .. } => "error",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requests_read_text_tool_use_and_tool_result_blocks() {
        let req: MessagesRequest = crate::openai::parse(
            json!({"model": "m", "max_tokens": 8, "system": "be brief", "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "running"},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "1"}]}]},
            ], "tools": [{"name": "f", "input_schema": {"type": "object"}}],
               "tool_choice": {"type": "any"}})
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        assert_eq!(req.messages.len(), 3);
        let AnthropicContent::Blocks(b) = &req.messages[2].content else {
            panic!("{req:?}")
        };
        assert_eq!(b[0].tool_use_id.as_deref(), Some("t1"));
        assert!(matches!(b[0].content, Some(AnthropicContent::Blocks(_))));
        assert_eq!(req.tool_choice.unwrap().kind, "any");
        let e = crate::openai::parse::<MessagesRequest>(
            br#"{"messages": [{"role": "user", "content": [{"type": 3}]}]}"#,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0].type"));
    }

    #[test]
    fn events_are_tagged_with_their_names() {
        let e = MessagesEvent::ContentBlockDelta {
            index: 1,
            delta: BlockDelta::InputJsonDelta {
                partial_json: "{".into(),
            },
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["type"], e.name());
        assert_eq!(v["delta"]["type"], "input_json_delta");
        let v = serde_json::to_value(MessagesEvent::MessageStop).unwrap();
        assert_eq!(v, json!({"type": "message_stop"}));
    }
}
