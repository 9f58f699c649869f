//! `host rl --help`, generated from the configuration's types: every key of every section with
//! its type, default and the first line of its doc comment, read from the JSON schema that
//! `schemars` derives from the same structs serde parses. A key added to a config struct shows
//! up here without anyone writing help for it.

use serde_json::Value;

use super::RlConfig;

/// One key of the configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyDoc {
    /// Dotted path from the section (`trainer.optim.lr`); an element of a list of tables is
    /// `[]` (`orchestrator.env[].weight`).
    pub path: String,
    /// The value's type as written in TOML (`FLOAT`, `INT`, `BOOL`, `STRING`, `a|b`, `[FLOAT]`,
    /// `TABLE`, `[TABLE]`).
    pub ty: String,
    /// The default (None where unset by default).
    pub default: Option<Value>,
    /// The doc comment's first paragraph.
    pub doc: String,
    /// For a choice, each value and its doc.
    pub choices: Vec<(String, String)>,
}

/// Every key of `host rl`'s configuration, in declaration order of the sections (trainer,
/// orchestrator, inference, monitor), each table's keys in the schema's order.
pub fn keys() -> Vec<KeyDoc> {
    let schema = schemars::schema_for!(RlConfig);
    let root = schema.as_value();
    let mut out = Vec::new();
    for section in ["trainer", "orchestrator", "inference", "monitor"] {
        let node = &root["properties"][section];
        walk(root, node, section, &mut out);
    }
    out
}

/// The schema `node` refers to (itself when it holds no `$ref`).
fn deref<'a>(root: &'a Value, node: &'a Value) -> &'a Value {
    match node.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let name = r.rsplit('/').next().unwrap_or(r);
            &root["$defs"][name]
        }
        None => node,
    }
}

/// The struct an optional table (`anyOf: [$ref, null]`) holds, if `node` is one.
fn optional_table<'a>(root: &'a Value, node: &'a Value) -> Option<&'a Value> {
    let any = node.get("anyOf")?.as_array()?;
    let inner = any.iter().find(|v| v.get("$ref").is_some())?;
    let target = deref(root, inner);
    target.get("properties").map(|_| target)
}

fn first_paragraph(text: &str) -> String {
    text.split("\n\n")
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

fn walk(root: &Value, node: &Value, path: &str, out: &mut Vec<KeyDoc>) {
    let target = deref(root, node);
    if let Some(props) = target.get("properties").and_then(Value::as_object) {
        for (name, child) in props {
            let child_path = format!("{path}.{name}");
            let inner = deref(root, child);
            if inner.get("properties").is_some() {
                walk(root, child, &child_path, out);
                continue;
            }
            if let Some(table) = optional_table(root, child) {
                walk(root, table, &child_path, out);
                continue;
            }
            if let Some(items) = child.get("items") {
                let item = deref(root, items);
                if item.get("properties").is_some() {
                    out.push(leaf(root, child, &child_path));
                    walk(root, items, &format!("{child_path}[]"), out);
                    continue;
                }
            }
            out.push(leaf(root, child, &child_path));
        }
    }
}

fn leaf(root: &Value, node: &Value, path: &str) -> KeyDoc {
    // An optional value (`anyOf: [X, null]`) is documented as X.
    let target = match node.get("anyOf").and_then(Value::as_array) {
        Some(any) => any
            .iter()
            .find(|v| v.get("type").and_then(Value::as_str) != Some("null"))
            .map_or(node, |v| deref(root, v)),
        None => deref(root, node),
    };
    let doc = node
        .get("description")
        .or_else(|| target.get("description"))
        .and_then(Value::as_str)
        .map(first_paragraph)
        .unwrap_or_default();
    let choices: Vec<(String, String)> = target
        .get("oneOf")
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter_map(|v| {
                    let c = v.get("const")?.as_str()?.to_owned();
                    let d = v
                        .get("description")
                        .and_then(Value::as_str)
                        .map(first_paragraph)
                        .unwrap_or_default();
                    Some((c, d))
                })
                .collect()
        })
        .or_else(|| {
            target.get("enum").and_then(Value::as_array).map(|vs| {
                vs.iter()
                    .filter_map(|v| Some((v.as_str()?.to_owned(), String::new())))
                    .collect()
            })
        })
        .unwrap_or_default();
    let default = node.get("default").filter(|v| !v.is_null()).cloned();
    KeyDoc {
        path: path.to_owned(),
        ty: if choices.is_empty() {
            type_name(root, target)
        } else {
            choices
                .iter()
                .map(|(c, _)| c.as_str())
                .collect::<Vec<_>>()
                .join("|")
        },
        default,
        doc,
        choices,
    }
}

