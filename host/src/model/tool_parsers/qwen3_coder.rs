//! Qwen3-Coder XML calls (also PrimeIntellect's Qwen3 derivatives):
//!
//! ```text
//! <tool_call>
//! <function=python>
//! <parameter=code>
//! print(2**100)
//! print('done')
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! Values are raw text (one leading and one trailing newline removed), typed by the offered
//! tool's JSON schema: integers, numbers (whole floats become ints), booleans (`true` or else
//! false), objects/arrays (JSON, then Python literals), strings kept. Structural rules keep code
//! that contains the format intact: `<parameter=` counts at the start of a line, `</parameter>`
//! only before another parameter or the end of the function, `</tool_call>` only before another
//! call or the end. A call with an invalid name is dropped (and reported); others are kept.

use rlhost_sdk::types::Tool;

use super::{ParseOutcome, ParsedCall, ToolCallParser};
use crate::model::chat_template::python_json;

/// The qwen3_coder parser.
pub struct Qwen3Coder;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const FUNC: &str = "<function=";
const END_FUNC: &str = "</function>";
const PARAM: &str = "<parameter=";
const END_PARAM: &str = "</parameter>";

/// `<tool_call>` blocks; the text itself when there are none.
fn blocks(text: &str) -> Vec<(usize, &str)> {
    if !text.contains(OPEN) {
        return vec![(0, text)];
    }
    let mut out = vec![];
    let mut at = 0;
    while let Some(i) = text[at..].find(OPEN) {
        let start = at + i + OPEN.len();
        let mut end = text.len();
        let mut next = text.len();
        let mut search = start;
        while let Some(j) = text[search..].find(CLOSE) {
            let c = search + j;
            let after = text[c + CLOSE.len()..].trim_start();
            if after.is_empty() || after.starts_with(OPEN) {
                end = c;
                next = c + CLOSE.len();
                break;
            }
            search = c + CLOSE.len();
        }
        out.push((at + i, &text[start..end]));
        at = next;
        if at >= text.len() {
            break;
        }
    }
    out
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name
            .chars()
            .any(|c| c.is_whitespace() || "\"'{}<>".contains(c))
}

/// Line-start positions of `<parameter=` in `body`.
fn param_starts(body: &str) -> Vec<usize> {
    body.match_indices(PARAM)
        .map(|(i, _)| i)
        .filter(|&i| i == 0 || body[..i].ends_with('\n'))
        .collect()
}

fn parameters(body: &str) -> Vec<(String, String)> {
    let starts = param_starts(body);
    let mut out: Vec<(String, String)> = vec![];
    for (k, &s) in starts.iter().enumerate() {
        let rest = &body[s + PARAM.len()..];
        let Some(gt) = rest.find('>') else { continue };
        let name = rest[..gt].to_string();
        let value_start = s + PARAM.len() + gt + 1;
        let limit = starts
            .get(k + 1)
            .copied()
            .unwrap_or(body.len())
            .max(value_start);
        let region = &body[value_start..];
        // The last `</parameter>` before the next parameter that is followed by a boundary.
        let mut end = None;
        let mut search = 0;
        while let Some(j) = region[search..].find(END_PARAM) {
            let c = value_start + search + j;
            if c > limit {
                break;
            }
            let after = body[c + END_PARAM.len()..].trim_start();
            if after.is_empty()
                || after.starts_with(PARAM)
                || after.starts_with(END_FUNC)
                || after.starts_with(CLOSE)
            {
                end = Some(c);
            }
            search += j + END_PARAM.len();
        }
        let end = end.unwrap_or_else(|| {
            let tail = &body[value_start..limit];
            value_start + tail.find(END_FUNC).unwrap_or(tail.len())
        });
        let mut value = &body[value_start..end.max(value_start)];
        value = value.strip_prefix('\n').unwrap_or(value);
        value = value.strip_suffix('\n').unwrap_or(value);
        out.retain(|(n, _)| *n != name);
        out.push((name, value.to_string()));
    }
    out
}

