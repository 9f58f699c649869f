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
json_object. Validation uses the `jsonschema` package when the venv has it, else a checker of the
schema keywords the test uses (type, properties, required, additionalProperties, enum, minimum,
maximum, minLength, maxLength, items).
"""

import argparse
import json

from openai import OpenAI

try:
    import jsonschema

    def errors(value, schema):
        v = jsonschema.Draft202012Validator(schema)
        return [e.message for e in v.iter_errors(value)]

    VALIDATOR = "jsonschema " + jsonschema.__version__ if hasattr(jsonschema, "__version__") else "jsonschema"
except ImportError:
    VALIDATOR = "builtin subset"

    def errors(value, schema, path="$"):
        out = []
        t = schema.get("type")
        kinds = {
            "object": lambda v: isinstance(v, dict),
            "array": lambda v: isinstance(v, list),
            "string": lambda v: isinstance(v, str),
            "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
            "boolean": lambda v: isinstance(v, bool),
            "null": lambda v: v is None,
        }
        if t is not None and not kinds[t](value):
            return [f"{path}: {value!r} is not of type {t}"]
        if "enum" in schema and value not in schema["enum"]:
            out.append(f"{path}: {value!r} is not one of {schema['enum']}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if "minimum" in schema and value < schema["minimum"]:
                out.append(f"{path}: {value} < minimum {schema['minimum']}")
            if "maximum" in schema and value > schema["maximum"]:
                out.append(f"{path}: {value} > maximum {schema['maximum']}")
        if isinstance(value, str):
            if "minLength" in schema and len(value) < schema["minLength"]:
                out.append(f"{path}: {value!r} shorter than {schema['minLength']}")
            if "maxLength" in schema and len(value) > schema["maxLength"]:
                out.append(f"{path}: {value!r} longer than {schema['maxLength']}")
        if isinstance(value, dict):
            props = schema.get("properties", {})
            for r in schema.get("required", []):
                if r not in value:
                    out.append(f"{path}: missing required {r!r}")
            for k, v in value.items():
                if k in props:
                    out.extend(errors(v, props[k], f"{path}.{k}"))
                elif schema.get("additionalProperties") is False:
                    out.append(f"{path}: unexpected property {k!r}")
        if isinstance(value, list) and "items" in schema:
            for i, v in enumerate(value):
                out.extend(errors(v, schema["items"], f"{path}[{i}]"))
        return out


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
