#!/usr/bin/env python3
"""Drive a server's `/v1/responses` with the official `openai` client, as agent harnesses built on
the Responses API do, next to `/v1/chat/completions` for the same conversations, and print what
came back as JSON (the Rust test asserts on it).

  openai-responses-check.py --base-url URL --model NAME --case FILE

FILE is JSON: {"question": "...", "tools": [chat tools], "tool_result": "...", "max_tokens": N}.
Runs, at temperature 0: the question through chat and responses (plain, `stream=True`, and the
client's `responses.stream` helper, which checks the events add up to the final response); the
tool round trip (function_call item → function_call_output → final answer), by sending the
output items back, by `previous_response_id`, and streamed; the same round trip through chat;
and requests the server must refuse, with the status and `param` of each refusal.
"""

import argparse
import json

import openai
from openai import OpenAI


def stream_events(client, **kw):
    """A streamed response: event types, sequence numbers, the text and arguments the deltas
    spell, and the final response."""
    out = {"types": [], "seq": [], "text": "", "arguments": "", "added": [], "done": []}
    final = None
    for e in client.responses.create(stream=True, **kw):
        out["types"].append(e.type)
        out["seq"].append(e.sequence_number)
        if e.type == "response.output_text.delta":
            out["text"] += e.delta
        elif e.type == "response.function_call_arguments.delta":
            out["arguments"] += e.delta
        elif e.type == "response.function_call_arguments.done":
            out["arguments_done"] = e.arguments
        elif e.type == "response.output_item.added":
            out["added"].append(e.item.type)
        elif e.type == "response.output_item.done":
            out["done"].append(e.item.model_dump(exclude_none=True))
        elif e.type in ("response.completed", "response.incomplete", "response.failed"):
            final = e.response
    out["final"] = final.model_dump(exclude_none=True) if final else None
    return out


def helper_stream(client, **kw):
    """The client's own accumulating stream helper: it raises when events and the final response
    disagree."""
    with client.responses.stream(**kw) as s:
        for _ in s:
            pass
        final = s.get_final_response()
    return {"output_text": final.output_text, "status": final.status}


def summary(r):
    return {
        "id": r.id,
        "object": r.object,
        "status": r.status,
        "output_text": r.output_text,
        "output": [o.model_dump(exclude_none=True) for o in r.output],
        "usage": r.usage.model_dump() if r.usage else None,
        "incomplete_details": r.incomplete_details.model_dump() if r.incomplete_details else None,
        "metadata": r.metadata,
        "tools": [t.model_dump(exclude_none=True) for t in r.tools],
    }


def refusal(client, model, **kw):
    try:
        client.responses.create(model=model, **kw)
    except openai.BadRequestError as e:
        err = e.body if isinstance(e.body, dict) else {}
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
    client = OpenAI(base_url=args.base_url, api_key="unused", max_retries=0, timeout=60)
    model, n, q = args.model, case["max_tokens"], case["question"]
    # Responses' flat function tools, from the chat tools.
    tools = [{"type": "function", **t["function"]} for t in case["tools"]]
    out = {}

    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": q}], max_tokens=n, temperature=0.0
    )
    out["chat_plain"] = {"content": chat.choices[0].message.content, "usage": chat.usage.model_dump()}
    plain = client.responses.create(
        model=model, input=q, max_output_tokens=n, temperature=0.0, metadata={"run": "check"},
        include=["reasoning.encrypted_content"],
    )
    out["plain"] = summary(plain)
    out["stream"] = stream_events(client, model=model, input=q, max_output_tokens=n, temperature=0.0)
    out["helper"] = helper_stream(client, model=model, input=q, max_output_tokens=n, temperature=0.0)
    short = client.responses.create(model=model, input=q, max_output_tokens=1, temperature=0.0)
    out["short"] = summary(short)
    out["short_stream"] = stream_events(client, model=model, input=q, max_output_tokens=1, temperature=0.0)

    # The tool round trip.
    user = [{"role": "user", "content": q}]
    first = client.responses.create(model=model, input=user, tools=tools, max_output_tokens=n, temperature=0.0)
    out["tool_call"] = summary(first)
    out["tool_call_stream"] = stream_events(
        client, model=model, input=user, tools=tools, max_output_tokens=n, temperature=0.0
    )
    calls = [o for o in first.output if o.type == "function_call"]
    if calls:
        result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": case["tool_result"]}
        follow = user + list(first.output) + [result]
        out["final"] = summary(
            client.responses.create(model=model, input=follow, tools=tools, max_output_tokens=n, temperature=0.0)
        )
        out["final_previous"] = summary(
            client.responses.create(
                model=model, previous_response_id=first.id, input=[result], tools=tools,
                max_output_tokens=n, temperature=0.0,
            )
        )
        out["final_stream"] = stream_events(
            client, model=model, input=follow, tools=tools, max_output_tokens=n, temperature=0.0
        )
        out["final_helper"] = helper_stream(
            client, model=model, input=follow, tools=tools, max_output_tokens=n, temperature=0.0
        )
        unstored = client.responses.create(
            model=model, input=user, tools=tools, max_output_tokens=n, temperature=0.0, store=False
        )
        out["refused_unstored"] = refusal(client, model, previous_response_id=unstored.id, input=[result])

    chat_first = client.chat.completions.create(
        model=model, messages=user, tools=case["tools"], max_tokens=n, temperature=0.0
    )
    msg = chat_first.choices[0].message
    out["chat_tool_call"] = {
        "calls": [{"name": c.function.name, "arguments": c.function.arguments} for c in msg.tool_calls or []],
        "usage": chat_first.usage.model_dump(),
    }
    if msg.tool_calls:
        chat_final = client.chat.completions.create(
            model=model,
            messages=user + [
                msg.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": case["tool_result"]},
            ],
            tools=case["tools"], max_tokens=n, temperature=0.0,
        )
        out["chat_final"] = {"content": chat_final.choices[0].message.content, "usage": chat_final.usage.model_dump()}

    # What the server cannot honour is refused by name.
    refused = {
        "background": dict(input=q, background=True),
        "web_search": dict(input=q, tools=[{"type": "web_search"}]),
        "json_schema": dict(
            input=q, text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}
        ),
        "truncation": dict(input=q, truncation="auto"),
        "unknown_previous": dict(input=q, previous_response_id="resp_unknown"),
        "logprobs": dict(input=q, include=["message.output_text.logprobs"]),
        "top_logprobs": dict(input=q, top_logprobs=2),
        "builtin_item": dict(input=[{"type": "web_search_call", "id": "ws_1", "status": "completed"}]),
        "builtin_choice": dict(input=q, tools=tools, tool_choice={"type": "web_search_preview"}),
        "max_output_tokens": dict(input=q, max_output_tokens=0),
        "summary": dict(input=q, reasoning={"summary": "detailed"}),
        "image": dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]),
        "no_input": dict(),
    }
    out["refused"] = {k: refusal(client, model, **v) for k, v in refused.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
