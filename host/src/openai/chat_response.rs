//! Response bodies and stream chunks. Fields OpenAI requires are required when reading (a
//! response without them is an error naming the field); rlhost's and vLLM's extensions
//! (`policy_version`, `token_ids`, `prompt_token_ids`, `tool_call_error`) are optional, so any
//! OpenAI-compatible server's responses read.

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::null_as_default;

/// What every response and stream chunk starts with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseHeader {
    /// The response's id (the same in every chunk of a stream).
    pub id: String,
    /// `chat.completion`, `chat.completion.chunk`, `text_completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model.
    pub model: String,
}

/// A function call as the model made it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// The function's name.
    pub name: String,
    /// The arguments as JSON text. Read from text or, as some clients send, a JSON object
    /// (kept as its text).
    #[serde(deserialize_with = "text_or_json")]
    pub arguments: String,
}

fn text_or_json<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    })
}

/// A tool call in an assistant message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id (tool messages answer it by `tool_call_id`).
    #[serde(default)]
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    /// The call.
    pub function: FunctionCall,
}

fn function_kind() -> String {
    "function".into()
}

impl ToolCall {
    /// A `function` call of `name` with `arguments` (JSON text); tool messages answer it by `id`.
    pub fn function(id: &str, name: &str, arguments: &str) -> Self {
        Self {
            id: id.to_string(),
            kind: function_kind(),
            function: FunctionCall {
                name: name.to_string(),
                arguments: arguments.to_string(),
            },
        }
    }
}

/// A piece of a tool call in a stream chunk (OpenAI's delta shape, with its index): the call's
/// first piece has `id`, `type` and `function.name`; later pieces of the same `index` carry
/// text to append to `function.arguments`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallChunk {
    /// Position among the choice's calls.
    pub index: usize,
    /// The call's id (first piece).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Always `function` (first piece).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The function's name and/or a piece of its arguments.
    pub function: FunctionCallDelta,
}

/// What a stream chunk adds to a call's function.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FunctionCallDelta {
    /// The function's name (first piece).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Text to append to the arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// The assistant's message in a chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseMessage {
    /// Always `assistant`.
    pub role: String,
    /// The text (`null` when there is none).
    #[serde(default)]
    pub content: Option<String>,
    /// Parsed tool calls (`[]` when none; `null` and absent read as none).
    #[serde(default, deserialize_with = "null_as_default")]
    pub tool_calls: Vec<ToolCall>,
    /// Reasoning kept apart from the content, on servers that split it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

/// One alternative token and its log-prob.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    /// The token's text (or `token_id:N`).
    pub token: String,
    /// Its log-prob.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    #[serde(default)]
    pub bytes: Option<Vec<u8>>,
}

/// A sampled token's log-prob with its alternatives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// The token's text (or `token_id:N`).
    pub token: String,
    /// Its log-prob under the sampler.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    #[serde(default)]
    pub bytes: Option<Vec<u8>>,
    /// The most likely tokens at this position.
    #[serde(default, deserialize_with = "null_as_default")]
    pub top_logprobs: Vec<TopLogprob>,
}

/// A chat choice's log-probs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    #[serde(default, deserialize_with = "null_as_default")]
    pub content: Vec<TokenLogprob>,
}

/// vLLM's `stop_reason`: the stop string or token id that ended a choice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StopReason {
    /// A stop token id.
    Token(u32),
    /// A stop string.
    Text(String),
}

/// One choice of a chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    /// Position among the request's `n` samples.
    pub index: usize,
    /// The assistant's message.
    pub message: ResponseMessage,
    /// Log-probs, when asked for.
    #[serde(default)]
    pub logprobs: Option<ChatLogprobs>,
    /// `stop`, `length`, `tool_calls`, `abort`.
    pub finish_reason: String,
    /// vLLM: what stopped it.
    #[serde(default)]
    pub stop_reason: Option<StopReason>,
    /// rlhost: the policy version of the weights that generated the choice's last token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<u64>,
    /// rlhost: why the output could not be read as tool calls, when it looked like some.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_error: Option<String>,
    /// vLLM (`return_token_ids`): the generated token ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// Prompt token details.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    #[serde(default)]
    pub cached_tokens: u64,
}

/// Token counts of a request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens (all prompts, once each).
    pub prompt_tokens: u64,
    /// Generated tokens (all samples).
    pub completion_tokens: u64,
    /// Their sum.
    pub total_tokens: u64,
    /// Cached prompt tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

impl Usage {
    /// Counts, `cached` of the prompt tokens from the prefix cache.
    pub fn new(prompt: u64, completion: u64, cached: u64) -> Self {
        Self {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            prompt_tokens_details: Some(PromptTokensDetails {
                cached_tokens: cached,
            }),
        }
    }

    /// Cached prompt tokens (0 when the server does not say).
    pub fn cached_tokens(&self) -> u64 {
        self.prompt_tokens_details
            .as_ref()
            .map_or(0, |d| d.cached_tokens)
    }
}

