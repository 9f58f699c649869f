//! OpenAI's Responses API as types: the `POST /v1/responses` body ([`ResponsesRequest`]), the
//! response object ([`Response`]) with its output items, and the server-sent events of a
//! streamed response ([`StreamEvent`]). Field names follow openai-python's `types/responses` and
//! vLLM's `ResponsesRequest` (with its extras `top_k`, `min_p`, `repetition_penalty`, `seed`,
//! `skip_special_tokens`).
//!
//! Reading is as tolerant as the chat types: unknown fields are ignored, `null` is absent. A
//! field the server cannot honour is still read (as an opaque value when only its presence
//! matters), so the server can refuse it by name instead of dropping it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::chat_request::{MessageContent, Role};
use super::null_as_default;

fn is_false(b: &bool) -> bool {
    !*b
}

/// `POST /v1/responses`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResponsesRequest {
    /// Served model name (checked against the server's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The conversation: a user message as text, or a list of input items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<ResponseInput>,
    /// A system message put before the input (and before a previous response's turns: a
    /// previous response's instructions are not carried over, as on OpenAI's API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// Function tools (`{"type": "function", "name", "description", "parameters", "strict"}`);
    /// OpenAI's built-in tools are read so they can be refused by their type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<ResponseTool>>,
    /// `"auto"`, `"none"`, `"required"`, `{"type": "function", "name"}` or
    /// `{"type": "allowed_tools", "mode", "tools"}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ResponseToolChoice>,
    /// Sampling temperature (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus mass (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Most tokens to generate, reasoning included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<i64>,
    /// Most calls to built-in tools (this server runs none, so any limit holds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<i64>,
    /// Server-sent events.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "is_false"
    )]
    pub stream: bool,
    /// Streaming options (`include_obfuscation`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<ResponseStreamOptions>,
    /// `false`: at most one function call per response (the first the model makes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// Output text format (`{"format": {"type": "text"}}`) and verbosity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<TextConfig>,
    /// Reasoning options: `effort` reaches the chat template as `reasoning_effort`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<ReasoningConfig>,
    /// Continue a stored response: its input and output come before this request's input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_response_id: Option<String>,
    /// Keep the response for a later `previous_response_id` (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<bool>,
    /// Up to 16 string pairs, returned with the response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Map<String, Value>>,
    /// The end user (returned with the response).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// A stable end-user id (returned with the response).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safety_identifier: Option<String>,
    /// A caching hint (returned; this server caches every prompt prefix anyway).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cache_key: Option<String>,
    /// `"disabled"` (a prompt over the context is an error); `"auto"` is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncation: Option<String>,
    /// Extra output: `reasoning.encrypted_content` is honoured (the reasoning text, not
    /// encrypted, so it can be sent back); the others are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include: Option<Vec<String>>,
    /// Log-prob alternatives per token: only 0 (log-probs are refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<i64>,
    /// `"auto"` or `"default"`; the other tiers are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<String>,
    /// Run in the background: refused when true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background: Option<bool>,
    /// A stored prompt template: refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<Value>,
    /// A stored conversation: refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<Value>,
    /// Context compaction: refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_management: Option<Value>,
    /// Token biases: refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<Value>,
    /// Moderation of input and output: refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moderation: Option<Value>,
    /// Image input options: refused (text only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<Value>,
    /// Access programs: refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_programs: Option<Value>,
    /// Background run options: refused (as `background` is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background_options: Option<Value>,
    /// Explicit prompt caching: refused (the prefix cache is automatic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cache_options: Option<Value>,
    /// `in_memory` (what the prefix cache does); `24h` is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cache_retention: Option<String>,
    /// vLLM: top-k (-1 off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    /// vLLM: min-p.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f64>,
    /// vLLM: repetition penalty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f64>,
    /// vLLM: seed for reproducible sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// vLLM: leave special tokens out of the text (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_special_tokens: Option<bool>,
}

/// `input`: a user message as text, or input items.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ResponseInput {
    /// One user message.
    Text(String),
    /// Messages, function calls, their outputs and reasoning, in order.
    Items(Vec<InputItem>),
}

impl<'de> Deserialize<'de> for ResponseInput {
    /// By hand rather than `untagged`, so an error inside an item names its path
    /// (`input[2].arguments`) instead of "did not match any variant".
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ResponseInput;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or an array of input items")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(ResponseInput::Text(s.to_string()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(ResponseInput::Items(items))
            }
        }
        d.deserialize_any(V)
    }
}

