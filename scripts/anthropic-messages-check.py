#!/usr/bin/env python3
"""Drive a server's `/v1/messages` with the official `anthropic` client, as agent harnesses built
on Anthropic's Messages API do, next to `/v1/chat/completions` (the `openai` client) for the same
conversations, and print what came back as JSON (the Rust test asserts on it).

  anthropic-messages-check.py --base-url URL --model NAME --case FILE

URL is the server's root (`http://HOST:PORT`). FILE is JSON: {"question": "...", "tools": [chat
tools], "tool_result": "...", "max_tokens": N}. Runs, at temperature 0: the question through
chat and messages (plain, raw events, and the client's `messages.stream` helper, which
accumulates the events into the final message), cut by `max_tokens` and by a stop sequence; the
tool round trip (tool_use → tool_result → final answer), plain and streamed; and requests the
server must refuse, with the status and `param` of each refusal.
"""

import argparse
import json

import anthropic
from openai import OpenAI


def summary(m):
    return {
        "id": m.id,
        "type": m.type,
        "role": m.role,
        "content": [b.model_dump(exclude_none=True) for b in m.content],
        "stop_reason": m.stop_reason,
        "stop_sequence": m.stop_sequence,
        "usage": m.usage.model_dump(exclude_none=True),
    }


def raw_events(client, **kw):
    out = {"types": [], "text": "", "json": ""}
    for e in client.messages.create(stream=True, **kw):
        out["types"].append(e.type)
        if e.type == "content_block_delta":
            if e.delta.type == "text_delta":
                out["text"] += e.delta.text
            elif e.delta.type == "input_json_delta":
                out["json"] += e.delta.partial_json
        elif e.type == "message_delta":
            out["stop_reason"] = e.delta.stop_reason
            out["stop_sequence"] = e.delta.stop_sequence
    return out


def helper(client, **kw):
    with client.messages.stream(**kw) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    return {"text": text, "final": summary(final)}


def refusal(client, **kw):
    try:
        client.messages.create(**kw)
    except anthropic.BadRequestError as e:
        err = e.body.get("error", {}) if isinstance(e.body, dict) else {}
        return {"status": e.status_code, "param": err.get("param"), "message": err.get("message")}
    return {"status": 200}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--case", required=True)
    args = ap.parse_args()
    with open(args.case) as f:
        case = json.load(f)
    client = anthropic.Anthropic(base_url=args.base_url, api_key="unused", max_retries=0, timeout=60)
    oai = OpenAI(base_url=args.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    model, n, q = args.model, case["max_tokens"], case["question"]
    tools = [
        {"name": t["function"]["name"], "description": t["function"]["description"],
         "input_schema": t["function"]["parameters"]}
        for t in case["tools"]
    ]
    user = [{"role": "user", "content": q}]
    # This client has no sampling arguments (Anthropic deprecated them); the API still reads them.
    greedy = {"temperature": 0.0}
    base = dict(model=model, max_tokens=n, extra_body=greedy)
    out = {}

    chat = oai.chat.completions.create(model=model, messages=user, max_tokens=n, temperature=0.0)
    out["chat_plain"] = {"content": chat.choices[0].message.content, "usage": chat.usage.model_dump()}
    out["plain"] = summary(client.messages.create(messages=user, **base))
    out["raw"] = raw_events(client, messages=user, **base)
    out["helper"] = helper(client, messages=user, **base)
    out["short"] = summary(client.messages.create(messages=user, model=model, max_tokens=1, extra_body=greedy))
    out["stop"] = summary(client.messages.create(messages=user, stop_sequences=["2"], **base))
    out["stop_stream"] = raw_events(client, messages=user, stop_sequences=["2"], **base)

    first = client.messages.create(messages=user, tools=tools, **base)
    out["tool_use"] = summary(first)
    out["tool_use_stream"] = helper(client, messages=user, tools=tools, **base)
    out["tool_use_raw"] = raw_events(client, messages=user, tools=tools, **base)
    uses = [b for b in first.content if b.type == "tool_use"]
    if uses:
        follow = user + [
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": uses[0].id, "content": case["tool_result"]}]},
        ]
        out["final"] = summary(client.messages.create(messages=follow, tools=tools, **base))
        out["final_stream"] = helper(client, messages=follow, tools=tools, **base)

    chat_first = oai.chat.completions.create(
        model=model, messages=user, tools=case["tools"], max_tokens=n, temperature=0.0
    )
    msg = chat_first.choices[0].message
    out["chat_tool_call"] = {
        "calls": [{"name": c.function.name, "arguments": c.function.arguments} for c in msg.tool_calls or []],
        "usage": chat_first.usage.model_dump(),
    }
    if msg.tool_calls:
        chat_final = oai.chat.completions.create(
            model=model,
            messages=user + [
                msg.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": case["tool_result"]},
            ],
            tools=case["tools"], max_tokens=n, temperature=0.0,
        )
        out["chat_final"] = {"content": chat_final.choices[0].message.content, "usage": chat_final.usage.model_dump()}

    result_error = [
        {"role": "user", "content": q},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "python", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "boom", "is_error": True}]},
    ]
    refused = {
        "server_tool": dict(messages=user, tools=[{"type": "web_search_20250305", "name": "web_search"}], **base),
        "thinking_budget": dict(messages=user, thinking={"type": "enabled", "budget_tokens": 1024}, **base),
        "image": dict(
            messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}],
            **base,
        ),
        "is_error": dict(messages=result_error, tools=tools, **base),
        "max_tokens": dict(messages=user, model=model, max_tokens=0, extra_body=greedy),
        "mcp_servers": dict(
            messages=user, model=model, max_tokens=n,
            extra_body={**greedy, "mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]},
        ),
        "inference_geo": dict(messages=user, inference_geo="eu", **base),
        "role": dict(messages=[{"role": "system", "content": q}], **base),
    }
    out["refused"] = {k: refusal(client, **v) for k, v in refused.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
