#!/usr/bin/env python3
"""Drive an OpenAI-compatible server with the official `openai` client, as vf-eval and the RL
orchestrators do, and print what came back as JSON (the Rust test asserts on it).

  openai-client-check.py --base-url URL --model NAME --case FILE

FILE is JSON: {"messages": [...], "tools": [...], "tool_result": "...", "max_tokens": N}.
Runs: a chat completion with logprobs and token ids; the same request streamed; a tool-call
round trip (tools offered → the model's tool_calls → a tool message → the final answer).
"""

import argparse
import json

from openai import OpenAI


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--case", required=True)
    args = ap.parse_args()
    with open(args.case) as f:
        case = json.load(f)
    client = OpenAI(base_url=args.base_url, api_key="unused", max_retries=0, timeout=60)
    out = {}

    plain = client.chat.completions.create(
        model=args.model, messages=case["messages"], max_tokens=case["max_tokens"], temperature=0.0,
        logprobs=True, top_logprobs=3, extra_body={"return_token_ids": True},
    )
    choice = plain.choices[0]
    out["plain"] = {
        "content": choice.message.content,
        "finish_reason": choice.finish_reason,
        "logprobs": [t.logprob for t in choice.logprobs.content],
        "top": [[a.logprob for a in t.top_logprobs] for t in choice.logprobs.content],
        "token_ids": choice.model_extra.get("token_ids"),
        "prompt_token_ids": plain.model_extra.get("prompt_token_ids"),
        "usage": plain.usage.model_dump(),
    }

    stream = client.chat.completions.create(
        model=args.model, messages=case["messages"], max_tokens=case["max_tokens"], temperature=0.0,
        stream=True, stream_options={"include_usage": True},
    )
    pieces, finish, usage, chunks = [], None, None, 0
    for chunk in stream:
        chunks += 1
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
        for c in chunk.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    out["stream"] = {"content": "".join(pieces), "finish_reason": finish, "usage": usage, "chunks": chunks}

    first = client.chat.completions.create(
        model=args.model, messages=case["tool_messages"], tools=case["tools"], max_tokens=case["max_tokens"],
        temperature=0.0,
    )
    msg = first.choices[0].message
    calls = msg.tool_calls or []
    out["tool_call"] = {
        "finish_reason": first.choices[0].finish_reason,
        "content": msg.content,
        "calls": [{"id": c.id, "name": c.function.name, "arguments": json.loads(c.function.arguments)} for c in calls],
    }
    if calls:
        follow = case["tool_messages"] + [
            msg.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": calls[0].id, "content": case["tool_result"]},
        ]
        final = client.chat.completions.create(
            model=args.model, messages=follow, tools=case["tools"], max_tokens=case["max_tokens"], temperature=0.0,
        )
        out["final"] = {
            "content": final.choices[0].message.content,
            "finish_reason": final.choices[0].finish_reason,
            "tool_calls": len(final.choices[0].message.tool_calls or []),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