/// One input item. The Responses API tells items apart by `type` (absent on a plain
/// `{"role", "content"}` message), so one struct reads them all and the server checks that the
/// fields its type needs are there:
/// - `message`: `role` and `content` (text, or `input_text` / `output_text` parts);
/// - `function_call`: `call_id`, `name`, `arguments` (JSON text) — a call the model made;
/// - `function_call_output`: `call_id`, `output` (text or `input_text` parts);
/// - `reasoning`: `content` (`reasoning_text` parts), `encrypted_content` or `summary`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InputItem {
    /// `message` (the default), `function_call`, `function_call_output`, `reasoning`, …
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The item's id (kept by clients that send output items back; not needed here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// A message's speaker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// A message's text or parts; a reasoning item's `reasoning_text` parts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<MessageContent>,
    /// A function call's id, which its output answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// A function call's function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A function call's arguments as JSON text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
    /// A function call output's result: text or `input_text` parts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<MessageContent>,
    /// A reasoning item's summary parts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<Vec<super::ContentPart>>,
    /// A reasoning item's content as this server returns it with
    /// `include: ["reasoning.encrypted_content"]` (the text itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted_content: Option<String>,
    /// The item's status, as output items carry it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// A tool in a request: Responses' flat function tool, or a built-in tool (read by `type` so it
/// can be refused).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseTool {
    /// `function`; `web_search`, `file_search`, … are refused.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Its arguments as a JSON schema object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// OpenAI's strict schema adherence flag (templates may read it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// A tool named inside `tool_choice`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolChoiceTool {
    /// `function` (others are built-in tools, refused).
    #[serde(rename = "type")]
    pub kind: String,
    /// The function's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `tool_choice` as an object: `{"type": "function", "name"}`, or `{"type": "allowed_tools",
/// "mode": "auto" | "required", "tools": [{"type": "function", "name"}, …]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolChoiceObject {
    /// `function` or `allowed_tools` (built-in tool types are refused).
    #[serde(rename = "type")]
    pub kind: String,
    /// The function a `function` choice forces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An `allowed_tools` choice's mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The tools an `allowed_tools` choice allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<ToolChoiceTool>>,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ResponseToolChoice {
    /// `auto`, `none`, `required`.
    Mode(String),
    /// A function, or a subset of the tools.
    Object(ToolChoiceObject),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResponseStreamOptions {
    /// Pad delta events with random characters: refused when true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_obfuscation: Option<bool>,
}

/// `text.format`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextFormat {
    /// `text`; `json_schema` and `json_object` are refused (no constrained decoding here).
    #[serde(rename = "type")]
    pub kind: String,
}

/// `text`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextConfig {
    /// The output format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<TextFormat>,
    /// `medium` (the model's own); `low` and `high` are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verbosity: Option<String>,
}

impl Default for TextConfig {
    fn default() -> Self {
        Self {
            format: Some(TextFormat {
                kind: "text".into(),
            }),
            verbosity: None,
        }
    }
}

/// `reasoning`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReasoningConfig {
    /// Passed to the chat template as `reasoning_effort` (as vLLM does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effort: Option<String>,
    /// `auto` (the server's choice: no summary); `concise` and `detailed` are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

/// A content part of an output item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputPart {
    /// Text of an assistant message.
    OutputText {
        /// The text.
        text: String,
        /// Citations (never any here).
        #[serde(default)]
        annotations: Vec<Value>,
        /// Token log-probs (never any here: log-probs are refused).
        #[serde(default)]
        logprobs: Vec<Value>,
    },
    /// Reasoning text.
    ReasoningText {
        /// The text.
        text: String,
    },
    /// A reasoning summary.
    SummaryText {
        /// The text.
        text: String,
    },
}

impl OutputPart {
    /// An `output_text` part holding `text`, with no annotations or log-probs.
    pub fn output_text(text: impl Into<String>) -> Self {
        OutputPart::OutputText {
            text: text.into(),
            annotations: Vec::new(),
            logprobs: Vec::new(),
        }
    }

    /// The part's text.
    pub fn text(&self) -> &str {
        match self {
            OutputPart::OutputText { text, .. }
            | OutputPart::ReasoningText { text }
            | OutputPart::SummaryText { text } => text,
        }
    }
}

