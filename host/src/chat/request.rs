//! What the server makes of a typed request: engine sampling parameters, the prompt fitted to
//! the context, the tool plan, and the chat template's input, each refused with a 400 naming the
//! field when it cannot be honoured.

use serde_json::{Value, json};

use crate::engine::SamplingParams;
use crate::openai::{
    ApiError, ChatMessage, GenerationParams, MessageContent, Stop, ToolChoiceParam, ToolDef,
};

/// The engine's parameters for `p`; `top_logprobs` from the endpoint's own field; `vocab` the
/// model's vocabulary size (`logit_bias` keys must be token ids below it).
pub fn sampling_params(
    p: &GenerationParams,
    top_logprobs: usize,
    vocab: usize,
) -> Result<SamplingParams, ApiError> {
    let mut logit_bias = Vec::new();
    for (key, &bias) in p.logit_bias.iter().flatten() {
        let param = || Some(format!("logit_bias.{key}"));
        let id = key.trim().parse::<u32>().map_err(|_| {
            ApiError::bad(
                param(),
                format!("logit_bias keys are token ids (integers as strings), got {key:?}"),
            )
        })?;
        if id as usize >= vocab {
            return Err(ApiError::bad(
                param(),
                format!(
                    "token_id {id} in logit_bias contains out-of-vocab token id; the vocabulary has {vocab} tokens"
                ),
            ));
        }
        if !(bias.is_finite() && (-100.0..=100.0).contains(&bias)) {
            return Err(ApiError::bad(
                param(),
                format!("logit_bias values must be in [-100, 100], got {bias} for token {id}"),
            ));
        }
        logit_bias.push((id, bias as f32));
    }
    if p.prompt_logprobs.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(ApiError::bad(
            Some("prompt_logprobs".into()),
            "prompt_logprobs is not supported by this server",
        ));
    }
    let max_tokens = match (p.max_completion_tokens, p.max_tokens) {
        (Some(m), _) => Some(("max_completion_tokens", m)),
        (None, Some(m)) => Some(("max_tokens", m)),
        _ => None,
    };
    let max_tokens = match max_tokens {
        Some((name, m)) if m < 1 => {
            return Err(ApiError::bad(
                Some(name.to_string()),
                format!("{name} must be at least 1, got {m}"),
            ));
        }
        Some((_, m)) => Some(m as usize),
        None => None,
    };
    let out = SamplingParams {
        temperature: p.temperature.unwrap_or(1.0),
        top_p: p.top_p.unwrap_or(1.0),
        top_k: p.top_k.unwrap_or(-1),
        min_p: p.min_p.unwrap_or(0.0),
        repetition_penalty: p.repetition_penalty.unwrap_or(1.0),
        frequency_penalty: p.frequency_penalty.unwrap_or(0.0),
        presence_penalty: p.presence_penalty.unwrap_or(0.0),
        logit_bias,
        seed: p.seed,
        max_tokens,
        stop: match &p.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        },
        stop_token_ids: p.stop_token_ids.clone().unwrap_or_default(),
        ignore_eos: p.ignore_eos,
        top_logprobs,
        skip_special_tokens: p.skip_special_tokens.unwrap_or(true),
        constraint: None,
    };
    checked(out)
}

/// `params` with a grammar constraint ([`super::constrain`]), checked again.
pub fn constrained(
    mut params: SamplingParams,
    constraint: Option<std::sync::Arc<crate::engine::grammar::Constraint>>,
) -> Result<SamplingParams, ApiError> {
    params.constraint = constraint;
    checked(params)
}

/// `p` if valid; else a 400 naming the parameter its message starts with.
fn checked(p: SamplingParams) -> Result<SamplingParams, ApiError> {
    p.validate().map_err(|e| {
        let param = e.split_whitespace().next().map(str::to_string);
        ApiError::bad(param, e)
    })?;
    Ok(p)
}

/// vLLM's 400 for a request that breaks a limit: `type` `BadRequestError`, `param` the
/// culprit, and vLLM's ` (parameter=…, value=…)` suffix on the message.
fn limit_error(param: &str, value: impl std::fmt::Display, message: String) -> ApiError {
    ApiError {
        status: 400,
        kind: "BadRequestError",
        message: format!("{message} (parameter={param}, value={value})"),
        param: Some(param.to_string()),
    }
}

