//! End-to-end: `POST /v1/responses` and `POST /v1/messages` as agent harnesses meet them. The
//! official Python `openai` client drives the taught model of [`crate::inference`] through the
//! Responses API (plain, streamed, with its accumulating stream helper, cut by
//! `max_output_tokens`, and the tool round trip by output items, by `previous_response_id` and
//! streamed), and the `anthropic` client through the Messages API, next to
//! `/v1/chat/completions` for the same conversations: at temperature 0 the endpoints give the
//! same tokens, so texts, calls and token counts must agree. Fields the server cannot honour get
//! 400s naming them, and the streams are server-sent events whose `event:` lines name each
//! payload's type.

use std::process::Command;

use serde_json::{Value, json};

use crate::common;
use crate::inference::{QUESTION, post, rt, taught_server, tools};

/// The event types of a stream, in order, with repeated deltas folded into one.
fn folded(types: &Value) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for t in types.as_array().unwrap() {
        let t = t.as_str().unwrap().to_string();
        if !(t.ends_with("delta") && out.last() == Some(&t)) {
            out.push(t);
        }
    }
    out
}

/// The stream's sequence numbers count from 0 without gaps.
fn numbered(stream: &Value) {
    let seq: Vec<u64> = serde_json::from_value(stream["seq"].clone()).unwrap();
    assert_eq!(seq, (0..seq.len() as u64).collect::<Vec<_>>(), "{stream}");
}

