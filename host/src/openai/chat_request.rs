//! Request bodies: `POST /v1/chat/completions`, `POST /v1/completions`, `POST /update_weights`.
//! Only the fields a request sets are written. Reading ignores fields the types do not know; the
//! server checks a body's field names against [`super::fields`] first, so an unknown or
//! unsupported field is refused by name before these types read the rest. Numbers and booleans
//! are read laxly, as vLLM reads them ([`super::lax`]).

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::chat_response::ToolCall;

fn is_false(b: &bool) -> bool {
    !*b
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with token usage.
    #[serde(default, deserialize_with = "super::lax::boolean")]
    pub include_usage: bool,
}

/// The fields chat and text completions share: the model, sampling, limits, streaming and
/// vLLM's token-level extensions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerationParams {
    /// Served model name (checked against the server's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Samples per prompt.
    #[serde(
        default,
        deserialize_with = "super::lax::opt_number",
        skip_serializing_if = "Option::is_none"
    )]
    pub n: Option<usize>,
    /// Temperature (default 1).
    #[serde(
        default,
        deserialize_with = "super::lax::opt_number",
        skip_serializing_if = "Option::is_none"
    )]
    pub temperature: Option<f64>,
    /// Nucleus mass.
    #[serde(
        default,
        deserialize_with = "super::lax::opt_number",
        skip_serializing_if = "Option::is_none"
    )]
    pub top_p: Option<f64>,
    /// vLLM: top-k (-1 off).
    #[serde(
        default,
        deserialize_with = "super::lax::opt_number",
        skip_serializing_if = "Option::is_none"
    )]
    pub top_k: Option<i64>,
    /// vLLM: min-p.
    #[serde(
        default,
        deserialize_with = "super::lax::opt_number",
        skip_serializing_if = "Option::is_none"
    )]
    pub min_p: Option<f64>,
    /// vLLM: repetition penalty.
    #[serde(
        default,
        deserialize_with = "super::lax::opt_number",
        skip_serializing_if = "Option::is_none"
    )]
    pub repetition_penalty: Option<f64>,
    /// Subtracted from the logit of every token the output already has (-2 to 2).
    #[serde(
        default,
        deserialize_with = "super::lax::opt_number",
        skip_serializing_if = "Option::is_none"
    )]
    pub presence_penalty: Option<f64>,
    /// Subtracted × the token's count in the output so far (-2 to 2).
    #[serde(
        default,
        deserialize_with = "super::lax::opt_number",
        skip_serializing_if = "Option::is_none"
    )]
    pub frequency_penalty: Option<f64>,
    /// Token id (as a string key) → bias added to its logit (-100 to 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<std::collections::BTreeMap<String, f64>>,
    /// Most tokens to generate.
    #[serde(
        default,
        deserialize_with = "super::lax::opt_number",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_tokens: Option<i64>,
    /// Same, newer name (wins over `max_tokens`).
    #[serde(
        default,
        deserialize_with = "super::lax::opt_number",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_completion_tokens: Option<i64>,
    /// Stop strings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    /// vLLM: stop token ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_token_ids: Option<Vec<u32>>,
    /// vLLM: generate past end-of-sequence.
    #[serde(
        default,
        deserialize_with = "super::lax::boolean",
        skip_serializing_if = "is_false"
    )]
    pub ignore_eos: bool,
    /// vLLM: leave special tokens out of the text (default true).
    #[serde(
        default,
        deserialize_with = "super::lax::opt_boolean",
        skip_serializing_if = "Option::is_none"
    )]
    pub skip_special_tokens: Option<bool>,
    /// Seed for reproducible sampling.
    #[serde(
        default,
        deserialize_with = "super::lax::opt_number",
        skip_serializing_if = "Option::is_none"
    )]
    pub seed: Option<u64>,
    /// Server-sent events.
    #[serde(
        default,
        deserialize_with = "super::lax::boolean",
        skip_serializing_if = "is_false"
    )]
    pub stream: bool,
    /// Streaming options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// vLLM: log-prob tokens as `token_id:N`.
    #[serde(
        default,
        deserialize_with = "super::lax::boolean",
        skip_serializing_if = "is_false"
    )]
    pub return_tokens_as_token_ids: bool,
    /// vLLM: `prompt_token_ids` and per-choice `token_ids` in the response.
    #[serde(
        default,
        deserialize_with = "super::lax::boolean",
        skip_serializing_if = "is_false"
    )]
    pub return_token_ids: bool,
    /// vLLM: log-probs of the prompt's tokens. Not supported by rlhost's server: refused when
    /// set, so a client never reads a response that silently lacks what it asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Value>,
    /// vLLM: keep only the last N prompt tokens (`-1`: as many as leave room for `max_tokens`).
    #[serde(
        default,
        deserialize_with = "super::lax::opt_number",
        skip_serializing_if = "Option::is_none"
    )]
    pub truncate_prompt_tokens: Option<i64>,
    /// vLLM: the caller's id for the request, used in the response's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// Who speaks a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions.
    System,
    /// OpenAI's newer name for system instructions (read as `system`).
    Developer,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool's result.
    Tool,
}