/// The prompt of a chat or text completion made to fit as vLLM 0.32 does (measured against the
/// real server): `truncate_prompt_tokens` keeps the last N tokens (`-1`: as many as leave room
/// for the requested output); `max_tokens` above `max_model_len` is refused; a prompt that fills
/// the context is refused; otherwise generation stops at the context's end. Errors carry vLLM's
/// words, status and `param`.
pub fn fit_prompt(
    mut ids: Vec<u32>,
    p: &GenerationParams,
    max_model_len: usize,
) -> Result<Vec<u32>, ApiError> {
    let (name, requested) = match (p.max_completion_tokens, p.max_tokens) {
        (Some(m), _) => ("max_completion_tokens", m),
        (None, Some(m)) => ("max_tokens", m),
        (None, None) => ("max_tokens", 0),
    };
    let out = requested.max(0) as usize;
    if out > max_model_len {
        return Err(limit_error(
            name,
            out,
            format!(
                "{name}={out} cannot be greater than max_model_len={max_model_len}. Please request fewer output tokens."
            ),
        ));
    }
    let max_input = max_model_len - out;
    match p.truncate_prompt_tokens {
        None => {}
        Some(n) if n < -1 => {
            return Err(ApiError::bad(
                Some("truncate_prompt_tokens".into()),
                format!("truncate_prompt_tokens must be -1 or at least 0, got {n}"),
            ));
        }
        Some(n) => {
            let keep = if n == -1 { max_input } else { n as usize };
            if keep > max_input {
                return Err(limit_error(
                    "truncate_prompt_tokens",
                    keep,
                    format!(
                        "truncate_prompt_tokens={keep} cannot be greater than max_model_len - {name} = {max_input}. Please request a smaller truncation size."
                    ),
                ));
            }
            let drop = ids.len().saturating_sub(keep);
            ids.drain(..drop);
        }
    }
    // As vLLM 0.32 (measured): a prompt that leaves room to generate is served, `max_tokens`
    // or not, and generation stops at the context's end (`finish_reason: "length"`); a prompt
    // that fills the context is refused.
    let prompt = ids.len();
    if prompt > max_model_len {
        return Err(limit_error(
            "input_tokens",
            prompt,
            format!(
                "This model's maximum context length is {max_model_len} tokens. However, your prompt contains {prompt} input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt."
            ),
        ));
    }
    if prompt == max_model_len {
        return Err(limit_error(
            "input_tokens",
            prompt,
            format!(
                "This model's maximum context length is {max_model_len} tokens. However, you requested {} output tokens and your prompt contains {prompt} input tokens, for a total of {} tokens. Please reduce the length of the input prompt or the number of requested output tokens.",
                out.max(1),
                prompt + out.max(1)
            ),
        ));
    }
    Ok(ids)
}

/// Samples per prompt (default 1).
pub fn samples(p: &GenerationParams) -> Result<usize, ApiError> {
    match p.n {
        Some(0) => Err(ApiError::bad(Some("n".into()), "n must be at least 1")),
        Some(n) => Ok(n),
        None => Ok(1),
    }
}

/// `best_of` against `n` (`/v1/completions`): absent or `n` is served (every sample returned);
/// fewer than `n` is refused in older vLLM's words; more than `n` (rank the samples, drop the
/// rest) is refused by name rather than ignored as vLLM 0.32 ignores it (its completion request
/// has no `best_of` any more): a client asking for it learns that it does not get it.
pub fn best_of(best_of: Option<usize>, n: usize) -> Result<(), ApiError> {
    match best_of {
        Some(b) if b < n => Err(ApiError {
            status: 400,
            kind: "BadRequestError",
            message: format!(
                "best_of must be greater than or equal to n, got n={n} and best_of={b}."
            ),
            param: Some("best_of".into()),
        }),
        Some(b) if b > n => Err(ApiError::bad(
            Some("best_of".into()),
            format!(
                "best_of is not supported by this server above n (got n={n} and best_of={b}): it \
                 returns every sample it generates; send n={b} and rank the choices by their \
                 logprobs, or leave best_of out"
            ),
        )),
        _ => Ok(()),
    }
}

/// `tool_choice`, checked.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// The model decides (parsed when auto tool choice is on).
    Auto,
    /// No calls are parsed.
    None,
    /// A call is forced; the model picks the function.
    Required,
    /// A call to this function is forced.
    Named(String),
}

/// Reads `tool_choice` (`"auto"`, `"none"`, `"required"`, or `{"type": "function",
/// "function": {"name": …}}`).
pub fn tool_choice(v: Option<&ToolChoiceParam>) -> Result<ToolChoice, ApiError> {
    let bad = |m: String| ApiError::bad(Some("tool_choice".into()), m);
    match v {
        None => Ok(ToolChoice::Auto),
        Some(ToolChoiceParam::Mode(s)) => match s.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            other => Err(bad(format!(
                "tool_choice must be auto, none, required or a named function, got {other:?}"
            ))),
        },
        Some(ToolChoiceParam::Named(n)) if n.kind == "function" => {
            Ok(ToolChoice::Named(n.function.name.clone()))
        }
        Some(ToolChoiceParam::Named(_)) => Err(bad(
            "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": …}}".into(),
        )),
    }
}

