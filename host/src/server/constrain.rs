//! What a request's output must look like, as a grammar for the engine
//! ([`crate::engine::grammar`]): a forced tool call (`tool_choice` `required` or a named
//! function) in the configured parser's exact wire format with arguments valid against the
//! tool's schema, or an output shape (`response_format`, vLLM's `structured_outputs` and older
//! `guided_*` fields). Every field is honoured or refused with a 400 naming it; a schema or regex
//! llguidance cannot compile is a 400 naming the field, with llguidance's message.
//!
//! Grammars are written in llguidance's Lark dialect; JSON is generated in `json.dumps` layout
//! ([`tool_parsers::lark_json`]). This module never runs a grammar: the engine does.

use std::sync::Arc;

use rlhost_sdk::types::Tool;
use serde_json::{Value, json};

use crate::engine::EngineInfo;
use crate::engine::grammar::Constraint;
use crate::model::tool_parsers::{self, ToolCallParser};
use crate::openai::{ApiError, OutputConstraints, ResponseFormat};

/// A grammar and the request field it comes from (named in errors).
#[derive(Debug, Clone, PartialEq)]
pub struct GrammarSource {
    /// The Lark grammar.
    pub lark: String,
    /// The field that asked for it (`response_format`, `tool_choice`, …).
    pub param: String,
}

fn bad(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad(Some(param.to_string()), message)
}

/// Backend names vLLM clients send in `guided_decoding_backend` that mean what rlhost does.
const OUR_BACKENDS: [&str; 3] = ["auto", "guidance", "llguidance"];

/// A JSON schema given as an object, a boolean, or its JSON text (vLLM accepts text).
fn schema_value(v: &Value, param: &str) -> Result<Value, ApiError> {
    let v = match v {
        Value::String(text) => serde_json::from_str(text).map_err(|e| {
            bad(
                param,
                format!("{param} is a string that is not JSON text: {e}"),
            )
        })?,
        other => other.clone(),
    };
    match v {
        Value::Object(_) | Value::Bool(_) => Ok(v),
        other => Err(bad(
            param,
            format!(
                "{param} must be a JSON schema (an object), got {}",
                super::request::kind(&other)
            ),
        )),
    }
}

fn json_grammar(schema: &Value) -> String {
    format!("start: {}\n", tool_parsers::lark_json(schema))
}

fn regex_grammar(rx: &str) -> String {
    format!("start: /{}/\n", llguidance::regex_to_lark(rx, ""))
}

fn choice_grammar(choices: &[String], param: &str) -> Result<String, ApiError> {
    if choices.is_empty() {
        return Err(bad(param, format!("{param} must list at least one string")));
    }
    let alts: Vec<String> = choices
        .iter()
        .map(|c| tool_parsers::lark_literal(c))
        .collect();
    Ok(format!("start: {}\n", alts.join(" | ")))
}

/// The grammar `c` asks for, if any. At most one constraint may be given.
pub fn output_grammar(c: &OutputConstraints) -> Result<Option<GrammarSource>, ApiError> {
    for (name, set) in [
        ("guided_grammar", c.guided_grammar.is_some()),
        ("structural_tag", c.structural_tag.is_some()),
        (
            "guided_whitespace_pattern",
            c.guided_whitespace_pattern.is_some(),
        ),
    ] {
        if set {
            return Err(bad(
                name,
                format!(
                    "{name} is not supported by this server (supported: response_format, structured_outputs.json/regex/choice/json_object, guided_json, guided_regex, guided_choice)"
                ),
            ));
        }
    }
    if let Some(b) = &c.guided_decoding_backend
        && !OUR_BACKENDS.contains(&b.as_str())
    {
        return Err(bad(
            "guided_decoding_backend",
            format!(
                "guided_decoding_backend {b:?} is not available: this server constrains with llguidance (\"guidance\")"
            ),
        ));
    }
    let mut found: Vec<GrammarSource> = Vec::new();
    let mut add = |lark: String, param: &str| {
        found.push(GrammarSource {
            lark,
            param: param.to_string(),
        })
    };
    match &c.response_format {
        None | Some(ResponseFormat::Text) => {}
        Some(ResponseFormat::JsonObject) => {
            add(json_grammar(&json!({"type": "object"})), "response_format")
        }
        Some(ResponseFormat::JsonSchema { json_schema }) => {
            let schema = match &json_schema.schema {
                Some(s) => schema_value(s, "response_format.json_schema.schema")?,
                None => Value::Bool(true),
            };
            add(json_grammar(&schema), "response_format.json_schema.schema")
        }
        Some(ResponseFormat::StructuralTag(_)) => {
            return Err(bad(
                "response_format",
                "response_format of type structural_tag is not supported by this server (supported: text, json_object, json_schema)",
            ));
        }
    }
    if let Some(so) = &c.structured_outputs {
        if let Some(key) = so.other.keys().find(|k| {
            // Options that what rlhost does already satisfies; `disable_additional_properties`
            // only when off.
            !matches!(k.as_str(), "disable_fallback" | "disable_any_whitespace")
                && !(k.as_str() == "disable_additional_properties"
                    && so.other[k.as_str()] != Value::Bool(true))
        }) {
            let param = format!("structured_outputs.{key}");
            return Err(bad(
                &param,
                format!(
                    "{param} is not supported by this server (supported: json, regex, choice, json_object)"
                ),
            ));
        }
        if let Some(s) = &so.json {
            let param = "structured_outputs.json";
            add(json_grammar(&schema_value(s, param)?), param);
        }
        if let Some(rx) = &so.regex {
            add(regex_grammar(rx), "structured_outputs.regex");
        }
        if let Some(ch) = &so.choice {
            let param = "structured_outputs.choice";
            add(choice_grammar(ch, param)?, param);
        }
        if so.json_object == Some(true) {
            add(
                json_grammar(&json!({"type": "object"})),
                "structured_outputs.json_object",
            );
        }
    }
    if let Some(s) = &c.guided_json {
        add(
            json_grammar(&schema_value(s, "guided_json")?),
            "guided_json",
        );
    }
    if let Some(rx) = &c.guided_regex {
        add(regex_grammar(rx), "guided_regex");
    }
    if let Some(ch) = &c.guided_choice {
        add(choice_grammar(ch, "guided_choice")?, "guided_choice");
    }
    if found.len() > 1 {
        return Err(bad(
            &found[1].param,
            format!(
                "{} and {} both constrain the output; give one",
                found[0].param, found[1].param
            ),
        ));
    }
    Ok(found.pop())
}

