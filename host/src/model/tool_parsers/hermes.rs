//! Hermes-style calls (stock Qwen3):
//!
//! ```text
//! Let me check both.
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! Every `<tool_call>…</tool_call>` body (the last may be unterminated) must be a JSON object with
//! `name` and `arguments`; one bad body means no calls at all and the whole text as content (as
//! vLLM does). Content is the text before the first `<tool_call>`.

use rlhost_sdk::types::Tool;

use super::{ParseOutcome, ParsedCall, ToolCallParser, json_prefix};
use crate::model::chat_template::python_json;

/// The `hermes` format: a JSON object with `name` and `arguments` per `<tool_call>` block.
pub struct Hermes;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

fn bodies(text: &str) -> Vec<&str> {
    let mut out = vec![];
    let mut rest = text;
    while let Some(i) = rest.find(OPEN) {
        let after = &rest[i + OPEN.len()..];
        match after.find(CLOSE) {
            Some(j) => {
                out.push(&after[..j]);
                rest = &after[j + CLOSE.len()..];
            }
            None => {
                out.push(after);
                break;
            }
        }
    }
    out
}

/// A call body's name and what follows `"arguments":`, once both are written in that order.
fn head(body: &str) -> Option<(String, &str)> {
    fn token<'a>(s: &'a str, t: &str) -> Option<&'a str> {
        s.trim_start().strip_prefix(t)
    }
    let rest = token(body, "{")?;
    let rest = token(rest, "\"name\"")?;
    let rest = token(rest, ":")?.trim_start();
    let mut de = serde_json::Deserializer::from_str(rest).into_iter::<String>();
    let name = de.next()?.ok()?;
    let rest = &rest[de.byte_offset()..];
    let rest = token(rest, ",")?;
    let rest = token(rest, "\"arguments\"")?;
    Some((name, token(rest, ":")?))
}

