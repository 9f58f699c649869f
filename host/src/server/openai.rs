//! The OpenAI wire format: request bodies (with vLLM's extensions that RL clients use:
//! `top_k`, `min_p`, `repetition_penalty`, `stop_token_ids`, `ignore_eos`,
//! `skip_special_tokens`, `chat_template_kwargs`, `return_tokens_as_token_ids`,
//! `return_token_ids`), their validation into engine requests, and error bodies.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::engine::SamplingParams;

/// An API error: HTTP status, OpenAI error type, message, offending parameter.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// OpenAI error type (`invalid_request_error`, …).
    pub kind: &'static str,
    /// What went wrong, naming the culprit.
    pub message: String,
    /// The request field at fault, when one is.
    pub param: Option<String>,
}

impl ApiError {
    /// A 400 about `param`.
    pub fn bad(param: impl Into<Option<String>>, message: impl Into<String>) -> Self {
        Self {
            status: 400,
            kind: "invalid_request_error",
            message: message.into(),
            param: param.into(),
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.status,
        }})
    }
}

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with token usage.
    #[serde(default)]
    pub include_usage: bool,
}

/// Sampling fields shared by chat and text completions.
#[derive(Debug, Default, Deserialize)]
pub struct Sampling {
    /// Served model name (checked against ours).
    pub model: Option<String>,
    /// Samples per prompt.
    pub n: Option<usize>,
    /// Temperature (default 1).
    pub temperature: Option<f64>,
    /// Nucleus mass.
    pub top_p: Option<f64>,
    /// vLLM: top-k (-1 off).
    pub top_k: Option<i64>,
    /// vLLM: min-p.
    pub min_p: Option<f64>,
    /// vLLM: repetition penalty.
    pub repetition_penalty: Option<f64>,
    /// Not supported unless 0.
    pub presence_penalty: Option<f64>,
    /// Not supported unless 0.
    pub frequency_penalty: Option<f64>,
    /// Most tokens to generate.
    pub max_tokens: Option<i64>,
    /// Same, newer name.
    pub max_completion_tokens: Option<i64>,
    /// Stop strings.
    pub stop: Option<Stop>,
    /// vLLM: stop token ids.
    pub stop_token_ids: Option<Vec<u32>>,
    /// vLLM: generate past end-of-sequence.
    #[serde(default)]
    pub ignore_eos: bool,
    /// vLLM: leave special tokens out of the text (default true).
    pub skip_special_tokens: Option<bool>,
    /// Seed for reproducible sampling.
    pub seed: Option<u64>,
    /// Server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// vLLM: log-prob tokens as `token_id:N`.
    #[serde(default)]
    pub return_tokens_as_token_ids: bool,
    /// vLLM: `prompt_token_ids` and per-choice `token_ids` in the response.
    #[serde(default)]
    pub return_token_ids: bool,
    /// vLLM: log-probs of the prompt's tokens. Not supported: refused when set, so a client
    /// never reads a response that silently lacks what it asked for.
    pub prompt_logprobs: Option<Value>,
}

impl Sampling {
    /// The engine's parameters; `top_logprobs` from the endpoint's own field.
    pub fn params(&self, top_logprobs: usize) -> Result<SamplingParams, ApiError> {
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if v.is_some_and(|v| v != 0.0) {
                return Err(ApiError::bad(
                    Some(name.to_string()),
                    format!("{name} is not supported by this server (use repetition_penalty)"),
                ));
            }
        }
        if self.prompt_logprobs.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(ApiError::bad(
                Some("prompt_logprobs".into()),
                "prompt_logprobs is not supported by this server",
            ));
        }
        let max_tokens = match (self.max_completion_tokens, self.max_tokens) {
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
        let p = SamplingParams {
            temperature: self.temperature.unwrap_or(1.0),
            top_p: self.top_p.unwrap_or(1.0),
            top_k: self.top_k.unwrap_or(-1),
            min_p: self.min_p.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            seed: self.seed,
            max_tokens,
            stop: match &self.stop {
                None => Vec::new(),
                Some(Stop::One(s)) => vec![s.clone()],
                Some(Stop::Many(v)) => v.clone(),
            },
            stop_token_ids: self.stop_token_ids.clone().unwrap_or_default(),
            ignore_eos: self.ignore_eos,
            top_logprobs,
            skip_special_tokens: self.skip_special_tokens.unwrap_or(true),
        };
        p.validate().map_err(|e| {
            let param = e.split_whitespace().next().map(str::to_string);
            ApiError::bad(param, e)
        })?;
        Ok(p)
    }

    /// Samples per prompt (default 1).
    pub fn n(&self) -> Result<usize, ApiError> {
        match self.n {
            Some(0) => Err(ApiError::bad(Some("n".into()), "n must be at least 1")),
            Some(n) => Ok(n),
            None => Ok(1),
        }
    }
}

