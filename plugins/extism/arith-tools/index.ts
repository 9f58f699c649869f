// arith-tools as an Extism plugin in AssemblyScript: the same environment as the Rust component
// in plugins/arith-tools and the Python one in sdk/python/examples/arith_tools, speaking the JSON
// ABI of sdk/extism.md. Multi-step arithmetic ("What is 482 * 317 - 95?") with a `calculator` tool.

import { JSON } from "assemblyscript-json/assembly";
import {
  abortToHost, array, arr, err, extractBoxed, input, lastAssistant, message, metric, ok,
  output, quote, str, toolCallCount,
} from "../lib/rlhost";

export function abort(message: string | null, file: string | null, line: u32, column: u32): void {
  abortToHost(message, file, line, column);
}

const SYSTEM_PROMPT = "Use the calculator tool when it helps. Give the final answer in \\boxed{}.";
const MAX_TURNS: i64 = 4;
// The calculator's JSON Schema, as the Rust SDK derives it from its argument type.
const CALCULATOR_SCHEMA =
  "{\"type\":\"object\",\"properties\":{\"expression\":{\"type\":\"string\",\"description\":" +
  "\"An integer expression with + - * / and parentheses, e.g. \\\"(12 + 3) * 4\\\".\"}}," +
  "\"required\":[\"expression\"],\"description\":\"Arguments of the `calculator` tool.\"}";

export function rlhost_abi_version(): i32 {
  output("rlhost:env/env@0.1.0");
  return 0;
}

export function info(): i32 {
  const tool =
    "{\"name\":\"calculator\",\"description\":\"Evaluate an integer expression.\",\"parameters\":" +
    quote(CALCULATOR_SCHEMA) + "}";
  output(
    "{\"name\":\"arith-tools\",\"version\":\"0.1.0\"," +
    "\"description\":\"Multi-step arithmetic with a calculator tool\"," +
    "\"system_prompt\":" + quote(SYSTEM_PROMPT) + ",\"tools\":[" + tool + "],\"max_turns\":4," +
    "\"sampling\":{\"stop\":[]}," +
    "\"rubric\":[{\"name\":\"correct\",\"weight\":1.0},{\"name\":\"tool_calls\",\"weight\":0.0}]," +
    "\"rewards\":[],\"splits\":[\"train\",\"test\"]}",
  );
  return 0;
}

const A: u64 = 6364136223846793005;
const C: u64 = 1442695040888963407;

/** Question `i`: [text, answer]. The same generator as the Rust plugin. */
function question(i: u64): string[] {
  let x = i * A + C;
  x = x * A + C;
  const a = 100 + <i64>((x >> 33) % 900);
  x = x * A + C;
  const b = 100 + <i64>((x >> 33) % 900);
  x = x * A + C;
  const c = <i64>((x >> 33) % 1000);
  return [
    "What is " + a.toString() + " * " + b.toString() + " - " + c.toString() + "?",
    (a * b - c).toString(),
  ];
}

export function dataset(): i32 {
  const req = input();
  const split = str(req, "split");
  const offsetValue = req.getInteger("offset");
  const limitValue = req.getInteger("limit");
  const offset = offsetValue === null ? <u64>0 : <u64>offsetValue.valueOf();
  const limit = limitValue === null ? <u64>0 : <u64>limitValue.valueOf();
  let base: u64 = 0;
  let total: u64 = 0;
  if (split == "train") {
    base = 0;
    total = 5000;
  } else if (split == "test") {
    base = <u64>1 << 32;
    total = 200;
  } else {
    output(err("unknown-split", split));
    return 0;
  }
  let end = offset + limit;
  if (end > total || end < offset) end = total;
  const examples = new Array<string>();
  for (let i = offset < end ? offset : end; i < end; i++) {
    const q = question(base + i);
    examples.push(
      "{\"id\":" + quote(split + "-" + i.toString()) + ",\"prompt\":[],\"question\":" + quote(q[0]) +
      ",\"answer\":" + quote(q[1]) + ",\"info\":\"{}\"}",
    );
  }
  output(ok("{\"examples\":" + array(examples) + ",\"total\":" + total.toString() + "}"));
  return 0;
}

export function initial_prompt(): i32 {
  const example = input().getObj("example");
  const q = example === null ? "" : str(example, "question");
  output(ok(
    "{\"messages\":" + array([message("system", SYSTEM_PROMPT), message("user", q)]) +
    ",\"state\":" + quote("{\"turns\":0}") + "}",
  ));
  return 0;
}

// ---- the calculator: + - * / and parentheses over i64, refusing overflow and division by zero

let failure: string | null = null;
let pos: i32 = 0;
let text: Uint8Array = new Uint8Array(0);

function fail(message: string): i64 {
  if (failure === null) failure = message;
  return 0;
}

function addOverflows(a: i64, b: i64, s: i64): bool {
  return ((a ^ s) & (b ^ s)) < 0;
}

function subOverflows(a: i64, b: i64, d: i64): bool {
  return ((a ^ b) & (a ^ d)) < 0;
}