impl Role {
    /// The name chat templates know (`developer` is `system`).
    pub fn template_name(self) -> &'static str {
        match self {
            Role::System | Role::Developer => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// One part of a message's content (`{"type": "text", "text": …}`; other kinds are read so
/// they can be refused by name).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContentPart {
    /// `text`, `image_url`, …
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a text part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// A message's content: a string or a list of parts.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Content parts.
    Parts(Vec<ContentPart>),
}

impl<'de> Deserialize<'de> for MessageContent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MessageContent;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or an array of content parts")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(MessageContent::Text(s.to_string()))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
                Ok(MessageContent::Text(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut parts = Vec::new();
                while let Some(p) = seq.next_element()? {
                    parts.push(p);
                }
                Ok(MessageContent::Parts(parts))
            }
        }
        d.deserialize_any(V)
    }
}

/// A chat message in a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who speaks.
    pub role: Role,
    /// The text (`null` for an assistant message that only calls tools).
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// The calls an assistant message made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// The call a tool message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A speaker's name (tool messages: the function's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant message's reasoning, kept apart from its content (vLLM's field, which
    /// reasoning models' chat templates read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    /// A message of `role` with text `content` and no tool calls, name or reasoning.
    pub fn text(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: Some(MessageContent::Text(content.into())),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            reasoning_content: None,
        }
    }
}

impl From<&rlhost_sdk::types::Message> for ChatMessage {
    fn from(m: &rlhost_sdk::types::Message) -> Self {
        use rlhost_sdk::types::Role as R;
        let role = match m.role {
            R::System => Role::System,
            R::User => Role::User,
            R::Assistant => Role::Assistant,
            R::Tool => Role::Tool,
        };
        let mut out = ChatMessage::text(role, m.content.clone());
        if !m.tool_calls.is_empty() {
            out.tool_calls = Some(
                m.tool_calls
                    .iter()
                    .map(|c| ToolCall::function(&c.id, &c.name, &c.arguments))
                    .collect(),
            );
        }
        out.tool_call_id = m.tool_call_id.clone();
        out
    }
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionDef {
    /// The function's name.
    pub name: String,
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

/// A tool in a request (`{"type": "function", "function": {…}}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDef {
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function.
    pub function: FunctionDef,
}

impl From<&rlhost_sdk::types::Tool> for ToolDef {
    /// An environment's tool; parameters that are not JSON become an empty object schema.
    fn from(t: &rlhost_sdk::types::Tool) -> Self {
        let params: Value = serde_json::from_str(&t.parameters)
            .unwrap_or_else(|_| serde_json::json!({"type": "object", "properties": {}}));
        ToolDef {
            kind: "function".into(),
            function: FunctionDef {
                name: t.name.clone(),
                description: Some(t.description.clone()),
                parameters: Some(params),
                strict: None,
            },
        }
    }
}

/// A function named in `tool_choice`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionName {
    /// The function's name.
    pub name: String,
}

/// `tool_choice: {"type": "function", "function": {"name": …}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamedToolChoice {
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function the model must call.
    pub function: FunctionName,
}

/// `tool_choice`: `"auto"`, `"none"`, `"required"`, or a named function.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ToolChoiceParam {
    /// A mode by name.
    Mode(String),
    /// A call to this function is forced.
    Named(NamedToolChoice),
}

/// `response_format.json_schema`: the schema the output must follow.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JsonSchemaFormat {
    /// The schema's name (OpenAI requires one; not used for decoding).
    #[serde(default)]
    pub name: String,
    /// What the format is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON schema (absent: any JSON value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// OpenAI's strict adherence flag; rlhost always enforces the schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// `response_format`: the shape the output must have.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    /// Free text (no constraint).
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON following a schema.
    JsonSchema {
        /// The schema.
        json_schema: JsonSchemaFormat,
    },
    /// vLLM's structural tags (read so they can be refused by name).
    StructuralTag(serde_json::Map<String, Value>),
}

/// vLLM's `structured_outputs` (0.11 on): one constraint on the output. Every key is read, so
/// those rlhost does not support are refused by name rather than ignored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StructuredOutputs {
    /// A JSON schema (an object, or its JSON text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<Value>,
    /// A regular expression the whole output matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    /// The output is exactly one of these strings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choice: Option<Vec<String>>,
    /// Any JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_object: Option<bool>,
    /// Every other key (`grammar`, `structural_tag`, `whitespace_pattern`, …).
    #[serde(flatten)]
    pub other: serde_json::Map<String, Value>,
}

