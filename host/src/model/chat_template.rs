//! Chat templates: a model's own Jinja `chat_template` rendered with minijinja the way
//! transformers' `apply_chat_template` renders it (`trim_blocks`, `lstrip_blocks`, loop controls,
//! Python string methods, `raise_exception`, and transformers' `tojson`: `json.dumps` with
//! `ensure_ascii=False` and Python's separators, keys in the order given, no HTML escaping).
//! The Qwen3 and Qwen3-Coder templates render byte for byte like transformers.

use std::path::Path;

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};

use super::{ModelError, files};

/// A chat template and the special tokens it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// `bos_token` of the tokenizer config, if any.
    pub bos_token: Option<String>,
    /// `eos_token` of the tokenizer config, if any.
    pub eos_token: Option<String>,
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)` for JSON values.
pub fn python_json(v: &serde_json::Value, indent: Option<usize>) -> String {
    fn string(s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    fn go(v: &serde_json::Value, indent: Option<usize>, depth: usize, out: &mut String) {
        let (item_sep, key_sep) = match indent {
            Some(_) => (",", ": "),
            None => (", ", ": "),
        };
        let newline = |out: &mut String, d: usize| {
            if let Some(n) = indent {
                out.push('\n');
                out.push_str(&" ".repeat(n * d));
            }
        };
        match v {
            serde_json::Value::Null => out.push_str("null"),
            serde_json::Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            serde_json::Value::Number(n) => match n.as_f64() {
                Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e16 => {
                    out.push_str(&format!("{f:.1}"))
                }
                _ => out.push_str(&n.to_string()),
            },
            serde_json::Value::String(s) => string(s, out),
            serde_json::Value::Array(a) => {
                if a.is_empty() {
                    out.push_str("[]");
                    return;
                }
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push_str(item_sep);
                    }
                    newline(out, depth + 1);
                    go(x, indent, depth + 1, out);
                }
                newline(out, depth);
                out.push(']');
            }
            serde_json::Value::Object(m) => {
                if m.is_empty() {
                    out.push_str("{}");
                    return;
                }
                out.push('{');
                for (i, (k, x)) in m.iter().enumerate() {
                    if i > 0 {
                        out.push_str(item_sep);
                    }
                    newline(out, depth + 1);
                    string(k, out);
                    out.push_str(key_sep);
                    go(x, indent, depth + 1, out);
                }
                newline(out, depth);
                out.push('}');
            }
        }
    }
    let mut out = String::new();
    go(v, indent, 0, &mut out);
    out
}

fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(Value::from_safe_string(python_json(&json, indent)))
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

impl ChatTemplate {
    /// Compiles the Jinja `source`, without the special tokens [`load`](Self::load) sets.
    pub fn new(source: &str) -> Result<Self, ModelError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        // Jinja2's `iterable`: `None` is not (minijinja iterates it as empty).
        env.add_test("iterable", |v: Value| {
            !v.is_none() && !v.is_undefined() && v.try_iter().is_ok()
        });
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| ModelError::Template(e.to_string()))?;
        Ok(Self {
            env,
            bos_token: None,
            eos_token: None,
        })
    }

    /// The template of a model folder: `chat_template.jinja`, else `tokenizer_config.json`'s
    /// `chat_template` (a string, or the entry named `default` of a list); special tokens from
    /// `tokenizer_config.json`.
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: serde_json::Value =
            match files::read_optional_text(&cfg_path, files::TOKENIZER_CONFIG)? {
                Some(t) => serde_json::from_str(&t).map_err(|e| ModelError::Config {
                    path: cfg_path.clone(),
                    message: e.to_string(),
                })?,
                None => serde_json::Value::Null,
            };
        let file = dir.join("chat_template.jinja");
        let source = match files::read_optional_text(&file, files::CHAT_TEMPLATE)? {
            Some(s) => s,
            None => match &cfg["chat_template"] {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Array(list) => list
                    .iter()
                    .find(|t| t["name"] == "default")
                    .and_then(|t| t["template"].as_str())
                    .map(str::to_string)
                    .ok_or_else(|| {
                        ModelError::Template(format!(
                            "{}: no default chat template",
                            cfg_path.display()
                        ))
                    })?,
                _ => {
                    return Err(ModelError::Template(format!(
                        "{} has no chat_template.jinja and {} no chat_template",
                        dir.display(),
                        cfg_path.display()
                    )));
                }
            },
        };
        let token = |k: &str| {
            let v = &cfg[k];
            v.as_str()
                .or_else(|| v["content"].as_str())
                .map(str::to_string)
        };
        let mut t = Self::new(&source)?;
        t.bos_token = token("bos_token");
        t.eos_token = token("eos_token");
        Ok(t)
    }

    /// Renders `messages` (OpenAI-style JSON) with `tools` (JSON schemas, or none) and the
    /// template's other variables (`enable_thinking`, …) from `extra`.
    pub fn render(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, ModelError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| ModelError::Template(e.to_string()))?;
        let mut ctx = serde_json::Map::new();
        ctx.insert("messages".into(), messages.clone());
        ctx.insert(
            "tools".into(),
            tools.cloned().unwrap_or(serde_json::Value::Null),
        );
        ctx.insert("documents".into(), serde_json::Value::Null);
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        ctx.insert("bos_token".into(), self.bos_token.clone().into());
        ctx.insert("eos_token".into(), self.eos_token.clone().into());
        for (k, v) in extra {
            ctx.insert(k.clone(), v.clone());
        }
        tmpl.render(Value::from_serialize(&ctx))
            .map_err(|e| ModelError::Template(format!("{e:#}")))
    }
}

impl ChatTemplate {
    /// Whether the template reads the variable `name` (a request setting one it never reads
    /// would change nothing).
    pub fn reads(&self, name: &str) -> bool {
        self.env
            .get_template("chat")
            .is_ok_and(|t| t.undeclared_variables(false).contains(name))
    }

    /// transformers' `apply_chat_template(messages, tools=tools, **kwargs)`: `kwargs` holds
    /// `add_generation_prompt` (default false) and the template's other variables.
    pub fn apply(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, ModelError> {
        let mut extra = kwargs.clone();
        let generation = extra
            .remove("add_generation_prompt")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        let tools = tools.filter(|t| !t.is_null());
        self.render(messages, tools, generation, &extra)
    }
}

/// What to append to a conversation's token stream after new (tool or user) messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delta {
    /// The text after the last generated token (its end-of-turn marker) up to and including the
    /// next generation prompt.
    pub text: String,
    /// `text` as the tokenizer encodes it.
    pub ids: Vec<u32>,
    /// Whether re-rendering the whole conversation would reproduce the earlier render as a
    /// prefix. Qwen3's template is not, once a new user message arrives: it drops the
    /// reasoning of earlier turns. The delta is right either way; this says whether a
    /// from-scratch render would disagree with the token stream.
    pub prefix_preserving: bool,
}

impl ChatTemplate {
    /// The tokens to append after `history` (ending with the assistant message the model just
    /// generated, whose tokens are kept as generated) when `new` messages arrive.
    ///
    /// The delta is rendered around the last assistant message alone (preceded by a user
    /// message, so templates that look back for the last query keep its reasoning), which makes
    /// it independent of what the template does to older turns: the token stream stays the
    /// source of truth.
    pub fn render_delta(
        &self,
        tokenizer: &super::Tokenizer,
        history: &[serde_json::Value],
        new: &[serde_json::Value],
        tools: Option<&serde_json::Value>,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Delta, ModelError> {
        let last = history
            .iter()
            .rposition(|m| m["role"] == "assistant")
            .ok_or_else(|| ModelError::Template("the history has no assistant message".into()))?;
        let prompt = history[..last]
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .cloned()
            .unwrap_or_else(|| serde_json::json!({"role": "user", "content": ""}));
        let mut tail = vec![prompt, history[last].clone()];
        tail.extend(history[last + 1..].iter().cloned());
        let anchor = self.render(&serde_json::Value::Array(tail.clone()), tools, false, extra)?;
        tail.extend(new.iter().cloned());
        let after = self.render(&serde_json::Value::Array(tail), tools, true, extra)?;
        // Cut `after` right after the end-of-turn marker that closes the last assistant message
        // (the same count of markers as in `anchor`): what follows is the delta, whatever the
        // template now does to that message (Qwen3 drops its reasoning once a new question
        // arrives). Without markers, `after` must extend `anchor`.
        let cut = self
            .eos_token
            .as_deref()
            .filter(|e| !e.is_empty())
            .and_then(|eos| {
                let n = anchor.matches(eos).count();
                (n > 0 && last + 1 == history.len())
                    .then(|| {
                        after
                            .match_indices(eos)
                            .nth(n - 1)
                            .map(|(i, _)| i + eos.len())
                    })
                    .flatten()
            });
        let text = match cut {
            Some(k) => after[k..].to_string(),
            None => after
                .strip_prefix(anchor.as_str())
                .ok_or_else(|| {
                    ModelError::Template(
                        "appending messages changes how the conversation renders, and the \
                         template has no end-of-turn marker to cut at"
                            .into(),
                    )
                })?
                .to_string(),
        };

        let ids = tokenizer.encode(&text)?;
        let whole_before = self.render(
            &serde_json::Value::Array(history.to_vec()),
            tools,
            false,
            extra,
        )?;
        let mut all = history.to_vec();
        all.extend(new.iter().cloned());
        let whole_after = self.render(&serde_json::Value::Array(all), tools, true, extra)?;
        Ok(Delta {
            text,
            ids,
            prefix_preserving: whole_after.starts_with(&whole_before),
        })
    }
}