fn type_name(root: &Value, node: &Value) -> String {
    let node = deref(root, node);
    let types: Vec<&str> = match node.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let main = types.iter().find(|t| **t != "null").copied().unwrap_or("");
    match main {
        "number" => "FLOAT".into(),
        "integer" => "INT".into(),
        "boolean" => "BOOL".into(),
        "string" => "STRING".into(),
        "object" => "TABLE".into(),
        "array" => {
            let item = node
                .get("items")
                .map(|i| type_name(root, i))
                .unwrap_or_else(|| "VALUE".into());
            match node.get("maxItems").and_then(Value::as_u64) {
                Some(n) if node.get("minItems").and_then(Value::as_u64) == Some(n) => {
                    format!("[{}]", vec![item; n as usize].join(", "))
                }
                _ => format!("[{item}, ...]"),
            }
        }
        _ => match node.get("anyOf").and_then(Value::as_array) {
            Some(vs) => vs
                .iter()
                .find(|v| v.get("type").and_then(Value::as_str) != Some("null"))
                .map(|v| type_name(root, v))
                .unwrap_or_else(|| "VALUE".into()),
            None => "VALUE".into(),
        },
    }
}

fn show(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && (f.abs() < 1e-3 || f.abs() >= 1e6) && f != 0.0 => {
                format!("{f:e}")
            }
            _ => n.to_string(),
        },
        other => toml::Value::try_from(other)
            .map(|t| t.to_string())
            .unwrap_or_else(|_| other.to_string()),
    }
}

/// The text of `host rl --help`.
pub fn help() -> String {
    let mut s = String::from(
        "Train a policy with GRPO-style RL on installed environments: an orchestrator generates
scored rollouts, a trainer steps on them, the engine gets the new weights (prime-rl's
trainer / orchestrator / inference split).

Usage: host rl [--plugin NAME] [--trainer @ FILE] [--orchestrator @ FILE] [--inference @ FILE]
               [--monitor @ FILE] [--SECTION.KEY VALUE]... [--model.name MODEL]
               [--output-dir DIR] [--resume] [--allow-missing-capabilities]

Options:
  --plugin NAME
          Train on environment NAME, starting from configs/NAME/rl/{train,orch,infer}.toml
          when they exist (their values are the defaults the other flags change)
  --trainer @ FILE, --orchestrator @ FILE, --inference @ FILE, --monitor @ FILE
          Read a section from a TOML file; flags override it
  --model.name MODEL
          The model of every section (the policy trained and served)
  --output-dir DIR
          Checkpoints, metrics.jsonl, curves.png and final/ go here [default: outputs/rl]
  --resume
          Continue from the newest checkpoint in --output-dir
  --allow-missing-capabilities
          Run environments whose declared capabilities this host cannot grant (no Python
          sandbox): their tool calls fail, so every step line marks the rollouts that ran
          without them. Without it such an environment is refused before the first rollout
  -h, --help
          Print this help

Keys: `--SECTION.KEY VALUE` on the command line (hyphens and underscores alike; values are
TOML: numbers, booleans, arrays, inline tables, else strings) or `KEY = VALUE` in the
section's file. An entry of a list of tables is `KEY[N]` (`'--orchestrator.env[0].weight' 2`;
quote it in a shell).
Unknown keys, and keys that do not apply to the run, are errors naming the key.
",
    );
    let mut table = String::new();
    for k in keys() {
        let parent = k.path.rsplit_once('.').map_or("", |(p, _)| p).to_owned();
        if parent != table {
            s.push_str(&format!("\n[{parent}]\n"));
            table = parent;
        }
        let flag = k.path.replace('_', "-");
        s.push_str(&format!("  --{flag} <{}>\n", k.ty));
        let mut doc = k.doc.clone();
        if let Some(d) = &k.default {
            doc.push_str(&format!(" [default: {}]", show(d)));
        }
        for line in wrap(&doc, 88) {
            s.push_str(&format!("          {line}\n"));
        }
        for (c, d) in &k.choices {
            if !d.is_empty() {
                for (i, line) in wrap(&format!("{c}: {d}"), 86).into_iter().enumerate() {
                    let pad = if i == 0 { "- " } else { "  " };
                    s.push_str(&format!("          {pad}{line}\n"));
                }
            }
        }
    }
    s
}

fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut cur = String::new();
    for w in text.split_whitespace() {
        if !cur.is_empty() && cur.len() + 1 + w.len() > width {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(w);
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines
}