/// The schema of `param` of tool `name`.
fn schema(tools: &[Tool], name: &str, param: &str) -> Option<serde_json::Value> {
    let tool = tools.iter().find(|t| t.name == name)?;
    let params: serde_json::Value = serde_json::from_str(&tool.parameters).ok()?;
    params.get("properties")?.get(param).cloned()
}

fn schema_type(s: &serde_json::Value) -> (String, bool) {
    if let Some(t) = s.get("type") {
        return match t {
            serde_json::Value::String(t) => (t.to_lowercase(), false),
            serde_json::Value::Array(a) => {
                let nullable = a.iter().any(|x| x == "null");
                let first = a.iter().filter_map(|x| x.as_str()).find(|x| *x != "null");
                (first.unwrap_or("string").to_lowercase(), nullable)
            }
            _ => ("string".into(), false),
        };
    }
    if let Some(any) = s.get("anyOf").and_then(|a| a.as_array()) {
        let nullable = any
            .iter()
            .any(|x| x.get("type").is_some_and(|t| t == "null"));
        let first = any
            .iter()
            .find(|x| x.get("type").is_some_and(|t| t != "null"));
        return (
            first.map_or("string".into(), |f| schema_type(f).0),
            nullable,
        );
    }
    ("string".into(), false)
}

fn convert(raw: &str, schema: Option<&serde_json::Value>) -> serde_json::Value {
    use serde_json::Value as V;
    let Some(schema) = schema else {
        return V::String(raw.into());
    };
    let (ty, nullable) = schema_type(schema);
    let is_string = matches!(
        ty.as_str(),
        "string" | "str" | "text" | "varchar" | "char" | "enum"
    );
    if (!is_string || nullable) && (raw.eq_ignore_ascii_case("null") || raw == "None") {
        return V::Null;
    }
    if is_string {
        return V::String(raw.into());
    }
    let t = raw.trim();
    if ["int", "uint", "long", "short", "unsigned"]
        .iter()
        .any(|p| ty.starts_with(p))
    {
        return t
            .parse::<i64>()
            .map_or_else(|_| V::String(raw.into()), V::from);
    }
    if ty.starts_with("num") || ty.starts_with("float") {
        return match t.parse::<f64>() {
            Ok(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 9e15 => V::from(f as i64),
            Ok(f) if f.is_finite() => V::from(f),
            _ => V::String(raw.into()),
        };
    }
    if matches!(ty.as_str(), "boolean" | "bool" | "binary") {
        return V::Bool(t.to_lowercase() == "true");
    }
    if let Ok(v) = serde_json::from_str::<V>(t) {
        return match v {
            V::String(s) => python_literal(&s).unwrap_or(V::String(s)),
            other => other,
        };
    }
    python_literal(t).unwrap_or_else(|| V::String(raw.into()))
}

/// Python's `ast.literal_eval` for the literals tool arguments use (dicts, lists, tuples,
/// strings, numbers, booleans, None).
fn python_literal(s: &str) -> Option<serde_json::Value> {
    struct P<'a> {
        s: &'a [u8],
        i: usize,
        depth: u32,
    }
    impl P<'_> {
        fn ws(&mut self) {
            while self.s.get(self.i).is_some_and(u8::is_ascii_whitespace) {
                self.i += 1;
            }
        }
        fn value(&mut self) -> Option<serde_json::Value> {
            use serde_json::Value as V;
            self.depth += 1;
            if self.depth > 100 {
                return None;
            }
            self.ws();
            let v = match *self.s.get(self.i)? {
                b'{' => {
                    self.i += 1;
                    let mut m = serde_json::Map::new();
                    loop {
                        self.ws();
                        if self.s.get(self.i) == Some(&b'}') {
                            self.i += 1;
                            break;
                        }
                        let k = match self.value()? {
                            V::String(k) => k,
                            other => other.to_string(),
                        };
                        self.ws();
                        (self.s.get(self.i) == Some(&b':')).then_some(())?;
                        self.i += 1;
                        let v = self.value()?;
                        m.insert(k, v);
                        self.ws();
                        match self.s.get(self.i)? {
                            b',' => self.i += 1,
                            b'}' => {}
                            _ => return None,
                        }
                    }
                    V::Object(m)
                }
                open @ (b'[' | b'(') => {
                    let close = if open == b'[' { b']' } else { b')' };
                    self.i += 1;
                    let mut a = vec![];
                    loop {
                        self.ws();
                        if self.s.get(self.i) == Some(&close) {
                            self.i += 1;
                            break;
                        }
                        a.push(self.value()?);
                        self.ws();
                        match *self.s.get(self.i)? {
                            b',' => self.i += 1,
                            c if c == close => {}
                            _ => return None,
                        }
                    }
                    V::Array(a)
                }
                q @ (b'\'' | b'"') => {
                    self.i += 1;
                    let mut out = Vec::new();
                    loop {
                        let c = *self.s.get(self.i)?;
                        self.i += 1;
                        match c {
                            b'\\' => {
                                let e = *self.s.get(self.i)?;
                                self.i += 1;
                                out.push(match e {
                                    b'n' => b'\n',
                                    b't' => b'\t',
                                    b'r' => b'\r',
                                    other => other,
                                });
                            }
                            c if c == q => break,
                            c => out.push(c),
                        }
                    }
                    V::String(String::from_utf8(out).ok()?)
                }
                _ => {
                    let start = self.i;
                    while self
                        .s
                        .get(self.i)
                        .is_some_and(|c| c.is_ascii_alphanumeric() || b"+-._".contains(c))
                    {
                        self.i += 1;
                    }
                    let word = std::str::from_utf8(&self.s[start..self.i]).ok()?;
                    match word {
                        "True" => V::Bool(true),
                        "False" => V::Bool(false),
                        "None" => V::Null,
                        w => {
                            if let Ok(n) = w.parse::<i64>() {
                                V::from(n)
                            } else {
                                V::from(w.parse::<f64>().ok().filter(|f| f.is_finite())?)
                            }
                        }
                    }
                }
            };
            self.depth -= 1;
            Some(v)
        }
    }
    let mut p = P {
        s: s.as_bytes(),
        i: 0,
        depth: 0,
    };
    let v = p.value()?;
    p.ws();
    (p.i == s.len()).then_some(v)
}