/// Checks `tools` (OpenAI function tools) and returns them as template input and as the
/// parsers' [`Tool`](rlhost_sdk::types::Tool)s.
pub fn tools(
    list: Option<&[ToolDef]>,
) -> Result<(Option<Value>, Vec<rlhost_sdk::types::Tool>), ApiError> {
    let Some(list) = list else {
        return Ok((None, Vec::new()));
    };
    let mut out = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let at = |f: &str| Some(format!("tools[{i}]{f}"));
        if t.kind != "function" {
            return Err(ApiError::bad(
                at(".type"),
                format!("tools[{i}].type must be \"function\""),
            ));
        }
        let f = &t.function;
        if f.name.is_empty() {
            return Err(ApiError::bad(
                at(".function.name"),
                format!("tools[{i}].function.name must be a non-empty string"),
            ));
        }
        let params = match &f.parameters {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(other) => {
                return Err(ApiError::bad(
                    at(".function.parameters"),
                    format!(
                        "tools[{i}].function.parameters must be a JSON schema object, got {}",
                        kind(other)
                    ),
                ));
            }
        };
        out.push(rlhost_sdk::types::Tool {
            name: f.name.clone(),
            description: f.description.clone().unwrap_or_default(),
            parameters: params.to_string(),
        });
    }
    let json = serde_json::to_value(list).expect("tools serialise");
    Ok((Some(json), out))
}

/// A JSON value's kind, for messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Checks chat `messages` and brings them to what chat templates expect: `developer` as
/// `system`, text parts joined into one string, tool-call arguments given as JSON text parsed
/// into objects (as vLLM does; other text stays text, which templates write as it is).
pub fn template_messages(list: &[ChatMessage]) -> Result<Value, ApiError> {
    if list.is_empty() {
        return Err(ApiError::bad(
            Some("messages".into()),
            "messages must not be empty: an array of {role, content} is required",
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let content = match &m.content {
            None => Value::Null,
            Some(MessageContent::Text(t)) => Value::String(t.clone()),
            Some(MessageContent::Parts(parts)) => {
                let mut text = String::new();
                for (j, p) in parts.iter().enumerate() {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => text.push_str(t),
                        _ => {
                            return Err(ApiError::bad(
                                Some(format!("messages[{i}].content[{j}]")),
                                format!(
                                    "messages[{i}].content[{j}]: only text parts are supported"
                                ),
                            ));
                        }
                    }
                }
                Value::String(text)
            }
        };
        let mut v = serde_json::Map::new();
        v.insert("role".into(), m.role.template_name().into());
        v.insert("content".into(), content);
        if let Some(calls) = &m.tool_calls {
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| {
                    let args = match serde_json::from_str::<Value>(&c.function.arguments) {
                        Ok(parsed @ Value::Object(_)) => parsed,
                        _ => Value::String(c.function.arguments.clone()),
                    };
                    json!({"id": c.id, "type": c.kind,
                           "function": {"name": c.function.name, "arguments": args}})
                })
                .collect();
            v.insert("tool_calls".into(), Value::Array(calls));
        }
        if let Some(id) = &m.tool_call_id {
            v.insert("tool_call_id".into(), id.as_str().into());
        }
        if let Some(name) = &m.name {
            v.insert("name".into(), name.as_str().into());
        }
        if let Some(r) = &m.reasoning_content {
            v.insert("reasoning_content".into(), r.as_str().into());
        }
        out.push(Value::Object(v));
    }
    Ok(Value::Array(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::{ContentPart, Role, ToolCall};

    #[test]
    fn best_of_below_n_is_refused_in_vllms_words_and_above_n_is_refused() {
        best_of(None, 3).unwrap();
        best_of(Some(3), 3).unwrap();
        let e = best_of(Some(1), 3).unwrap_err();
        assert_eq!(
            e.message,
            "best_of must be greater than or equal to n, got n=3 and best_of=1."
        );
        assert_eq!((e.status, e.param.as_deref()), (400, Some("best_of")));
        let e = best_of(Some(0), 1).unwrap_err();
        assert!(
            e.message.contains("got n=1 and best_of=0."),
            "{}",
            e.message
        );
        let e = best_of(Some(4), 2).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("best_of"));
        assert!(e.message.contains("not supported"), "{}", e.message);
    }

    #[test]
    fn template_messages_join_parts_and_parse_arguments() {
        let mut a = ChatMessage::text(Role::Assistant, "");
        a.content = None;
        a.tool_calls = Some(vec![
            ToolCall::function("c1", "f", r#"{"x": 1}"#),
            ToolCall::function("c2", "g", "not json"),
        ]);
        let mut u = ChatMessage::text(Role::Developer, "");
        u.content = Some(MessageContent::Parts(vec![
            ContentPart {
                kind: "text".into(),
                text: Some("a".into()),
            },
            ContentPart {
                kind: "text".into(),
                text: Some("b".into()),
            },
        ]));
        let v = template_messages(&[u, a]).unwrap();
        assert_eq!(v[0], json!({"role": "system", "content": "ab"}));
        assert_eq!(v[1]["content"], Value::Null);
        assert_eq!(
            v[1]["tool_calls"][0]["function"]["arguments"],
            json!({"x": 1})
        );
        assert_eq!(v[1]["tool_calls"][1]["function"]["arguments"], "not json");
        let mut img = ChatMessage::text(Role::User, "");
        img.content = Some(MessageContent::Parts(vec![ContentPart {
            kind: "image_url".into(),
            text: None,
        }]));
        let e = template_messages(&[img]).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0]"));
    }
}
