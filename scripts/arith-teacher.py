#!/usr/bin/env python3
"""A scripted teacher for the `arith` environment, served over the OpenAI chat API on loopback.

  arith-teacher.py [--port 0] [--tool-rate 1.0]    prints "http://127.0.0.1:PORT/v1" once listening

On a `--tool-rate` share of the questions (chosen by a hash of the question, so a rerun makes
the same choices) it plays the policy the demo wants: call the python tool with the question's
expression, then answer with the tool's output in \\boxed{}. On the others it is a lazy teacher
that answers at once with a mental estimate (the value rounded to tens), right only by luck.
`host eval arith -b URL -s DIR` records its conversations (real environment, real sandbox);
`host sft --data DIR/arith/results.jsonl` turns them into a warm start that imitates both habits
(`--only-correct` keeps the right ones only) — the mediocre starting point GRPO improves on.
"""

import argparse
import hashlib
import itertools
import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CALLS = itertools.count()
TOOL_RATE = 1.0


def uses_tool(question):
    """Whether the teacher calls the tool on this question (a stable choice per question)."""
    h = int.from_bytes(hashlib.sha256(question.encode()).digest()[:8], "little")
    return h / 2**64 < TOOL_RATE


def estimate(expr):
    """A mental estimate: the exact value (integers, + - * only) rounded to the nearest ten."""
    if not re.fullmatch(r"[0-9 +*-]+", expr):
        return 0
    return int(round(eval(expr) / 10.0)) * 10  # noqa: S307 (digits and + - * only)


def turn(messages):
    last = messages[-1]
    if last["role"] == "tool":
        return {"role": "assistant", "content": f"The result is \\boxed{{{last['content'].strip()}}}.", "tool_calls": []}
    question = next(m for m in reversed(messages) if m["role"] == "user")["content"]
    m = re.search(r"What is (.+?)\?", question)
    expr = m.group(1) if m else "0"
    if not uses_tool(question):
        return {"role": "assistant", "content": f"The result is \\boxed{{{estimate(expr)}}}.", "tool_calls": []}
    call = {"id": f"call_{next(CALLS)}", "type": "function",
            "function": {"name": "python", "arguments": json.dumps({"code": f"print({expr})"})}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply({"object": "list", "data": [{"id": "arith-teacher", "object": "model"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        msg = turn(body["messages"])
        finish = "tool_calls" if msg["tool_calls"] else "stop"
        self.reply({"id": "chatcmpl-teacher", "object": "chat.completion", "created": 0, "model": "arith-teacher",
                    "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
                    "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--tool-rate", type=float, default=1.0,
                    help="share of questions answered with the python tool (the rest: a mental estimate)")
    args = ap.parse_args()
    global TOOL_RATE
    TOOL_RATE = args.tool_rate
    port = args.port
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"http://127.0.0.1:{server.server_address[1]}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
