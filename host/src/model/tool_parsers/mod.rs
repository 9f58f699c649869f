//! Tool-call parsers: the assistant's raw text → content + tool calls, one implementation per
//! wire format ([`Hermes`]: stock Qwen3's `<tool_call>{json}</tool_call>`; [`Qwen3Coder`]: the
//! XML-ish `<function=NAME><parameter=P>…</parameter></function>` of Qwen3-Coder and its
//! derivatives), following vLLM's parsers (`../shared/models/tool-call-formats.md`).
//!
//! Malformed output never panics and never kills a rollout: the outcome carries the text, the
//! calls that could be read, and an error the caller can count and show to the model.

mod hermes;
mod qwen3_coder;

pub use hermes::Hermes;
pub use qwen3_coder::Qwen3Coder;

use rlhost_sdk::types::Tool;

/// One parsed call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function name, as written.
    pub name: String,
    /// The arguments as JSON object text (Python `json.dumps` style, as vLLM returns them).
    pub arguments: String,
}

/// What a parser made of an assistant message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParseOutcome {
    /// The text that is not a tool call (`None` when empty).
    pub content: Option<String>,
    /// The calls, in order.
    pub calls: Vec<ParsedCall>,
    /// Why (some of) the output could not be read as calls.
    pub error: Option<String>,
}

/// A tool-call wire format.
pub trait ToolCallParser: Send + Sync {
    /// The name used on the command line (`--tool-call-parser hermes`).
    fn name(&self) -> &'static str;
    /// Parses `text`; `tools` are the tools offered (some formats type arguments by them).
    fn parse(&self, text: &str, tools: &[Tool]) -> ParseOutcome;
    /// The calls readable so far in an unfinished output `text` (content before the calls
    /// included), for streaming: each call whose name is complete, with the part of its
    /// arguments that the finished output's [`parse`](Self::parse) will begin with (so pieces
    /// sent as they grow add up to the final arguments).
    fn partial(&self, text: &str, tools: &[Tool]) -> Vec<ParsedCall>;
    /// Lark rules (llguidance's dialect) whose rule `rule` is exactly one call of the function
    /// `name` in this format, its arguments valid against `parameters` (a JSON schema): what
    /// grammar-constrained decoding forces for `tool_choice` `required` or a named function.
    /// Helper rules are named `{rule}_…`.
    fn call_grammar(&self, rule: &str, name: &str, parameters: &serde_json::Value) -> String;
    /// What the format writes between two calls of one turn.
    fn call_separator(&self) -> &'static str {
        "\n"
    }
}

/// The arguments JSON at the start of `text`, as far as it goes, in the form
/// [`python_json`](crate::model::chat_template::python_json) gives the whole value (`", "` and
/// `": "` separators, strings and numbers re-encoded), token by token: only complete tokens are
/// written (a number once what follows it shows it ended), so the result is a prefix of the
/// finished value's `python_json`. Stops at the end of the value or at anything that is not JSON.
pub fn json_prefix(text: &str) -> String {
    use crate::model::chat_template::python_json;
    let b = text.as_bytes();
    let mut out = String::new();
    let mut depth = 0usize;
    let mut i = 0;
    loop {
        while b.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        let Some(&c) = b.get(i) else { return out };
        match c {
            b'{' | b'[' => {
                out.push(c as char);
                depth += 1;
                i += 1;
            }
            b'}' | b']' => {
                if depth == 0 {
                    return out;
                }
                out.push(c as char);
                depth -= 1;
                i += 1;
            }
            b',' | b':' if depth > 0 => {
                out.push_str(if c == b',' { ", " } else { ": " });
                i += 1;
            }
            b'"' => {
                let mut j = i + 1;
                loop {
                    match b.get(j) {
                        None => return out,
                        Some(b'\\') => j += 2,
                        Some(b'"') => break,
                        Some(_) => j += 1,
                    }
                }
                let Ok(s) = serde_json::from_str::<String>(&text[i..=j]) else {
                    return out;
                };
                out.push_str(&python_json(&serde_json::Value::String(s), None));
                i = j + 1;
            }
            _ => {
                let mut j = i;
                while b
                    .get(j)
                    .is_some_and(|c| c.is_ascii_alphanumeric() || b"+-.".contains(c))
                {
                    j += 1;
                }
                if j == b.len() || j == i {
                    return out;
                }
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&text[i..j]) else {
                    return out;
                };
                out.push_str(&python_json(&v, None));
                i = j;
            }
        }
        if depth == 0 {
            return out;
        }
    }
}

/// A Lark string literal of `text`.
pub fn lark_literal(text: &str) -> String {
    serde_json::to_string(text).expect("strings serialise")
}

/// A Lark `%json` embedding of `schema`, generated in `json.dumps` layout (`", "` and `": "`,
/// no other whitespace: the layout chat templates write and models learn, and no room for a
/// model to wander into whitespace).
pub fn lark_json(schema: &serde_json::Value) -> String {
    let layout = serde_json::json!({
        "item_separator": ", ", "key_separator": ": ", "whitespace_flexible": false,
    });
    let schema = match schema {
        serde_json::Value::Object(m) => {
            let mut m = m.clone();
            m.entry("x-guidance").or_insert(layout);
            serde_json::Value::Object(m)
        }
        serde_json::Value::Bool(true) => serde_json::json!({"x-guidance": layout}),
        other => other.clone(),
    };
    format!("%json {schema}")
}