#[test]
fn the_openai_client_drives_responses_like_chat_completions() {
    let (tmp, server) = taught_server();
    let Some(python) = common::reference_python("responses_openai_client") else {
        return;
    };
    let case = tmp.path().join("case.json");
    std::fs::write(
        &case,
        json!({"question": QUESTION, "tools": tools(), "tool_result": "42", "max_tokens": 40})
            .to_string(),
    )
    .unwrap();
    let stdout = common::run_ok(
        Command::new(python)
            .arg(common::repo_root().join("scripts/openai-responses-check.py"))
            .args(["--base-url", &server.url, "--model", "tiny", "--case"])
            .arg(&case),
    );
    let r: Value = serde_json::from_str(&stdout).unwrap();

    // Plain: the chat answer, as a message item, with the chat request's token counts.
    let plain = &r["plain"];
    assert_eq!(r["chat_plain"]["content"], "42", "{r}");
    assert_eq!(plain["output_text"], "42", "{plain}");
    assert_eq!(plain["object"], "response");
    assert_eq!(plain["status"], "completed");
    assert!(
        plain["id"].as_str().unwrap().starts_with("resp_"),
        "{plain}"
    );
    assert_eq!(plain["metadata"], json!({"run": "check"}));
    assert_eq!(plain["output"].as_array().unwrap().len(), 1, "{plain}");
    assert_eq!(plain["output"][0]["type"], "message");
    assert_eq!(plain["output"][0]["role"], "assistant");
    assert_eq!(plain["output"][0]["content"][0]["type"], "output_text");
    let chat_usage = &r["chat_plain"]["usage"];
    assert_eq!(plain["usage"]["input_tokens"], chat_usage["prompt_tokens"]);
    assert_eq!(
        plain["usage"]["output_tokens"],
        chat_usage["completion_tokens"]
    );
    assert_eq!(plain["usage"]["total_tokens"], chat_usage["total_tokens"]);
    assert_eq!(
        plain["usage"]["output_tokens_details"]["reasoning_tokens"],
        0
    );
    // The chat request before it prefilled the same prompt: the prefix cache served it.
    assert!(
        plain["usage"]["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0,
        "{plain}"
    );

    // Streamed: the event sequence the client consumes, the same text and counts.
    let stream = &r["stream"];
    numbered(stream);
    assert_eq!(
        folded(&stream["types"]),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ],
        "{stream}"
    );
    assert_eq!(stream["text"], plain["output_text"]);
    let last = &stream["final"];
    assert_eq!(last["status"], "completed");
    assert_eq!(last["output"][0]["content"][0]["text"], "42");
    assert_eq!(last["output"][0], stream["done"][0], "{stream}");
    for key in ["input_tokens", "output_tokens", "total_tokens"] {
        assert_eq!(last["usage"][key], plain["usage"][key], "{key}");
    }
    assert_eq!(r["helper"]["output_text"], "42", "{r}");

    // Cut by max_output_tokens: incomplete, and said why.
    let short = &r["short"];
    assert_eq!(short["status"], "incomplete", "{short}");
    assert_eq!(short["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(short["usage"]["output_tokens"], 1);
    let short_types = r["short_stream"]["types"].as_array().unwrap();
    assert_eq!(short_types.last().unwrap(), "response.incomplete");
    assert_eq!(r["short_stream"]["final"]["status"], "incomplete");

    // The tool call: one function_call item, the chat endpoint's call, the same token counts.
    let first = &r["tool_call"];
    let calls: Vec<&Value> = first["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["type"] == "function_call")
        .collect();
    assert_eq!(calls.len(), 1, "{first}");
    assert_eq!(calls[0]["name"], "python");
    let args = |v: &Value| serde_json::from_str::<Value>(v.as_str().unwrap()).unwrap();
    assert_eq!(
        args(&calls[0]["arguments"]),
        json!({"code": "print(6 * 7)"})
    );
    assert_eq!(
        args(&calls[0]["arguments"]),
        args(&r["chat_tool_call"]["calls"][0]["arguments"])
    );
    assert!(calls[0]["id"].as_str().unwrap().starts_with("fc_"));
    assert!(!calls[0]["call_id"].as_str().unwrap().is_empty());
    assert_eq!(
        first["usage"]["input_tokens"],
        r["chat_tool_call"]["usage"]["prompt_tokens"]
    );
    assert_eq!(
        first["usage"]["output_tokens"],
        r["chat_tool_call"]["usage"]["completion_tokens"]
    );
    assert_eq!(first["tools"][0]["name"], "python");
    // Streamed, the call is an item whose argument deltas spell its arguments.
    let cs = &r["tool_call_stream"];
    numbered(cs);
    assert_eq!(cs["added"], json!(["function_call"]), "{cs}");
    let types = folded(&cs["types"]);
    for t in [
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ] {
        assert!(types.contains(&t.to_string()), "{t} in {types:?}");
    }
    assert_eq!(cs["arguments"], cs["arguments_done"]);
    assert_eq!(args(&cs["arguments"]), json!({"code": "print(6 * 7)"}));
    assert_eq!(
        cs["done"][0]["call_id"],
        cs["final"]["output"][0]["call_id"]
    );

    // The function's output sent back: the chat endpoint's final answer, whichever way the
    // conversation is given, from the same prompt tokens.
    let chat_final = &r["chat_final"];
    assert_eq!(chat_final["content"], "The answer is 42.", "{r}");
    for key in ["final", "final_previous"] {
        assert_eq!(r[key]["output_text"], chat_final["content"], "{key}: {r}");
        assert_eq!(r[key]["status"], "completed");
        assert_eq!(
            r[key]["usage"]["input_tokens"], chat_final["usage"]["prompt_tokens"],
            "{key}"
        );
        assert_eq!(
            r[key]["usage"]["output_tokens"],
            chat_final["usage"]["completion_tokens"]
        );
    }
    assert_eq!(r["final_stream"]["text"], chat_final["content"]);
    assert_eq!(r["final_helper"]["output_text"], chat_final["content"]);

    // Refused by name.
    let refused = &r["refused"];
    for (case, param) in [
        ("background", "background"),
        ("web_search", "tools[0].type"),
        ("json_schema", "text.format"),
        ("truncation", "truncation"),
        ("unknown_previous", "previous_response_id"),
        ("logprobs", "include[0]"),
        ("top_logprobs", "top_logprobs"),
        ("builtin_item", "input[0].type"),
        ("builtin_choice", "tool_choice.type"),
        ("max_output_tokens", "max_output_tokens"),
        ("summary", "reasoning.summary"),
        ("image", "input[0].content[0]"),
        ("no_input", "input"),
    ] {
        assert_eq!(refused[case]["status"], 400, "{case}: {refused}");
        assert_eq!(refused[case]["param"], param, "{case}: {refused}");
    }
    assert!(
        refused["web_search"]["message"]
            .as_str()
            .unwrap()
            .contains("web_search")
    );
    // `store: false` is honoured: such a response cannot be continued.
    assert_eq!(r["refused_unstored"]["status"], 400, "{r}");
    assert_eq!(r["refused_unstored"]["param"], "previous_response_id");

    // On the wire: every event's `event:` line names its payload's type.
    let body = json!({"model": "tiny", "input": QUESTION, "stream": true, "temperature": 0.0,
                      "max_output_tokens": 40})
    .to_string();
    let (status, content_type, text) = crate::inference::rt().block_on(async {
        let r = reqwest::Client::new()
            .post(format!("{}/responses", server.url))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let ct = r.headers()["content-type"].to_str().unwrap().to_string();
        (r.status().as_u16(), ct, r.text().await.unwrap())
    });
    assert_eq!(status, 200, "{text}");
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let mut events = 0;
    for block in text.split("\n\n").filter(|b| b.contains("data: ")) {
        let event = block
            .lines()
            .find_map(|l| l.strip_prefix("event: "))
            .unwrap_or_else(|| panic!("no event line in {block:?}"));
        let data: Value = serde_json::from_str(
            block
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap(),
        )
        .unwrap();
        assert_eq!(data["type"], event, "{block}");
        events += 1;
    }
    assert!(events >= 9, "{text}");
}

/// The same for Anthropic's Messages API (`POST /v1/messages`) through the official `anthropic`
/// client: the chat answers as text and `tool_use` blocks, Anthropic's stop reasons (a stop
/// sequence named from the generated tokens), its token counts (`input_tokens` +
/// `cache_read_input_tokens` is the chat prompt), streamed events the client's accumulator turns
/// into the same message, and refusals naming the field.
#[test]
fn the_anthropic_client_drives_messages_like_chat_completions() {
    let test = "messages_anthropic_client";
    let Some(python) = common::reference_python(test) else {
        return;
    };
    if !common::run(Command::new(&python).args(["-c", "import anthropic"]))
        .status
        .success()
    {
        common::skip(
            test,
            "the reference venv lacks `anthropic`; run `make setup-py-reference`",
        );
        return;
    }
    let (tmp, server) = taught_server();
    let case = tmp.path().join("case.json");
    std::fs::write(
        &case,
        json!({"question": QUESTION, "tools": tools(), "tool_result": "42", "max_tokens": 40})
            .to_string(),
    )
    .unwrap();
    let root = server.url.trim_end_matches("/v1");
    let stdout = common::run_ok(
        Command::new(python)
            .arg(common::repo_root().join("scripts/anthropic-messages-check.py"))
            .args(["--base-url", root, "--model", "tiny", "--case"])
            .arg(&case),
    );
    let r: Value = serde_json::from_str(&stdout).unwrap();

    let plain = &r["plain"];
    assert_eq!(r["chat_plain"]["content"], "42", "{r}");
    assert_eq!(plain["type"], "message");
    assert_eq!(plain["role"], "assistant");
    assert_eq!(
        plain["content"],
        json!([{"type": "text", "text": "42"}]),
        "{plain}"
    );
    assert_eq!(plain["stop_reason"], "end_turn");
    let chat_usage = &r["chat_plain"]["usage"];
    let prompt = |u: &Value| {
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap()
    };
    assert_eq!(
        prompt(&plain["usage"]),
        chat_usage["prompt_tokens"].as_u64().unwrap()
    );
    assert_eq!(
        plain["usage"]["output_tokens"],
        chat_usage["completion_tokens"]
    );
    assert!(
        plain["usage"]["cache_read_input_tokens"].as_u64().unwrap() > 0,
        "{plain}"
    );
    // Streamed: Anthropic's event sequence; the client's accumulator builds the same message.
    let raw = &r["raw"];
    assert_eq!(
        folded(&raw["types"]),
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ],
        "{raw}"
    );
    assert_eq!(raw["text"], "42");
    assert_eq!(raw["stop_reason"], "end_turn");
    let helped = &r["helper"]["final"];
    assert_eq!(r["helper"]["text"], "42");
    assert_eq!(helped["content"], plain["content"]);
    assert_eq!(helped["stop_reason"], "end_turn");
    assert_eq!(prompt(&helped["usage"]), prompt(&plain["usage"]));
    assert_eq!(
        helped["usage"]["output_tokens"],
        plain["usage"]["output_tokens"]
    );
    // Cut short, by length and by a stop sequence (named, plain and streamed).
    assert_eq!(r["short"]["stop_reason"], "max_tokens", "{r}");
    assert_eq!(r["short"]["usage"]["output_tokens"], 1);
    assert_eq!(
        r["stop"]["content"],
        json!([{"type": "text", "text": "4"}]),
        "{r}"
    );
    assert_eq!(r["stop"]["stop_reason"], "stop_sequence");
    assert_eq!(r["stop"]["stop_sequence"], "2");
    assert_eq!(r["stop_stream"]["text"], "4");
    assert_eq!(r["stop_stream"]["stop_reason"], "stop_sequence");
    assert_eq!(r["stop_stream"]["stop_sequence"], "2");

    // The tool round trip: the chat endpoint's call as a tool_use block, then its final answer.
    let first = &r["tool_use"];
    assert_eq!(first["stop_reason"], "tool_use", "{first}");
    let uses: Vec<&Value> = first["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .collect();
    assert_eq!(uses.len(), 1, "{first}");
    assert_eq!(uses[0]["name"], "python");
    assert_eq!(uses[0]["input"], json!({"code": "print(6 * 7)"}));
    let chat_args: Value = serde_json::from_str(
        r["chat_tool_call"]["calls"][0]["arguments"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(uses[0]["input"], chat_args);
    assert_eq!(
        prompt(&first["usage"]),
        r["chat_tool_call"]["usage"]["prompt_tokens"]
            .as_u64()
            .unwrap()
    );
    let streamed = &r["tool_use_stream"]["final"];
    // The same blocks; a tool use's id is new in each response.
    let without_ids = |v: &Value| {
        let mut v = v.clone();
        for b in v.as_array_mut().unwrap() {
            b.as_object_mut().unwrap().remove("id");
        }
        v
    };
    assert_eq!(
        without_ids(&streamed["content"]),
        without_ids(&first["content"]),
        "{r}"
    );
    assert_eq!(streamed["stop_reason"], "tool_use");
    let raw_use = &r["tool_use_raw"];
    assert_eq!(
        serde_json::from_str::<Value>(raw_use["json"].as_str().unwrap()).unwrap(),
        json!({"code": "print(6 * 7)"})
    );
    let chat_final = &r["chat_final"];
    assert_eq!(chat_final["content"], "The answer is 42.", "{r}");
    assert_eq!(
        r["final"]["content"],
        json!([{"type": "text", "text": "The answer is 42."}]),
        "{r}"
    );
    assert_eq!(
        prompt(&r["final"]["usage"]),
        chat_final["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    assert_eq!(r["final_stream"]["text"], "The answer is 42.");

    let refused = &r["refused"];
    for (case, param) in [
        ("server_tool", "tools[0].type"),
        ("thinking_budget", "thinking.budget_tokens"),
        ("image", "messages[0].content[0]"),
        ("is_error", "messages[2].content[0].is_error"),
        ("max_tokens", "max_tokens"),
        ("mcp_servers", "mcp_servers"),
        ("inference_geo", "inference_geo"),
        ("role", "messages[0].role"),
    ] {
        assert_eq!(refused[case]["status"], 400, "{case}: {refused}");
        assert_eq!(refused[case]["param"], param, "{case}: {refused}");
    }
}

/// `/v1/messages` refuses what Anthropic's API refuses, with a 400 in Anthropic's error shape
/// (`{"type": "error", "error": {"type": "invalid_request_error", …}}`) naming the field's path:
/// a text block without `text`, a `tool_use` whose `input` is not an object, a tool without
/// `input_schema`, a `tool_result` whose content holds a text block without text, a thinking
/// block without its signature. Before, each was accepted and generated from.
#[test]
fn messages_refuses_blocks_anthropic_refuses() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("random");
    common::tiny_model(&dir, 5);
    let server = common::InferenceServer::start(&dir, &["--served-model-name", "tiny"]);
    let url = format!("{}/messages", server.url);
    let call = json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "python", "input": {"code": "1"}}]});
    let tool = json!({"name": "python", "input_schema": {"type": "object"}});
    let cases = [
        (
            json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
            "messages[0].content[0].text",
        ),
        (
            json!({"messages": [{"role": "user", "content": "q"},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "python", "input": [1, 2]}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3"}]}],
                "tools": [tool]}),
            "messages[1].content[0].input",
        ),
        (
            json!({"messages": [{"role": "user", "content": "q"}],
                   "tools": [{"name": "python"}]}),
            "tools[0].input_schema",
        ),
        (
            json!({"messages": [{"role": "user", "content": "q"}, call,
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                    "content": [{"type": "text"}]}]}],
                "tools": [tool]}),
            "messages[2].content[0].content[0].text",
        ),
        (
            json!({"messages": [{"role": "user", "content": "q"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}]},
                {"role": "user", "content": "go on"}]}),
            "messages[1].content[0].signature",
        ),
    ];
    rt().block_on(async {
        let c = reqwest::Client::new();
        for (body, param) in cases {
            let mut body = body.as_object().unwrap().clone();
            body.insert("model".into(), json!("tiny"));
            body.insert("max_tokens".into(), json!(4));
            let body = Value::Object(body);
            let (s, r) = post(&c, &url, &body).await;
            assert_eq!(s, 400, "{body}: {r}");
            assert_eq!(r["type"], "error", "{r}");
            assert_eq!(r["error"]["type"], "invalid_request_error", "{r}");
            assert_eq!(r["error"]["param"], param, "{body}: {r}");
            assert!(
                r["error"]["message"].as_str().unwrap().contains(param),
                "{r}"
            );
        }
        // The same route's other errors share the shape: a wrong method is Anthropic's too.
        let r = c.get(&url).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 405);
        let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        // And a well-formed request is served.
        let (s, r) = post(
            &c,
            &url,
            &json!({"model": "tiny", "max_tokens": 2,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}]}),
        )
        .await;
        assert_eq!(s, 200, "{r}");
        assert_eq!(r["type"], "message", "{r}");
    });
}