/// An assistant message item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputMessage {
    /// `msg_…`.
    pub id: String,
    /// `assistant`.
    pub role: String,
    /// `in_progress`, `completed`, `incomplete`.
    pub status: String,
    /// `output_text` parts.
    pub content: Vec<OutputPart>,
}

/// A function call item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCallItem {
    /// `fc_…`.
    pub id: String,
    /// The id a `function_call_output` answers.
    pub call_id: String,
    /// The function.
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
    /// `in_progress`, `completed`, `incomplete`.
    pub status: String,
}

/// A reasoning item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReasoningItem {
    /// `rs_…`.
    pub id: String,
    /// Summary parts (none: this server does not summarise).
    #[serde(default)]
    pub summary: Vec<OutputPart>,
    /// `reasoning_text` parts.
    #[serde(default)]
    pub content: Vec<OutputPart>,
    /// With `include: ["reasoning.encrypted_content"]`: the reasoning text (not encrypted), to
    /// send back in a later request's input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted_content: Option<String>,
    /// `in_progress`, `completed`, `incomplete`.
    pub status: String,
}

/// An output item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// Assistant text.
    Message(OutputMessage),
    /// A call of a function tool.
    FunctionCall(FunctionCallItem),
    /// The model's reasoning, apart from its answer.
    Reasoning(ReasoningItem),
}

impl OutputItem {
    /// The item's id.
    pub fn id(&self) -> &str {
        match self {
            OutputItem::Message(m) => &m.id,
            OutputItem::FunctionCall(c) => &c.id,
            OutputItem::Reasoning(r) => &r.id,
        }
    }
}

/// Why a response `failed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseError {
    /// `server_error`, …
    pub code: String,
    /// What happened.
    pub message: String,
}

/// Why a response is `incomplete`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IncompleteDetails {
    /// `max_output_tokens` (or the context ran out).
    pub reason: String,
}

/// `usage.input_tokens_details`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InputTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u64,
}

/// `usage.output_tokens_details`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OutputTokensDetails {
    /// Tokens of the reasoning text (0 without reasoning).
    pub reasoning_tokens: u64,
}

/// A response's token counts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResponseUsage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Of which cached.
    pub input_tokens_details: InputTokensDetails,
    /// Generated tokens, reasoning included.
    pub output_tokens: u64,
    /// Of which reasoning.
    pub output_tokens_details: OutputTokensDetails,
    /// Their sum.
    pub total_tokens: u64,
}

/// A response (`object: "response"`). Request fields are returned as the server applied them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// `resp_…` (what `previous_response_id` names).
    pub id: String,
    /// `response`.
    pub object: String,
    /// Unix seconds.
    pub created_at: u64,
    /// `in_progress`, `completed`, `incomplete`, `failed`.
    pub status: String,
    /// Set when `failed`.
    #[serde(default)]
    pub error: Option<ResponseError>,
    /// Set when `incomplete`.
    #[serde(default)]
    pub incomplete_details: Option<IncompleteDetails>,
    /// The request's instructions.
    #[serde(default)]
    pub instructions: Option<String>,
    /// The request's metadata.
    #[serde(default)]
    pub metadata: Option<serde_json::Map<String, Value>>,
    /// The served model.
    pub model: String,
    /// Reasoning, message and function call items, in the order the model produced them.
    pub output: Vec<OutputItem>,
    /// Whether several function calls may come back.
    pub parallel_tool_calls: bool,
    /// The request's temperature.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// The request's top-p.
    #[serde(default)]
    pub top_p: Option<f64>,
    /// The request's tool choice (`auto` when it gave none).
    pub tool_choice: ResponseToolChoice,
    /// The request's tools.
    #[serde(default, deserialize_with = "null_as_default")]
    pub tools: Vec<ResponseTool>,
    /// The request's token limit.
    #[serde(default)]
    pub max_output_tokens: Option<i64>,
    /// The request's built-in tool call limit.
    #[serde(default)]
    pub max_tool_calls: Option<i64>,
    /// The response this one continues.
    #[serde(default)]
    pub previous_response_id: Option<String>,
    /// The request's reasoning options.
    #[serde(default)]
    pub reasoning: Option<ReasoningConfig>,
    /// The service tier (`default`).
    #[serde(default)]
    pub service_tier: Option<String>,
    /// Whether the response is kept for `previous_response_id`.
    #[serde(default)]
    pub store: bool,
    /// Output text format.
    #[serde(default)]
    pub text: Option<TextConfig>,
    /// `disabled`.
    #[serde(default)]
    pub truncation: Option<String>,
    /// Always false.
    #[serde(default)]
    pub background: bool,
    /// The request's user.
    #[serde(default)]
    pub user: Option<String>,
    /// The request's safety identifier.
    #[serde(default)]
    pub safety_identifier: Option<String>,
    /// The request's prompt cache key.
    #[serde(default)]
    pub prompt_cache_key: Option<String>,
    /// Token counts (absent until the response ends).
    #[serde(default)]
    pub usage: Option<ResponseUsage>,
    /// rlhost: the policy version of the weights that generated the last token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<u64>,
}

