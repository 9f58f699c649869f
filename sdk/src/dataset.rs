//! Datasets from the plugin's packaged data files (JSONL), parsed once per instance and served in
//! pages.
//!
//! Row format: a JSON object per line with `question` (or `problem`) and `answer` (string or
//! number), an optional `id` (default: the line number) and an optional `prompt` (messages);
//! every other field goes to the example's `info`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::{Map, Value};

use crate::types::{DatasetPage, Example, PluginError};

/// Parses JSONL rows into examples. `source` names the file in errors.
pub fn parse_jsonl(bytes: &[u8], source: &str) -> Result<Vec<Example>, PluginError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| PluginError::Internal(format!("{source} is not UTF-8: {e}")))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let row: Map<String, Value> = serde_json::from_str(line).map_err(|e| {
            PluginError::Internal(format!("{source} line {}: invalid JSON object: {e}", n + 1))
        })?;
        out.push(
            example_from_row(row, n)
                .map_err(|msg| PluginError::Internal(format!("{source} line {}: {msg}", n + 1)))?,
        );
    }
    Ok(out)
}

fn example_from_row(mut row: Map<String, Value>, line: usize) -> Result<Example, String> {
    let text = |v: Value| match v {
        Value::String(s) => Some(s),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    let id = match row.remove("id") {
        None => line.to_string(),
        Some(v) => text(v).ok_or("`id` must be a string or number")?,
    };
    let question = match row.remove("question").or_else(|| row.remove("problem")) {
        None => String::new(),
        Some(v) => text(v).ok_or("`question` must be a string")?,
    };
    let answer = text(row.remove("answer").ok_or("missing `answer`")?)
        .ok_or("`answer` must be a string or number")?;
    let prompt = match row.remove("prompt") {
        None => Vec::new(),
        Some(v) => serde_json::from_value(v).map_err(|e| format!("invalid `prompt`: {e}"))?,
    };
    if question.is_empty() && prompt.is_empty() {
        return Err("needs `question` (or `problem`) or `prompt`".into());
    }
    Ok(Example {
        id,
        prompt,
        question,
        answer,
        info: Value::Object(row).to_string(),
    })
}

/// Rows `offset..offset + limit` of `examples`.
pub fn page(examples: &[Example], offset: u64, limit: u32) -> DatasetPage {
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(examples.len());
    let end = start.saturating_add(limit as usize).min(examples.len());
    DatasetPage {
        examples: examples[start..end].to_vec(),
        total: examples.len() as u64,
    }
}

type Cache = Mutex<HashMap<String, Arc<Vec<Example>>>>;

/// The examples of data file `path`, read with [`host::read_data`](crate::host::read_data) and
/// parsed on first use, then cached for the life of the plugin instance.
pub fn load_jsonl(path: &str) -> Result<Arc<Vec<Example>>, PluginError> {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(hit) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(path) {
        return Ok(hit.clone());
    }
    let bytes = crate::host::read_data(path)
        .map_err(|e| PluginError::Internal(format!("cannot read data file {path}: {e}")))?;
    let examples = Arc::new(parse_jsonl(&bytes, path)?);
    cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(path.to_owned(), examples.clone());
    Ok(examples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rows_and_keeps_extra_fields_in_info() {
        let data = br#"{"id": "a", "problem": "1+1?", "answer": 2, "level": "Level 1"}

{"question": "2+2?", "answer": "4"}
"#;
        let ex = parse_jsonl(data, "train.jsonl").unwrap();
        assert_eq!(ex.len(), 2);
        assert_eq!(ex[0].id, "a");
        assert_eq!(ex[0].answer, "2");
        assert_eq!(ex[0].info, r#"{"level":"Level 1"}"#);
        assert_eq!(ex[1].id, "2", "line number as id");
        assert_eq!(ex[1].info, "{}");
    }

    #[test]
    fn errors_name_file_and_line() {
        let err = parse_jsonl(b"{\"question\": \"q\"}\n", "t.jsonl").unwrap_err();
        assert_eq!(
            err,
            PluginError::Internal("t.jsonl line 1: missing `answer`".into())
        );
        let err = parse_jsonl(b"{\"answer\": 1}\nnot json\n", "t.jsonl").unwrap_err();
        assert!(err.to_string().contains("t.jsonl line 1"), "{err}");
    }

    #[test]
    fn pages_clamp_to_the_end() {
        let ex = parse_jsonl(b"{\"question\":\"a\",\"answer\":1}\n{\"question\":\"b\",\"answer\":2}\n{\"question\":\"c\",\"answer\":3}\n", "t").unwrap();
        assert_eq!(page(&ex, 1, 10).examples.len(), 2);
        assert_eq!(page(&ex, 1, 10).total, 3);
        assert!(page(&ex, 9, 10).examples.is_empty());
        assert_eq!(page(&ex, u64::MAX, u32::MAX).examples.len(), 0);
    }
}