/// `tool_choice`.
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

/// Parses `tool_choice` (`"auto"`, `"none"`, `"required"`, or `{"type": "function",
/// "function": {"name": …}}`).
pub fn tool_choice(v: Option<&Value>) -> Result<ToolChoice, ApiError> {
    let bad = |m: String| ApiError::bad(Some("tool_choice".into()), m);
    match v {
        None | Some(Value::Null) => Ok(ToolChoice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            other => Err(bad(format!(
                "tool_choice must be auto, none, required or a named function, got {other:?}"
            ))),
        },
        Some(obj) => match obj["function"]["name"].as_str() {
            Some(name) if obj["type"] == "function" => Ok(ToolChoice::Named(name.to_string())),
            _ => Err(bad(
                "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": …}}"
                    .into(),
            )),
        },
    }
}

/// Checks `tools` (OpenAI function tools) and returns them as template input and as the
/// parsers' [`Tool`](rlhost_sdk::types::Tool)s.
pub fn tools(v: Option<&Value>) -> Result<(Option<Value>, Vec<rlhost_sdk::types::Tool>), ApiError> {
    let list = match v {
        None | Some(Value::Null) => return Ok((None, Vec::new())),
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(ApiError::bad(
                Some("tools".into()),
                "tools must be an array",
            ));
        }
    };
    let mut out = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let at = |f: &str| Some(format!("tools[{i}]{f}"));
        if t["type"] != "function" {
            return Err(ApiError::bad(
                at(".type"),
                format!("tools[{i}].type must be \"function\""),
            ));
        }
        let f = &t["function"];
        let name = f["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                ApiError::bad(
                    at(".function.name"),
                    format!("tools[{i}].function.name must be a non-empty string"),
                )
            })?;
        let params = match &f["parameters"] {
            Value::Null => json!({"type": "object", "properties": {}}),
            Value::Object(_) => f["parameters"].clone(),
            other => {
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
            name: name.to_string(),
            description: f["description"].as_str().unwrap_or_default().to_string(),
            parameters: params.to_string(),
        });
    }
    Ok((Some(Value::Array(list.clone())), out))
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

/// Checks chat `messages` and brings them to what chat templates expect: text parts joined
/// into one string, tool-call arguments given as JSON text parsed into objects (as vLLM does).
pub fn messages(v: Option<&Value>) -> Result<Value, ApiError> {
    let list = match v {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => {
            return Err(ApiError::bad(
                Some("messages".into()),
                "messages must not be empty",
            ));
        }
        _ => {
            return Err(ApiError::bad(
                Some("messages".into()),
                "messages is required: an array of {role, content}",
            ));
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let at = |f: &str| Some(format!("messages[{i}]{f}"));
        let mut m = m
            .as_object()
            .cloned()
            .ok_or_else(|| ApiError::bad(at(""), format!("messages[{i}] must be an object")))?;
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if !matches!(
            role.as_str(),
            "system" | "developer" | "user" | "assistant" | "tool"
        ) {
            return Err(ApiError::bad(
                at(".role"),
                format!("messages[{i}].role must be system, user, assistant or tool, got {role:?}"),
            ));
        }
        if role == "developer" {
            m.insert("role".into(), "system".into());
        }
        match m.get("content").cloned() {
            None | Some(Value::Null) | Some(Value::String(_)) => {}
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for (j, p) in parts.iter().enumerate() {
                    match (p["type"].as_str(), p["text"].as_str()) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        _ => {
                            return Err(ApiError::bad(
                                at(&format!(".content[{j}]")),
                                format!(
                                    "messages[{i}].content[{j}]: only text parts are supported"
                                ),
                            ));
                        }
                    }
                }
                m.insert("content".into(), text.into());
            }
            Some(other) => {
                return Err(ApiError::bad(
                    at(".content"),
                    format!(
                        "messages[{i}].content must be a string or text parts, got {}",
                        kind(&other)
                    ),
                ));
            }
        }
        if let Some(Value::Array(calls)) = m.get_mut("tool_calls") {
            for (j, c) in calls.iter_mut().enumerate() {
                let f = c.get_mut("function").ok_or_else(|| {
                    ApiError::bad(
                        at(&format!(".tool_calls[{j}]")),
                        format!("messages[{i}].tool_calls[{j}] has no function"),
                    )
                })?;
                // JSON arguments become objects for the template (as vLLM does); anything
                // else stays text, which templates write as it is.
                if let Some(Value::String(args)) = f.get("arguments")
                    && let Ok(parsed @ Value::Object(_)) = serde_json::from_str::<Value>(args)
                {
                    f["arguments"] = parsed;
                }
            }
        }
        out.push(Value::Object(m));
    }
    Ok(Value::Array(out))
}

/// Parses a request body, naming the field a type error is in.
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