impl Response {
    /// The text of the output's `output_text` parts, joined (openai-python's `output_text`).
    pub fn output_text(&self) -> String {
        let mut out = String::new();
        for item in &self.output {
            if let OutputItem::Message(m) = item {
                for p in &m.content {
                    if let OutputPart::OutputText { text, .. } = p {
                        out.push_str(text);
                    }
                }
            }
        }
        out
    }
}

/// A streamed response's event: its kind and payload, numbered in order from 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamEvent {
    /// Position in the stream.
    pub sequence_number: u64,
    /// What happened.
    #[serde(flatten)]
    pub kind: StreamEventKind,
}

/// What a [`StreamEvent`] says, tagged by its `type` (also the SSE `event:` name).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum StreamEventKind {
    /// The response exists (`status: in_progress`, no output yet).
    #[serde(rename = "response.created")]
    Created {
        /// The response so far.
        response: Box<Response>,
    },
    /// Generation has begun.
    #[serde(rename = "response.in_progress")]
    InProgress {
        /// The response so far.
        response: Box<Response>,
    },
    /// The whole response.
    #[serde(rename = "response.completed")]
    Completed {
        /// The response.
        response: Box<Response>,
    },
    /// The whole response, cut short (`incomplete_details` says why).
    #[serde(rename = "response.incomplete")]
    Incomplete {
        /// The response.
        response: Box<Response>,
    },
    /// The response failed (`error` says why).
    #[serde(rename = "response.failed")]
    Failed {
        /// The response.
        response: Box<Response>,
    },
    /// An output item begins.
    #[serde(rename = "response.output_item.added")]
    OutputItemAdded {
        /// Its position in `output`.
        output_index: usize,
        /// The item so far.
        item: OutputItem,
    },
    /// An output item is whole.
    #[serde(rename = "response.output_item.done")]
    OutputItemDone {
        /// Its position in `output`.
        output_index: usize,
        /// The item.
        item: OutputItem,
    },
    /// A content part of an item begins.
    #[serde(rename = "response.content_part.added")]
    ContentPartAdded {
        /// The item's id.
        item_id: String,
        /// The item's position.
        output_index: usize,
        /// The part's position in the item.
        content_index: usize,
        /// The part so far (empty).
        part: OutputPart,
    },
    /// A content part is whole.
    #[serde(rename = "response.content_part.done")]
    ContentPartDone {
        /// The item's id.
        item_id: String,
        /// The item's position.
        output_index: usize,
        /// The part's position in the item.
        content_index: usize,
        /// The part.
        part: OutputPart,
    },
    /// New message text.
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta {
        /// The item's id.
        item_id: String,
        /// The item's position.
        output_index: usize,
        /// The part's position.
        content_index: usize,
        /// The new text.
        delta: String,
        /// Its log-probs (none here).
        logprobs: Vec<Value>,
    },
    /// A message part's whole text.
    #[serde(rename = "response.output_text.done")]
    OutputTextDone {
        /// The item's id.
        item_id: String,
        /// The item's position.
        output_index: usize,
        /// The part's position.
        content_index: usize,
        /// The text.
        text: String,
        /// Its log-probs (none here).
        logprobs: Vec<Value>,
    },
    /// New reasoning text.
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningTextDelta {
        /// The item's id.
        item_id: String,
        /// The item's position.
        output_index: usize,
        /// The part's position.
        content_index: usize,
        /// The new text.
        delta: String,
    },
    /// A reasoning part's whole text.
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningTextDone {
        /// The item's id.
        item_id: String,
        /// The item's position.
        output_index: usize,
        /// The part's position.
        content_index: usize,
        /// The text.
        text: String,
    },
    /// More of a function call's arguments.
    #[serde(rename = "response.function_call_arguments.delta")]
    FunctionCallArgumentsDelta {
        /// The item's id.
        item_id: String,
        /// The item's position.
        output_index: usize,
        /// The new text.
        delta: String,
    },
    /// A function call's whole arguments.
    #[serde(rename = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone {
        /// The item's id.
        item_id: String,
        /// The item's position.
        output_index: usize,
        /// The function.
        name: String,
        /// The arguments as JSON text.
        arguments: String,
    },
}