impl ToolCallParser for Hermes {
    fn name(&self) -> &'static str {
        "hermes"
    }

    fn call_grammar(&self, rule: &str, name: &str, parameters: &serde_json::Value) -> String {
        let head = format!(
            "{OPEN}\n{{\"name\": {}, \"arguments\": ",
            serde_json::json!(name)
        );
        format!(
            "{rule}: {} {} {}\n",
            super::lark_literal(&head),
            super::lark_json(parameters),
            super::lark_literal(&format!("}}\n{CLOSE}"))
        )
    }

    fn partial(&self, text: &str, _tools: &[Tool]) -> Vec<ParsedCall> {
        let mut out = vec![];
        for body in bodies(text) {
            // `{"name": "NAME", "arguments": ` then the arguments, as models write it; another
            // order is read when the call is complete.
            let Some((name, args)) = head(body) else {
                break;
            };
            let arguments = if args.trim_start().starts_with('"') {
                // Arguments given as JSON text: known when the call is.
                String::new()
            } else {
                json_prefix(args)
            };
            out.push(ParsedCall { name, arguments });
        }
        out
    }

    fn parse(&self, text: &str, _tools: &[Tool]) -> ParseOutcome {
        let Some(first) = text.find(OPEN) else {
            return ParseOutcome {
                content: (!text.is_empty()).then(|| text.to_string()),
                ..Default::default()
            };
        };
        let mut calls = vec![];
        for (n, body) in bodies(text).into_iter().enumerate() {
            let parsed = serde_json::from_str::<serde_json::Value>(body)
                .map_err(|e| format!("tool call {}: invalid JSON: {e}", n + 1))
                .and_then(|v| {
                    let name = v.get("name").and_then(|x| x.as_str()).map(str::to_string);
                    let args = v.get("arguments").cloned();
                    match (name, args) {
                        (Some(name), Some(args)) => Ok((name, args)),
                        _ => Err(format!(
                            "tool call {}: needs \"name\" and \"arguments\"",
                            n + 1
                        )),
                    }
                });
            match parsed {
                Ok((name, args)) => {
                    let arguments = match &args {
                        serde_json::Value::String(s)
                            if serde_json::from_str::<serde_json::Value>(s).is_ok() =>
                        {
                            s.clone()
                        }
                        other => python_json(other, None),
                    };
                    calls.push(ParsedCall { name, arguments });
                }
                Err(e) => {
                    return ParseOutcome {
                        content: Some(text.to_string()),
                        calls: vec![],
                        error: Some(e),
                    };
                }
            }
        }
        let content = &text[..first];
        ParseOutcome {
            content: (!content.is_empty()).then(|| content.to_string()),
            calls,
            error: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every prefix's calls are prefixes of the finished output's calls: names whole, arguments
    /// growing towards the final text.
    #[test]
    fn partial_calls_grow_into_the_parsed_ones() {
        let text = "Let me see.\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expr\":\"6*7\",\n \"n\": [1,2.50, {\"a\": null}], \"s\": \"caf\\u00e9 \\\"q\\\"\", \"big\": 1e3}}\n</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
        let whole = Hermes.parse(text, &[]);
        assert_eq!(whole.calls.len(), 2, "{whole:?}");
        assert_eq!(
            whole.calls[0].arguments,
            r#"{"expr": "6*7", "n": [1, 2.5, {"a": null}], "s": "café \"q\"", "big": 1000.0}"#
        );
        let mut grew = 0;
        let mut last = 0;
        for cut in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            let part = Hermes.partial(&text[..cut], &[]);
            for (p, w) in part.iter().zip(&whole.calls) {
                assert_eq!(p.name, w.name);
                assert!(w.arguments.starts_with(&p.arguments), "at {cut}: {p:?}");
            }
            assert!(part.len() <= whole.calls.len());
            let len: usize = part.iter().map(|p| p.arguments.len()).sum();
            grew += usize::from(len > last);
            last = len;
        }
        assert_eq!(
            Hermes.partial(text, &[])[0].arguments,
            whole.calls[0].arguments
        );
        // The arguments arrive in many pieces, not in one at the end.
        assert!(grew > 10, "{grew}");
    }

    fn call(name: &str, args: &str) -> ParsedCall {
        ParsedCall {
            name: name.into(),
            arguments: args.into(),
        }
    }

    #[test]
    fn literal_examples() {
        let out = Hermes.parse(
            "<tool_call>\n{\"name\": \"final_answer\", \"arguments\": {\"trigger\": true}}\n</tool_call>",
            &[],
        );
        assert_eq!(out.content, None);
        assert_eq!(
            out.calls,
            vec![call("final_answer", r#"{"trigger": true}"#)]
        );
        let out = Hermes.parse(
            "Let me check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \"unit\": \"c\"}}\n</tool_call>",
            &[],
        );
        assert_eq!(out.content.as_deref(), Some("Let me check both.\n"));
        assert_eq!(
            out.calls,
            vec![
                call("get_weather", r#"{"city": "Paris"}"#),
                call("get_weather", r#"{"city": "Rome", "unit": "c"}"#)
            ]
        );
    }

    #[test]
    fn unterminated_last_call_and_string_arguments() {
        let out = Hermes.parse(
            "<tool_call>{\"name\": \"python\", \"arguments\": {\"code\": \"print(1)\"}}",
            &[],
        );
        assert_eq!(out.calls, vec![call("python", r#"{"code": "print(1)"}"#)]);
        let out = Hermes.parse(
            "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>",
            &[],
        );
        assert_eq!(out.calls, vec![call("f", r#"{"a": 1}"#)]);
        let out = Hermes.parse(
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"é\"}}</tool_call>",
            &[],
        );
        assert_eq!(out.calls[0].arguments, r#"{"s": "é"}"#);
    }

    #[test]
    fn one_bad_body_means_no_calls() {
        let text = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", \"arguments\": {</tool_call>";
        let out = Hermes.parse(text, &[]);
        assert!(out.calls.is_empty());
        assert_eq!(out.content.as_deref(), Some(text));
        assert!(out.error.unwrap().contains("tool call 2: invalid JSON"));
        let out = Hermes.parse("plain answer \\boxed{4}", &[]);
        assert_eq!(out.content.as_deref(), Some("plain answer \\boxed{4}"));
        assert!(out.calls.is_empty() && out.error.is_none());
    }
}
