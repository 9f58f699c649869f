//! Chat templates against the golden renders made with transformers 5.23 `apply_chat_template`
//! (`../shared/models/qwen3/golden/chat_template_cases.json`): every case of the Qwen3 and
//! Qwen3-Coder templates renders byte for byte, and tokenizes to the golden ids.

use std::path::{Path, PathBuf};

use rlhost::model::{ChatTemplate, Tokenizer};

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/models")
}

/// Renders a golden case with `template` and checks the text; returns it.
fn renders_the_golden_case(template: &ChatTemplate, case: &serde_json::Value) -> String {
    let name = case["name"].as_str().unwrap();
    let rendered = template
        .apply(
            &case["messages"],
            Some(&case["tools"]),
            case["kwargs"].as_object().unwrap(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(rendered, case["rendered"].as_str().unwrap(), "{name}");
    rendered
}

#[test]
fn templates_render_the_golden_cases_byte_for_byte() {
    let dir = models();
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("qwen3/golden/chat_template_cases.json")).unwrap(),
    )
    .unwrap();
    let tok = Tokenizer::load(&dir.join("qwen3")).unwrap();
    let qwen3 = ChatTemplate::load(&dir.join("qwen3")).unwrap();
    let coder_src = std::fs::read_to_string(
        dir.join("qwen3-coder-template/Qwen3-Coder-30B-A3B-Instruct.chat_template.jinja"),
    )
    .unwrap();
    let coder = ChatTemplate::new(&coder_src).unwrap();
    let cases = golden["cases"].as_array().unwrap();
    assert!(cases.len() >= 15);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let template = if case["template"]
            .as_str()
            .unwrap()
            .starts_with("qwen3-coder")
        {
            &coder
        } else {
            &qwen3
        };
        let rendered = renders_the_golden_case(template, case);
        let ids: Vec<u32> = serde_json::from_value(case["input_ids"].clone()).unwrap();
        assert_eq!(tok.encode(&rendered).unwrap(), ids, "{name}: token ids");
    }
}

/// The template rlhost writes into the models it creates speaks Qwen3's wire format: it renders
/// every golden Qwen3 case exactly as Qwen3's own template does.
#[test]
fn rlhost_template_renders_qwen3s_golden_cases() {
    let dir = models();
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("qwen3/golden/chat_template_cases.json")).unwrap(),
    )
    .unwrap();
    let ours = ChatTemplate::new(rlhost::model::tiny_tokenizer::CHAT_TEMPLATE).unwrap();
    let mut checked = 0;
    for case in golden["cases"].as_array().unwrap() {
        if !case["template"].as_str().unwrap().starts_with("qwen3/") {
            continue;
        }
        renders_the_golden_case(&ours, case);
        checked += 1;
    }
    assert!(checked >= 15, "{checked} Qwen3 cases");
}

#[test]
fn tojson_is_pythons_json_dumps() {
    let v = serde_json::json!({"b": [1, 2.5, "é\n\"x\""], "a": {}, "c": null, "d": 2.0});
    assert_eq!(
        rlhost::model::chat_template::python_json(&v, None),
        r#"{"b": [1, 2.5, "é\n\"x\""], "a": {}, "c": null, "d": 2.0}"#
    );
    assert_eq!(
        rlhost::model::chat_template::python_json(&serde_json::json!({"a": [1]}), Some(2)),
        "{\n  \"a\": [\n    1\n  ]\n}"
    );
}

#[test]
fn broken_templates_are_errors_not_panics() {
    assert!(ChatTemplate::new("{% for %}").is_err());
    let t = ChatTemplate::new("{{ raise_exception('no system role') }}").unwrap();
    let err = t
        .render(&serde_json::json!([]), None, false, &Default::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("no system role"), "{err}");
}