impl ToolCallParser for Qwen3Coder {
    fn name(&self) -> &'static str {
        "qwen3_coder"
    }

    /// Parameters in the schema's order (required ones always, others optional), each value in
    /// the raw form the parser reads: strings as text (up to `maxLength` characters; never
    /// containing a line `</parameter>`), string enums as one of their values, everything else
    /// as JSON valid against its schema.
    fn call_grammar(&self, rule: &str, name: &str, parameters: &serde_json::Value) -> String {
        use super::{lark_json, lark_literal};
        let mut rules = String::new();
        let mut body = vec![lark_literal(&format!("{OPEN}\n{FUNC}{name}>\n"))];
        let required: Vec<&str> = parameters["required"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
            .unwrap_or_default();
        let end = format!("\n{END_PARAM}\n");
        if let Some(props) = parameters["properties"].as_object() {
            for (k, (param, schema)) in props.iter().enumerate() {
                let p_rule = format!("{rule}_p{k}");
                let open = lark_literal(&format!("{PARAM}{param}>\n"));
                let strings: Option<Vec<&str>> = schema["enum"]
                    .as_array()
                    .and_then(|e| e.iter().map(|v| v.as_str()).collect());
                let is_string = schema["type"] == "string"
                    || (schema.get("type").is_none() && schema.get("enum").is_none());
                let value = if let Some(values) = strings {
                    let alts: Vec<String> = values.iter().map(|v| lark_literal(v)).collect();
                    format!("({}) {}", alts.join(" | "), lark_literal(&end))
                } else if is_string {
                    let most = schema["maxLength"]
                        .as_u64()
                        .map_or("*".to_string(), |n| format!("{{0,{n}}}"));
                    let text = format!("{p_rule}_text");
                    rules.push_str(&format!(
                        "{text}[suffix={}]: /(?s:.{most})/\n",
                        lark_literal(&end)
                    ));
                    text
                } else {
                    format!("{} {}", lark_json(schema), lark_literal(&end))
                };
                rules.push_str(&format!("{p_rule}: {open} {value}\n"));
                let optional = if required.contains(&param.as_str()) {
                    ""
                } else {
                    "?"
                };
                body.push(format!("{p_rule}{optional}"));
            }
        }
        body.push(lark_literal(&format!("{END_FUNC}\n{CLOSE}")));
        format!("{rule}: {}\n{rules}", body.join(" "))
    }

    fn partial(&self, text: &str, tools: &[Tool]) -> Vec<ParsedCall> {
        let mut out = vec![];
        if !text.contains(FUNC) {
            return out;
        }
        for (_, block) in blocks(text) {
            let Some(f) = block.find(FUNC) else { break };
            let rest = &block[f + FUNC.len()..];
            let Some(gt) = rest.find('>') else { break };
            let name = &rest[..gt];
            if !valid_name(name) {
                break;
            }
            let body = &rest[gt + 1..];
            // A parameter is settled once the next one starts or the function ends after it.
            let starts = param_starts(body);
            let settled = match body.rfind(END_FUNC) {
                Some(e) => starts.iter().filter(|&&s| s < e).count(),
                None => starts.len().saturating_sub(1),
            };
            let mut arguments = String::from("{");
            for (k, (param, raw)) in parameters(body).into_iter().take(settled).enumerate() {
                if k > 0 {
                    arguments.push_str(", ");
                }
                let value = convert(&raw, schema(tools, name, &param).as_ref());
                arguments.push_str(&python_json(&serde_json::Value::String(param), None));
                arguments.push_str(": ");
                arguments.push_str(&python_json(&value, None));
            }
            out.push(ParsedCall {
                name: name.to_string(),
                arguments,
            });
        }
        out
    }

    fn parse(&self, text: &str, tools: &[Tool]) -> ParseOutcome {
        if !text.contains(FUNC) {
            return ParseOutcome {
                content: (!text.is_empty()).then(|| text.to_string()),
                ..Default::default()
            };
        }
        let mut calls = vec![];
        let mut errors = vec![];
        let mut content_end = None;
        for (block_start, block) in blocks(text) {
            let Some(f) = block.find(FUNC) else { continue };
            if content_end.is_none() {
                content_end = Some(if text.contains(OPEN) { block_start } else { f });
            }
            let rest = &block[f + FUNC.len()..];
            let Some(gt) = rest.find('>') else {
                errors.push("a <function= without its closing >".to_string());
                continue;
            };
            let name = &rest[..gt];
            if !valid_name(name) {
                errors.push(format!("invalid function name {name:?}"));
                continue;
            }
            let mut body = &rest[gt + 1..];
            if let Some(end) = body.rfind(END_FUNC)
                && body[end + END_FUNC.len()..].trim().is_empty()
            {
                body = &body[..end];
            }
            let mut args = serde_json::Map::new();
            for (param, raw) in parameters(body) {
                let s = schema(tools, name, &param);
                args.insert(param, convert(&raw, s.as_ref()));
            }
            calls.push(ParsedCall {
                name: name.to_string(),
                arguments: python_json(&serde_json::Value::Object(args), None),
            });
        }
        let content = &text[..content_end.unwrap_or(0).min(text.len())];
        ParseOutcome {
            content: (!content.is_empty()).then(|| content.to_string()),
            calls,
            error: (!errors.is_empty()).then(|| errors.join("; ")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Tool {
        Tool {
            name: "get_current_weather".into(),
            description: String::new(),
            parameters: r#"{"type":"object","properties":{"city":{"type":"string"},"state":{"type":"string"},"unit":{"type":"string"},"days":{"type":"integer"},"temp":{"type":"number"},"metric":{"type":"boolean"},"dimensions":{"type":"object"},"tags":{"type":["array","null"]}}}"#.into(),
        }
    }

    /// Every prefix's calls are prefixes of the finished output's: parameter by parameter.
    #[test]
    fn partial_calls_grow_into_the_parsed_ones() {
        let text = "Checking.\n<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_current_weather>\n</function>\n</tool_call>";
        let tools = [weather()];
        let whole = Qwen3Coder.parse(text, &tools);
        assert_eq!(whole.calls.len(), 2);
        let mut sizes = std::collections::BTreeSet::new();
        for cut in 0..=text.len() {
            let part = Qwen3Coder.partial(&text[..cut], &tools);
            for (p, w) in part.iter().zip(&whole.calls) {
                assert_eq!(p.name, w.name);
                assert!(w.arguments.starts_with(&p.arguments), "at {cut}: {p:?}");
            }
            sizes.insert(part.first().map_or(0, |p| p.arguments.len()));
        }
        // Nothing, the opening brace, then one size per parameter.
        assert!(sizes.len() >= 4, "{sizes:?}");
    }

    #[test]
    fn literal_examples() {
        let text = "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n<parameter=state>\nTX\n</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>\n</function>\n</tool_call>";
        let out = Qwen3Coder.parse(text, &[weather()]);
        assert_eq!(out.content, None);
        assert_eq!(out.calls.len(), 1);
        assert_eq!(out.calls[0].name, "get_current_weather");
        assert_eq!(
            out.calls[0].arguments,
            r#"{"city": "Dallas", "state": "TX", "unit": "fahrenheit"}"#
        );
        let code = "Sure.\n<tool_call>\n<function=python>\n<parameter=code>\nprint(2**100)\nprint('done')\n</parameter>\n</function>\n</tool_call>";
        let out = Qwen3Coder.parse(code, &[]);
        assert_eq!(out.content.as_deref(), Some("Sure.\n"));
        assert_eq!(
            out.calls[0].arguments,
            r#"{"code": "print(2**100)\nprint('done')"}"#
        );
    }

    #[test]
    fn values_are_typed_by_the_schema() {
        let text = "<tool_call>\n<function=get_current_weather>\n<parameter=days>\n3\n</parameter>\n<parameter=temp>\n3.0\n</parameter>\n<parameter=metric>\nyes\n</parameter>\n<parameter=dimensions>\n{\"width\": 10, \n \"height\": 20}\n</parameter>\n<parameter=tags>\n['a', True, None]\n</parameter>\n<parameter=city>\nnull\n</parameter>\n</function>\n</tool_call>";
        let out = Qwen3Coder.parse(text, &[weather()]);
        assert_eq!(
            out.calls[0].arguments,
            r#"{"days": 3, "temp": 3, "metric": false, "dimensions": {"width": 10, "height": 20}, "tags": ["a", true, null], "city": "null"}"#
        );
    }

    #[test]
    fn code_containing_the_format_round_trips_and_bad_calls_are_dropped() {
        let inner = "s = '</parameter>'\nprint(s)";
        let text = format!(
            "<tool_call>\n<function=python>\n<parameter=code>\n{inner}\n</parameter>\n</function>\n</tool_call>"
        );
        let out = Qwen3Coder.parse(&text, &[]);
        assert_eq!(
            out.calls[0].arguments,
            python_json(&serde_json::json!({"code": inner}), None)
        );
        let out = Qwen3Coder.parse(
            "<function=python>\n<parameter=code>\n1\n</parameter>\n</function>",
            &[],
        );
        assert_eq!(
            out.calls.len(),
            1,
            "no <tool_call> tags: the whole text is one block"
        );
        let bad = "<tool_call>\n<function={{ tc.name }}>\n</function>\n</tool_call>\n<tool_call>\n<function=ok>\n</function>\n</tool_call>";
        let out = Qwen3Coder.parse(bad, &[]);
        assert_eq!(out.calls.len(), 1);
        assert_eq!(out.calls[0].name, "ok");
        assert!(out.error.unwrap().contains("invalid function name"));
        let out = Qwen3Coder.parse("no calls here", &[]);
        assert_eq!(out.content.as_deref(), Some("no calls here"));
    }
}