function sum(): i64 {
  let v = product();
  while (failure === null && pos < text.length && (text[pos] == 0x2b || text[pos] == 0x2d)) {
    const op = text[pos];
    pos++;
    const r = product();
    if (failure !== null) return 0;
    if (op == 0x2b) {
      const s = v + r;
      if (addOverflows(v, r, s)) return fail("overflow");
      v = s;
    } else {
      const d = v - r;
      if (subOverflows(v, r, d)) return fail("overflow");
      v = d;
    }
  }
  return v;
}

function product(): i64 {
  let v = atom();
  while (failure === null && pos < text.length && (text[pos] == 0x2a || text[pos] == 0x2f)) {
    const op = text[pos];
    pos++;
    const r = atom();
    if (failure !== null) return 0;
    if (op == 0x2a) {
      // Checked before dividing back: MIN / -1 traps in WebAssembly.
      if ((v == -1 && r == i64.MIN_VALUE) || (r == -1 && v == i64.MIN_VALUE)) {
        return fail("overflow or division by zero");
      }
      const m = v * r;
      if (v != 0 && m / v != r) return fail("overflow or division by zero");
      v = m;
    } else {
      if (r == 0 || (v == i64.MIN_VALUE && r == -1)) return fail("overflow or division by zero");
      v = v / r;
    }
  }
  return v;
}

function atom(): i64 {
  if (failure !== null) return 0;
  if (pos < text.length && text[pos] == 0x28) {
    pos++;
    const v = sum();
    if (failure !== null) return 0;
    if (!(pos < text.length && text[pos] == 0x29)) return fail("missing )");
    pos++;
    return v;
  }
  if (pos < text.length && text[pos] == 0x2d) {
    pos++;
    const v = atom();
    if (failure !== null) return 0;
    if (v == i64.MIN_VALUE) return fail("overflow");
    return -v;
  }
  const start = pos;
  let v: i64 = 0;
  let tooBig = false;
  while (pos < text.length && text[pos] >= 0x30 && text[pos] <= 0x39) {
    const digit = <i64>(text[pos] - 0x30);
    if (v > (i64.MAX_VALUE - digit) / 10) tooBig = true;
    else v = v * 10 + digit;
    pos++;
  }
  if (pos == start || tooBig) return fail("expected a number at position " + start.toString());
  return v;
}

function isAsciiSpace(b: u8): bool {
  return b == 0x20 || b == 0x09 || b == 0x0a || b == 0x0c || b == 0x0d;
}

/** Evaluates `expression`; the result or the error, as the tool's reply. */
function calculate(expression: string): string {
  const raw = Uint8Array.wrap(String.UTF8.encode(expression));
  let n = 0;
  for (let i = 0; i < raw.length; i++) if (!isAsciiSpace(raw[i])) n++;
  text = new Uint8Array(n);
  n = 0;
  for (let i = 0; i < raw.length; i++) if (!isAsciiSpace(raw[i])) text[n++] = raw[i];
  pos = 0;
  failure = null;
  const v = sum();
  if (failure === null && pos != text.length) failure = "unexpected input at position " + pos.toString();
  const f = failure;
  return f !== null ? "error: " + f : v.toString();
}

/** The reply to one tool call. */
function reply(name: string, args: string): string {
  if (name != "calculator") return "error: unknown tool " + quote(name);
  const parsed = JSON.parse(args);
  if (!parsed.isObj) {
    return "error: invalid input: invalid arguments for `calculator`: expected an object";
  }
  const expression = (<JSON.Obj>parsed).getString("expression");
  if (expression === null) {
    return "error: invalid input: invalid arguments for `calculator`: missing field `expression`";
  }
  return calculate(expression.valueOf());
}

export function env_response(): i32 {
  const req = input();
  const conversation = arr(req, "conversation");
  const state = <JSON.Obj>JSON.parse(str(req, "state"));
  const turnsValue = state.getInteger("turns");
  const turns = (turnsValue === null ? <i64>0 : turnsValue.valueOf()) + 1;
  const last = lastAssistant(conversation);
  if (last === null) {
    output(err("invalid-input", "no assistant message"));
    return 0;
  }
  const calls = arr(last, "tool_calls");
  const replies = new Array<string>();
  for (let i = 0; i < calls.length; i++) {
    const call = <JSON.Obj>calls[i];
    replies.push(message("tool", reply(str(call, "name"), str(call, "arguments")), str(call, "id")));
  }
  const done = replies.length == 0 || turns >= MAX_TURNS;
  output(ok(
    "{\"messages\":" + array(replies) + ",\"state\":" + quote("{\"turns\":" + turns.toString() + "}") +
    ",\"done\":" + (done ? "true" : "false") + "}",
  ));
  return 0;
}

export function score(): i32 {
  const rollout = input().getObj("rollout");
  if (rollout === null) {
    output(err("invalid-input", "no rollout"));
    return 0;
  }
  const messages = arr(rollout, "messages");
  const example = rollout.getObj("example");
  const answer = example === null ? "" : str(example, "answer");
  const last = lastAssistant(messages);
  let correct = false;
  if (last !== null) {
    const boxed = extractBoxed(str(last, "content"));
    if (boxed !== null) correct = boxed.trim() == answer;
  }
  output(ok(array([
    metric("correct", correct ? 1.0 : 0.0),
    metric("tool_calls", <f64>toolCallCount(messages)),
  ])));
  return 0;
}