/// The fields that constrain what a completion may say: OpenAI's `response_format`, vLLM's
/// `structured_outputs`, and vLLM's older `guided_*` fields (read so each is honoured or refused
/// by name).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OutputConstraints {
    /// OpenAI's response format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// vLLM: one structured-output constraint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_outputs: Option<StructuredOutputs>,
    /// vLLM (before 0.12): a JSON schema (an object, or its JSON text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_json: Option<Value>,
    /// vLLM (before 0.12): a regular expression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_regex: Option<String>,
    /// vLLM (before 0.12): one of these strings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_choice: Option<Vec<String>>,
    /// vLLM (before 0.12): a context-free grammar (refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_grammar: Option<Value>,
    /// vLLM (before 0.12): structural tags (refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structural_tag: Option<Value>,
    /// vLLM (before 0.12): the decoding backend (only llguidance's names are accepted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_decoding_backend: Option<String>,
    /// vLLM (before 0.12): JSON whitespace pattern (refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_whitespace_pattern: Option<String>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The conversation so far, oldest message first.
    #[serde(default)]
    pub messages: Vec<ChatMessage>,
    /// Model, sampling, limits and streaming.
    #[serde(flatten)]
    pub params: GenerationParams,
    /// Functions the model may call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<ToolDef>>,
    /// Whether and which tool must be called.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoiceParam>,
    /// Several calls in one turn (default true); false: at most one call is returned, exactly
    /// one when a call is forced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// Constraints on the output's shape.
    #[serde(flatten)]
    pub constraints: OutputConstraints,
    /// Return the sampled tokens' log-probs.
    #[serde(
        default,
        deserialize_with = "super::lax::boolean",
        skip_serializing_if = "is_false"
    )]
    pub logprobs: bool,
    /// With `logprobs`, this many alternatives per token (at most 20).
    #[serde(
        default,
        deserialize_with = "super::lax::opt_number",
        skip_serializing_if = "Option::is_none"
    )]
    pub top_logprobs: Option<usize>,
    /// How hard a reasoning model thinks (`low`, `medium`, `high`): passed to the chat template
    /// as `reasoning_effort`, refused for a template that does not read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
    /// Extra chat-template variables (`enable_thinking`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// End the prompt with the assistant's opening (default true).
    #[serde(
        default,
        deserialize_with = "super::lax::opt_boolean",
        skip_serializing_if = "Option::is_none"
    )]
    pub add_generation_prompt: Option<bool>,
    /// rlhost extension: the token ids of the conversation up to and including its last
    /// assistant message exactly as the model produced them (the previous turn's prompt and
    /// completion ids). The prompt is then these ids + the rendered messages after that
    /// assistant message, instead of a re-render of the whole history (which templates rewrite:
    /// Qwen3 drops earlier reasoning, tool calls re-serialise, text re-tokenises). Multi-turn
    /// rollouts stay one growing token stream: the prefix cache reuses every earlier turn and
    /// the trainer can merge the turns into one sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_token_ids: Option<Vec<u32>>,
}

/// `prompt`: text, token ids, or a list of either.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// One text.
    Text(String),
    /// One prompt as token ids.
    Ids(Vec<u32>),
    /// Several texts.
    Texts(Vec<String>),
    /// Several prompts as token ids.
    IdLists(Vec<Vec<u32>>),
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionRequest {
    /// The prompt(s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<Prompt>,
    /// Model, sampling, limits and streaming.
    #[serde(flatten)]
    pub params: GenerationParams,
    /// Legacy completions: the number of top tokens listed with each sampled token's log-prob
    /// (0 lists the sampled token alone); absent, no log-probs.
    #[serde(
        default,
        deserialize_with = "super::lax::opt_number",
        skip_serializing_if = "Option::is_none"
    )]
    pub logprobs: Option<usize>,
    /// Chat's field; present here it is refused rather than silently ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<Value>,
    /// Echo the prompt (not supported: refused).
    #[serde(
        default,
        deserialize_with = "super::lax::boolean",
        skip_serializing_if = "is_false"
    )]
    pub echo: bool,
    /// OpenAI's `best_of`: how many samples to generate, of which the `n` most likely are
    /// returned. Served at `n` (every sample is returned); less is refused with older vLLM's
    /// message; more (ranking and dropping samples) is refused by name, where vLLM 0.32, whose
    /// completion request no longer has the field, ignores it.
    #[serde(
        default,
        deserialize_with = "super::lax::opt_number",
        skip_serializing_if = "Option::is_none"
    )]
    pub best_of: Option<usize>,
    /// Constraints on the output's shape.
    #[serde(flatten)]
    pub constraints: OutputConstraints,
}

/// `POST /v1/load_lora_adapter` (vLLM's): serve the PEFT folder `lora_path` as `lora_name`;
/// `load_inplace` replaces the values of an adapter already loaded under that name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadLoraAdapterRequest {
    /// The name requests use (their `model`).
    pub lora_name: String,
    /// A PEFT folder (`adapter_config.json`, `adapter_model.safetensors`).
    pub lora_path: String,
    /// Replace the values of the adapter loaded as `lora_name` (vLLM's field; needed to
    /// reload a name).
    #[serde(default)]
    pub load_inplace: bool,
}

/// `POST /v1/unload_lora_adapter` (vLLM's): stop serving `lora_name`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnloadLoraAdapterRequest {
    /// The adapter's name.
    pub lora_name: String,
    /// vLLM's internal id of the adapter: accepted and not needed (the name decides).
    #[serde(default)]
    pub lora_int_id: Option<i64>,
}

/// `POST /update_weights`: load new weights from a folder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpdateWeightsRequest {
    /// A folder with `config.json` and safetensors.
    pub model_path: String,
}