impl StreamEventKind {
    /// The event's `type`, which is also its SSE `event:` name.
    pub fn name(&self) -> &'static str {
        match self {
            StreamEventKind::Created { .. } => "response.created",
            StreamEventKind::InProgress { .. } => "response.in_progress",
            StreamEventKind::Completed { .. } => "response.completed",
            StreamEventKind::Incomplete { .. } => "response.incomplete",
            StreamEventKind::Failed { .. } => "response.failed",
            StreamEventKind::OutputItemAdded { .. } => "response.output_item.added",
            StreamEventKind::OutputItemDone { .. } => "response.output_item.done",
            StreamEventKind::ContentPartAdded { .. } => "response.content_part.added",
            StreamEventKind::ContentPartDone { .. } => "response.content_part.done",
            StreamEventKind::OutputTextDelta { .. } => "response.output_text.delta",
            StreamEventKind::OutputTextDone { .. } => "response.output_text.done",
            StreamEventKind::ReasoningTextDelta { .. } => "response.reasoning_text.delta",
            StreamEventKind::ReasoningTextDone { .. } => "response.reasoning_text.done",
            StreamEventKind::FunctionCallArgumentsDelta { .. } => {
                "response.function_call_arguments.delta"
            }
            StreamEventKind::FunctionCallArgumentsDone { .. } => {
                "response.function_call_arguments.done"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn input_items_read_messages_calls_outputs_and_reasoning() {
        let req: ResponsesRequest = crate::openai::parse(
            json!({"model": "m", "input": [
                {"role": "user", "content": "hi"},
                {"type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": "a", "annotations": []}]},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "42"},
                {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "r"}]},
            ], "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
               "tool_choice": {"type": "function", "name": "f"}})
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        let Some(ResponseInput::Items(items)) = &req.input else {
            panic!("{req:?}")
        };
        assert_eq!(items.len(), 5);
        assert_eq!(items[0].role, Some(Role::User));
        assert_eq!(items[2].arguments.as_deref(), Some("{}"));
        assert_eq!(
            items[3].output,
            Some(MessageContent::Text("42".into())),
            "{items:?}"
        );
        assert_eq!(
            req.tool_choice,
            Some(ResponseToolChoice::Object(ToolChoiceObject {
                kind: "function".into(),
                name: Some("f".into()),
                mode: None,
                tools: None
            }))
        );
        let text: ResponsesRequest = crate::openai::parse(br#"{"input": "hi"}"#).unwrap();
        assert_eq!(text.input, Some(ResponseInput::Text("hi".into())));
    }

    #[test]
    fn events_carry_their_type_and_sequence_number() {
        let e = StreamEvent {
            sequence_number: 3,
            kind: StreamEventKind::OutputTextDelta {
                item_id: "msg_1".into(),
                output_index: 0,
                content_index: 0,
                delta: "4".into(),
                logprobs: Vec::new(),
            },
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["type"], e.kind.name());
        assert_eq!(v["sequence_number"], 3);
        assert_eq!(v["delta"], "4");
        let item = OutputItem::FunctionCall(FunctionCallItem {
            id: "fc_1".into(),
            call_id: "c".into(),
            name: "f".into(),
            arguments: "{}".into(),
            status: "completed".into(),
        });
        let v = serde_json::to_value(&item).unwrap();
        assert_eq!(v["type"], "function_call");
        assert_eq!(
            serde_json::to_value(OutputPart::output_text("x")).unwrap(),
            json!({"type": "output_text", "text": "x", "annotations": [], "logprobs": []})
        );
    }
}
