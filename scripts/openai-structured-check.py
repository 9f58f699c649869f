#!/usr/bin/env python3
"""Drive rlhost's grammar-constrained decoding with the official `openai` client and check every
output against its JSON schema; print a JSON summary (the Rust test asserts on it).

  openai-structured-check.py --base-url URL --model NAME --case FILE

FILE is JSON:
  {"messages": [...], "tools": [...], "max_tokens": N,
   "tool_runs": [{"tool_choice": "required" | NAME, "parallel": bool, "seed": S}, ...],
   "schema_runs": [{"schema": {...}, "seed": S}, ...],
   "object_runs": [S, ...]}

Each tool run is a chat completion with `tool_choice` and `parallel_tool_calls`; it is valid
when it returns at least one call (exactly one unless parallel), every call names a declared tool
(the named one when named), and every call's arguments parse as JSON and validate against that
tool's parameters. Each schema run uses `response_format` json_schema; each object run
json_object. Validation uses the `jsonschema` package (Draft 2020-12), which the reference venv
pins; without it the script fails at once.
"""

import argparse
import json

from openai import OpenAI

# The reference venv pins jsonschema (scripts/requirements-ref.txt): a missing one is an error,
# never a quietly weaker check.
import jsonschema

VALIDATOR = f"jsonschema {getattr(jsonschema, '__version__', '')}".strip()


def errors(value, schema):
    v = jsonschema.Draft202012Validator(schema)
    return [e.message for e in v.iter_errors(value)]


def check_json(text, schema):
    try:
        value = json.loads(text)
    except Exception as e:  # noqa: BLE001 - any parse failure is a finding
        return None, [f"not JSON: {e}: {text!r}"]
    return value, errors(value, schema)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--case", required=True)
    args = ap.parse_args()
    with open(args.case) as f:
        case = json.load(f)
    client = OpenAI(base_url=args.base_url, api_key="unused", max_retries=0, timeout=120)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in case["tools"]}
    out = {"validator": VALIDATOR, "tool_runs": [], "schema_runs": [], "object_runs": []}

    for run in case.get("tool_runs", []):
        choice = run["tool_choice"]
        tool_choice = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
        r = client.chat.completions.create(
            model=args.model, messages=case["messages"], tools=case["tools"], tool_choice=tool_choice,
            parallel_tool_calls=run["parallel"], seed=run["seed"], max_tokens=case["max_tokens"],
        )
        c = r.choices[0]
        calls = c.message.tool_calls or []
        problems = []
        if not calls:
            problems.append(f"no tool calls; content {c.message.content!r}")
        if not run["parallel"] and len(calls) > 1:
            problems.append(f"{len(calls)} calls with parallel_tool_calls false")
        for call in calls:
            name = call.function.name
            if name not in schemas:
                problems.append(f"undeclared tool {name!r}")
                continue
            if choice != "required" and name != choice:
                problems.append(f"called {name!r}, not the named {choice!r}")
            _, errs = check_json(call.function.arguments, schemas[name])
            problems.extend(errs)
        out["tool_runs"].append({
            "seed": run["seed"], "tool_choice": choice, "finish_reason": c.finish_reason,
            "calls": [[call.function.name, call.function.arguments] for call in calls],
            "problems": problems,
        })

    for run in case.get("schema_runs", []):
        r = client.chat.completions.create(
            model=args.model, messages=case["messages"], seed=run["seed"], max_tokens=case["max_tokens"],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "answer", "schema": run["schema"], "strict": True}},
        )
        c = r.choices[0]
        _, errs = check_json(c.message.content, run["schema"])
        out["schema_runs"].append({"seed": run["seed"], "content": c.message.content,
                                   "finish_reason": c.finish_reason, "problems": errs})

    for seed in case.get("object_runs", []):
        r = client.chat.completions.create(
            model=args.model, messages=case["messages"], seed=seed, max_tokens=case["max_tokens"],
            response_format={"type": "json_object"},
        )
        c = r.choices[0]
        value, errs = check_json(c.message.content, {"type": "object"})
        out["object_runs"].append({"seed": seed, "content": c.message.content,
                                   "finish_reason": c.finish_reason, "problems": errs,
                                   "is_object": isinstance(value, dict)})

    print(json.dumps(out))


if __name__ == "__main__":
    main()