#[test]
fn deltas_extend_the_token_stream_without_re_rendering_history() {
    let dir = models().join("qwen3");
    let tok = Tokenizer::load(&dir).unwrap();
    let t = ChatTemplate::load(&dir).unwrap();
    let tools = serde_json::json!([{"type": "function", "function": {"name": "python", "description": "Run code", "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}]);
    let user = serde_json::json!({"role": "user", "content": "What is 6*7?"});
    let assistant = serde_json::json!({
        "role": "assistant",
        "content": "",
        "reasoning_content": "Use the tool.",
        "tool_calls": [{"type": "function", "function": {"name": "python", "arguments": {"code": "print(6*7)"}}}]
    });
    let tool = serde_json::json!({"role": "tool", "content": "42"});
    let none = serde_json::Map::new();
    // A tool result: the same user turn goes on.
    let d = t
        .render_delta(
            &tok,
            &[user.clone(), assistant.clone()],
            std::slice::from_ref(&tool),
            Some(&tools),
            &none,
        )
        .unwrap();
    assert_eq!(
        d.text,
        "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(d.ids, tok.encode(&d.text).unwrap());
    assert!(
        d.prefix_preserving,
        "within one user turn Qwen3 keeps the reasoning"
    );
    // The prompt + generated tokens + delta equal a from-scratch render here.
    let prompt = t
        .render(&serde_json::json!([user]), Some(&tools), true, &none)
        .unwrap();
    let full = t
        .render(
            &serde_json::json!([user, assistant, tool]),
            Some(&tools),
            true,
            &none,
        )
        .unwrap();
    let generated = full[prompt.len()..full.len() - d.text.len()].to_string();
    assert!(generated.ends_with("<|im_end|>"), "{generated:?}");
    assert_eq!(format!("{prompt}{generated}{}", d.text), full);

    // A new user question: Qwen3 drops the earlier reasoning on re-render, the delta does not
    // depend on it.
    let answer = serde_json::json!({"role": "assistant", "content": "It is 42.", "reasoning_content": "Done."});
    let history = [user, assistant, tool, answer];
    let next = serde_json::json!({"role": "user", "content": "And 6*8?"});
    let d = t
        .render_delta(&tok, &history, &[next], Some(&tools), &none)
        .unwrap();
    assert_eq!(
        d.text,
        "\n<|im_start|>user\nAnd 6*8?<|im_end|>\n<|im_start|>assistant\n"
    );
    assert!(
        !d.prefix_preserving,
        "re-rendering drops the past <think> blocks"
    );
}

/// What a conversation's token stream gets after the model's turn, with Qwen3's real template:
/// the end-of-turn marker's line break, the new messages and the generation prompt, whatever
/// the template does to the earlier turn on a full re-render (it drops the reasoning of turns
/// before a new user message, so that re-render no longer extends what the model saw).
#[test]
fn qwen3_deltas_continue_the_history_as_produced() {
    let dir = models().join("qwen3");
    let tok = Tokenizer::load(&dir).unwrap();
    let qwen3 = ChatTemplate::load(&dir).unwrap();
    let none = serde_json::Map::new();
    let tools = serde_json::json!([{"type": "function", "function": {"name": "python",
        "description": "Run Python.", "parameters": {"type": "object",
        "properties": {"code": {"type": "string"}}, "required": ["code"]}}}]);
    let history = vec![
        serde_json::json!({"role": "user", "content": "What is 6 times 7?"}),
        serde_json::json!({"role": "assistant",
            "content": "<think>\nUse the tool.\n</think>\n\n",
            "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "python", "arguments": {"code": "print(6*7)"}}}]}),
    ];
    let tool = [serde_json::json!({"role": "tool", "tool_call_id": "c1", "content": "42"})];
    let d = qwen3
        .render_delta(&tok, &history, &tool, Some(&tools), &none)
        .unwrap();
    assert_eq!(
        d.text,
        "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(d.ids, tok.encode(&d.text).unwrap());
    // A tool result keeps the reasoning on a re-render too (no new user query).
    assert!(d.prefix_preserving);
    // A new user message: Qwen3 re-renders the earlier turn without its reasoning, the delta
    // does not care.
    let user = [serde_json::json!({"role": "user", "content": "And 6 times 8?"})];
    let d = qwen3
        .render_delta(&tok, &history, &user, Some(&tools), &none)
        .unwrap();
    assert_eq!(
        d.text,
        "\n<|im_start|>user\nAnd 6 times 8?<|im_end|>\n<|im_start|>assistant\n"
    );
    assert!(!d.prefix_preserving);
}