/// The grammar of a forced call in `parser`'s format: to `only` (a named `tool_choice`) or to
/// any of `tools` (`required`), one call, or one or more when `parallel`; nothing before, and
/// end-of-sequence after.
pub fn tool_call_grammar(
    parser: &dyn ToolCallParser,
    tools: &[Tool],
    only: Option<&str>,
    parallel: bool,
) -> Result<GrammarSource, ApiError> {
    let mut rules = String::new();
    let mut alts = Vec::new();
    for (k, t) in tools.iter().enumerate() {
        if only.is_some_and(|n| n != t.name) {
            continue;
        }
        let params: Value = serde_json::from_str(&t.parameters)
            .unwrap_or_else(|_| json!({"type": "object", "properties": {}}));
        let rule = format!("tool{k}");
        rules.push_str(&parser.call_grammar(&rule, &t.name, &params));
        alts.push(rule);
    }
    let sep = tool_parsers::lark_literal(parser.call_separator());
    let start = if parallel {
        format!("start: call ({sep} call)*\n")
    } else {
        "start: call\n".to_string()
    };
    Ok(GrammarSource {
        lark: format!("{start}call: {}\n{rules}", alts.join(" | ")),
        param: "tool_choice".into(),
    })
}

/// Compiles `g` against the engine's token table; a grammar llguidance refuses is a 400 naming
/// the field it came from.
pub fn compile(info: &EngineInfo, g: &GrammarSource) -> Result<Arc<Constraint>, ApiError> {
    let tokens = info.grammar().map_err(|e| bad(&g.param, e.to_string()))?;
    tokens
        .compile_lark(&g.lark)
        .map(Arc::new)
        .map_err(|e| bad(&g.param, format!("{} cannot be used: {e}", g.param)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::{JsonSchemaFormat, StructuredOutputs};

    #[test]
    fn one_constraint_at_most_and_unsupported_fields_named() {
        let c = OutputConstraints {
            response_format: Some(ResponseFormat::JsonObject),
            guided_regex: Some("a+".into()),
            ..Default::default()
        };
        let e = output_grammar(&c).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("guided_regex"));
        let c = OutputConstraints {
            guided_grammar: Some(json!("root ::= \"a\"")),
            ..Default::default()
        };
        assert_eq!(
            output_grammar(&c).unwrap_err().param.as_deref(),
            Some("guided_grammar")
        );
        let mut so = StructuredOutputs::default();
        so.other.insert("grammar".into(), json!("start: \"a\""));
        let c = OutputConstraints {
            structured_outputs: Some(so),
            ..Default::default()
        };
        assert_eq!(
            output_grammar(&c).unwrap_err().param.as_deref(),
            Some("structured_outputs.grammar")
        );
        let c = OutputConstraints {
            response_format: Some(ResponseFormat::JsonSchema {
                json_schema: JsonSchemaFormat {
                    name: "x".into(),
                    schema: Some(json!(3)),
                    ..Default::default()
                },
            }),
            ..Default::default()
        };
        assert_eq!(
            output_grammar(&c).unwrap_err().param.as_deref(),
            Some("response_format.json_schema.schema")
        );
        let c = OutputConstraints {
            response_format: Some(ResponseFormat::Text),
            ..Default::default()
        };
        assert_eq!(output_grammar(&c).unwrap(), None);
    }
}
