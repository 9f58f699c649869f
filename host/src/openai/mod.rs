//! The wire formats as types, one file per dialect: OpenAI's chat and text completion requests
//! (`chat_request.rs`, with vLLM's extensions that RL clients use and rlhost's
//! `history_token_ids`) and their responses and stream chunks (`chat_response.rs`), OpenAI's
//! Responses API ([`responses`]), Anthropic's Messages API ([`anthropic`]), token-in generation
//! (`generate.rs`: vLLM's and prime-rl's routes), the model list, weight-update bodies and error
//! bodies ([`ApiError`]).
//!
//! One set of types serves both ends of the seam between the rollout loop and a model: the
//! server parses requests into them and builds its responses from them, the in-process
//! generator hands a [`ChatRequest`] to the chat pipeline ([`crate::chat`]) and reads its typed
//! answer, and the HTTP client serialises the same request and reads any OpenAI-compatible
//! server's response into the same [`ChatCompletion`]. Reading is tolerant where the wire is
//! (`null` stands for absent, numbers may come as strings as vLLM allows; unknown request fields
//! are refused by name by [`fields`] before the types read a body) and strict where it must be: a
//! response without `choices`, a choice without `message` or `finish_reason`, is an error at
//! the seam, not an empty value found later.

pub mod anthropic;
mod chat_request;
mod chat_response;
mod error;
pub mod fields;
mod generate;
pub mod lax;
pub mod responses;

pub use chat_request::{
    ChatMessage, ChatRequest, CompletionRequest, ContentPart, FunctionDef, FunctionName,
    GenerationParams, JsonSchemaFormat, LoadLoraAdapterRequest, MessageContent, NamedToolChoice,
    OutputConstraints, Prompt, ResponseFormat, Role, Stop, StreamOptions, StructuredOutputs,
    ToolChoiceParam, ToolDef, UnloadLoraAdapterRequest, UpdateWeightsRequest,
};
pub use chat_response::{
    ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, ChatLogprobs, Delta,
    FunctionCall, FunctionCallDelta, ModelCard, ModelList, PromptTokensDetails, ResponseHeader,
    ResponseMessage, StopReason, TextChoice, TextChunkChoice, TextCompletion, TextCompletionChunk,
    TextLogprobs, TokenLogprob, ToolCall, ToolCallChunk, TopLogprob, TopLogprobMap,
    UpdateWeightsResponse, Usage,
};
pub use error::{ApiError, ErrorBody, ErrorDetail};
pub use generate::{
    ChatTokensRequest, GenerateChoice, GenerateRequest, GenerateResponse, GenerateStreamResponse,
    SamplingParamsBody,
};

use serde::{Deserialize, Deserializer};

/// Reads `null` as the type's default (`[]`, `""`, `false`), as many servers write `null` for an
/// empty list.
pub(crate) fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Parses a JSON body into `T`, naming the field a type error is in: the error's `param` is the
/// path (`messages[0].role`), its message says what was expected.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            ApiError::bad(None, format!("the request body is not valid JSON: {inner}"))
        } else if path == "." {
            ApiError::bad(None, format!("invalid request: {inner}"))
        } else {
            ApiError::bad(Some(path.clone()), format!("invalid {path}: {inner}"))
        }
    })
}

/// Parses a response body from a server into `T`, naming the missing or mistyped field
/// (`choices[0].message: missing field …`).
pub fn parse_response<T: serde::de::DeserializeOwned>(body: &str) -> Result<T, String> {
    let de = &mut serde_json::Deserializer::from_str(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let shown: String = body.chars().take(300).collect();
        if path == "." {
            format!("{inner}: {shown}")
        } else {
            format!("{path}: {inner}: {shown}")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_request_round_trips_with_only_the_fields_set() {
        let req = ChatRequest {
            messages: vec![ChatMessage::text(Role::User, "hi")],
            params: GenerationParams {
                model: Some("m".into()),
                max_tokens: Some(8),
                seed: Some(3),
                return_token_ids: true,
                ..Default::default()
            },
            logprobs: true,
            ..Default::default()
        };
        let v = serde_json::to_value(&req).unwrap();
        assert_eq!(
            v,
            json!({"messages": [{"role": "user", "content": "hi"}], "model": "m",
                   "max_tokens": 8, "seed": 3, "return_token_ids": true, "logprobs": true})
        );
        let back: ChatRequest = parse(v.to_string().as_bytes()).unwrap();
        assert_eq!(back.params.max_tokens, Some(8));
        assert_eq!(back.messages[0].role, Role::User);
    }

    #[test]
    fn request_errors_name_the_field() {
        let e = parse::<ChatRequest>(br#"{"messages": [{"role": "robot"}]}"#).unwrap_err();
        assert_eq!(
            e.param.as_deref(),
            Some("messages[0].role"),
            "{}",
            e.message
        );
        let e = parse::<ChatRequest>(br#"{"messages": [], "logprobs": 2}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logprobs"), "{}", e.message);
        let e = parse::<GenerationParams>(br#"{"max_tokens": "ten"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"), "{}", e.message);
        let e =
            parse::<ChatRequest>(br#"{"messages": [{"role": "user", "content": 3}]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content"));
        assert!(
            e.message.contains("a string or an array of content parts"),
            "{}",
            e.message
        );
    }

    #[test]
    fn responses_tolerate_unknown_fields_and_refuse_missing_required_ones() {
        let ok = json!({"id": "x", "object": "chat.completion", "created": 1, "model": "m",
            "system_fingerprint": "fp", "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "4", "tool_calls": null, "refusal": null},
            "logprobs": null}], "usage": {"prompt_tokens": 3, "completion_tokens": 1,
            "total_tokens": 4}});
        let c: ChatCompletion = parse_response(&ok.to_string()).unwrap();
        assert_eq!(c.choices[0].message.content.as_deref(), Some("4"));
        assert!(c.choices[0].message.tool_calls.is_empty());
        assert_eq!(c.usage.unwrap().total_tokens, 4);
        let mut bad = ok.clone();
        bad.as_object_mut().unwrap().remove("choices");
        let e = parse_response::<ChatCompletion>(&bad.to_string()).unwrap_err();
        assert!(e.contains("missing field `choices`"), "{e}");
        let mut bad = ok;
        bad["choices"][0].as_object_mut().unwrap().remove("message");
        let e = parse_response::<ChatCompletion>(&bad.to_string()).unwrap_err();
        assert!(
            e.starts_with("choices[0]") && e.contains("`message`"),
            "{e}"
        );
    }

    #[test]
    fn tool_call_arguments_read_as_text_or_object() {
        let m: ChatMessage = serde_json::from_value(json!({"role": "assistant", "content": null,
            "tool_calls": [{"id": "c", "type": "function",
                            "function": {"name": "f", "arguments": {"x": 1}}}]}))
        .unwrap();
        let calls = m.tool_calls.unwrap();
        assert_eq!(calls[0].function.arguments, r#"{"x":1}"#);
    }

    #[test]
    fn top_logprob_maps_keep_their_order() {
        let m = TopLogprobMap(vec![("b".into(), -0.5), ("a".into(), -1.0)]);
        let text = serde_json::to_string(&m).unwrap();
        assert_eq!(text, r#"{"b":-0.5,"a":-1.0}"#);
        let back: TopLogprobMap = serde_json::from_str(&text).unwrap();
        assert_eq!(back, m);
    }
}