/// The parser called `name` on the command line (`hermes`, `qwen3_coder` or `qwen3_xml`).
pub fn parser(name: &str) -> Result<Box<dyn ToolCallParser>, String> {
    match name {
        "hermes" => Ok(Box::new(Hermes)),
        "qwen3_coder" | "qwen3_xml" => Ok(Box::new(Qwen3Coder)),
        other => Err(format!(
            "unknown tool-call parser {other:?} (known: hermes, qwen3_coder)"
        )),
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    /// Pieces of both formats, JSON and noise: random mixes reach the parsers' edge cases far
    /// more often than uniform random text does.
    const PIECES: [&str; 28] = [
        "<tool_call>",
        "</tool_call>",
        "<function=",
        "</function>",
        "<parameter=",
        "</parameter>",
        ">",
        "\n",
        "{",
        "}",
        "\"name\"",
        ": ",
        "\"arguments\"",
        "[1, 2]",
        "python",
        "x",
        " ",
        "\"",
        "\\",
        "é",
        "<",
        "=",
        "null",
        "True",
        "3.5",
        "'a'",
        "<think>",
        "</think>",
    ];

    fn tool() -> Tool {
        Tool {
            name: "python".into(),
            description: String::new(),
            parameters: r#"{"type":"object","properties":{"code":{"type":"string"},"n":{"type":"integer"},"x":{"type":"object"}}}"#.into(),
        }
    }

    /// Text made of format pieces interleaved with arbitrary strings.
    fn adversarial() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop_oneof![4 => prop::sample::select(PIECES.to_vec()).prop_map(str::to_owned), 1 => any::<String>()],
            0..32,
        )
        .prop_map(|parts| parts.concat())
    }

    /// What every outcome must satisfy: content is the text before the calls, arguments are
    /// JSON objects.
    fn check(text: &str, out: &ParseOutcome) -> Result<(), TestCaseError> {
        if let Some(c) = &out.content {
            prop_assert!(
                !c.is_empty() && text.starts_with(c.as_str()),
                "{text:?} -> {c:?}"
            );
        }
        for call in &out.calls {
            let args: serde_json::Value = serde_json::from_str(&call.arguments)
                .map_err(|e| TestCaseError::fail(format!("{}: {e}", call.arguments)))?;
            prop_assert!(args.is_object(), "{}", call.arguments);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// Arbitrary input never panics and always yields a well-formed outcome.
        #[test]
        fn arbitrary_input_never_panics(text in adversarial()) {
            for p in [parser("hermes").unwrap(), parser("qwen3_coder").unwrap()] {
                let out = p.parse(&text, &[tool()]);
                check(&text, &out)?;
            }
        }

        /// Calls written in hermes format come back exactly, after any preamble.
        #[test]
        fn hermes_calls_round_trip(
            preamble in "[a-zA-Z0-9 .,]{0,40}",
            calls in prop::collection::vec(("[a-z_]{1,12}", any::<String>(), any::<i64>()), 1..4),
        ) {
            let mut text = preamble.clone();
            for (name, code, n) in &calls {
                let args = serde_json::json!({"code": code, "n": n});
                text.push_str(&format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {args}}}\n</tool_call>"));
            }
            let out = Hermes.parse(&text, &[tool()]);
            check(&text, &out)?;
            prop_assert_eq!(out.error, None);
            prop_assert_eq!(out.calls.len(), calls.len());
            for (got, (name, code, n)) in out.calls.iter().zip(&calls) {
                prop_assert_eq!(&got.name, name);
                let args: serde_json::Value = serde_json::from_str(&got.arguments).unwrap();
                prop_assert_eq!(args, serde_json::json!({"code": code, "n": n}));
            }
            // As vLLM: the text before the first call, verbatim, `None` only when empty.
            prop_assert_eq!(out.content, (!preamble.is_empty()).then_some(preamble));
        }

        /// Calls written in qwen3_coder format come back with values typed by the schema.
        #[test]
        fn qwen3_coder_calls_round_trip(
            code in "[^<\n]([^<]{0,60}[^<\n])?",
            n in any::<i32>(),
        ) {
            let text = format!(
                "<tool_call>\n<function=python>\n<parameter=code>\n{code}\n</parameter>\n<parameter=n>\n{n}\n</parameter>\n</function>\n</tool_call>"
            );
            let out = Qwen3Coder.parse(&text, &[tool()]);
            check(&text, &out)?;
            prop_assert_eq!(out.error, None);
            prop_assert_eq!(out.calls.len(), 1);
            let args: serde_json::Value = serde_json::from_str(&out.calls[0].arguments).unwrap();
            prop_assert_eq!(args, serde_json::json!({"code": code, "n": n}));
        }
    }
}