/// A chat completion (`object: "chat.completion"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletion {
    /// Id, object kind, time, model.
    #[serde(flatten)]
    pub header: ResponseHeader,
    /// One per sample.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    #[serde(default)]
    pub usage: Option<Usage>,
    /// rlhost: the newest policy version among the choices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<u64>,
    /// vLLM (`return_token_ids`): the prompt as the server tokenized it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// What a stream chunk adds to a chat choice.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    /// `assistant`, in a choice's first chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// New text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// vLLM (`--reasoning-parser`): new reasoning text (what the model wrote inside
    /// `<think>…</think>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool calls: a call's first delta has its `id`, `type` and `function.name` (arguments
    /// empty); later deltas of the same `index` carry pieces of `function.arguments` to append.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallChunk>>,
    /// vLLM (`return_token_ids`): the new token ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// One choice's part of a chat stream chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChunkChoice {
    /// Which choice it adds to.
    pub index: usize,
    /// What it adds.
    pub delta: Delta,
    /// The new tokens' log-probs, when asked for.
    #[serde(default)]
    pub logprobs: Option<ChatLogprobs>,
    /// Set in the choice's last chunk.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// vLLM: what stopped it (a stop string or stop token id), in the choice's last chunk.
    #[serde(default)]
    pub stop_reason: Option<StopReason>,
    /// rlhost: the policy version, in the choice's last chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<u64>,
    /// rlhost: why the output could not be read as tool calls, in the last chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_error: Option<String>,
}

/// A chat stream chunk (`object: "chat.completion.chunk"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionChunk {
    /// Id, object kind, time, model.
    #[serde(flatten)]
    pub header: ResponseHeader,
    /// The choices this chunk adds to (none in the usage chunk).
    pub choices: Vec<ChatChunkChoice>,
    /// Token counts, in the last chunk when `stream_options.include_usage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// Alternatives at one position of a text completion: token text → log-prob, in the order the
/// server ranks them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopLogprobMap(pub Vec<(String, f32)>);

impl Serialize for TopLogprobMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for TopLogprobMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TopLogprobMap;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of token text to log-prob")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry()? {
                    out.push((k, v));
                }
                Ok(TopLogprobMap(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// A text choice's log-probs (legacy completions: parallel lists).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TextLogprobs {
    /// The tokens' texts.
    pub tokens: Vec<String>,
    /// Their log-probs.
    pub token_logprobs: Vec<f32>,
    /// Alternatives per position.
    #[serde(default, deserialize_with = "null_as_default")]
    pub top_logprobs: Vec<TopLogprobMap>,
    /// Each token's offset in the text (absent in stream chunks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_offset: Option<Vec<usize>>,
}

/// One choice of a text completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextChoice {
    /// Position: prompt `k`, sample `i` is `k * n + i`.
    pub index: usize,
    /// The generated text.
    pub text: String,
    /// Log-probs, when asked for.
    #[serde(default)]
    pub logprobs: Option<TextLogprobs>,
    /// `stop`, `length`, `abort`.
    pub finish_reason: String,
    /// vLLM: what stopped it.
    #[serde(default)]
    pub stop_reason: Option<StopReason>,
    /// rlhost: the policy version.
    #[serde(default)]
    pub policy_version: Option<u64>,
    /// vLLM (`return_token_ids`): the generated token ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    /// vLLM (`return_token_ids`): this choice's prompt ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// A text completion (`object: "text_completion"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextCompletion {
    /// Id, object kind, time, model.
    #[serde(flatten)]
    pub header: ResponseHeader,
    /// One per prompt and sample.
    pub choices: Vec<TextChoice>,
    /// Token counts.
    #[serde(default)]
    pub usage: Option<Usage>,
    /// rlhost: the newest policy version among the choices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<u64>,
    /// vLLM (`return_token_ids`): every prompt's ids, concatenated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// One choice's part of a text stream chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextChunkChoice {
    /// Which choice it adds to.
    pub index: usize,
    /// New text.
    pub text: String,
    /// The new token's log-probs, when asked for.
    #[serde(default)]
    pub logprobs: Option<TextLogprobs>,
    /// Set in the choice's last chunk.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// vLLM: what stopped it (a stop string or stop token id), in the choice's last chunk.
    #[serde(default)]
    pub stop_reason: Option<StopReason>,
}

/// A text completion stream chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextCompletionChunk {
    /// Id, object kind, time, model.
    #[serde(flatten)]
    pub header: ResponseHeader,
    /// The choices this chunk adds to (none in the usage chunk).
    pub choices: Vec<TextChunkChoice>,
    /// Token counts, in the last chunk when `stream_options.include_usage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A model the server serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCard {
    /// The name requests use.
    pub id: String,
    /// `model`.
    #[serde(default)]
    pub object: String,
    /// Unix seconds when the server started.
    #[serde(default)]
    pub created: u64,
    /// Who serves it.
    #[serde(default)]
    pub owned_by: String,
    /// vLLM: the model it was loaded from (an adapter's PEFT folder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// vLLM: the base model of an adapter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// vLLM: the longest prompt + completion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<usize>,
    /// rlhost: the policy version of the weights served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<u64>,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelList {
    /// `list`.
    #[serde(default)]
    pub object: String,
    /// The models.
    pub data: Vec<ModelCard>,
}

/// `POST /update_weights`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpdateWeightsResponse {
    /// `ok`.
    pub status: String,
    /// The policy version now served (rlhost; other servers may not say).
    #[serde(default)]
    pub policy_version: Option<u64>,
}
