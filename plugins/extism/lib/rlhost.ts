// rlhost's Extism ABI for AssemblyScript plugins (sdk/extism.md): the host functions, JSON text
// building, and the output envelopes. Inputs are parsed with assemblyscript-json.

import { Host, Memory } from "@extism/as-pdk";
import { JSON } from "assemblyscript-json/assembly";

// ---- host functions (namespace extism:host/user) ------------------------------------------

@external("extism:host/user", "rlhost_log")
declare function rlhost_log(request: u64): void;

@external("extism:host/user", "rlhost_rollout_seed")
declare function rlhost_rollout_seed(): i64;

@external("extism:host/user", "rlhost_read_data")
declare function rlhost_read_data(path: u64): u64;

@external("extism:host/user", "rlhost_run_python")
declare function rlhost_run_python(request: u64): u64;

@external("extism:host/env", "length")
declare function extism_length(offset: u64): u64;

@external("extism:host/env", "alloc")
declare function extism_alloc(length: u64): u64;

@external("extism:host/env", "store_u8")
declare function extism_store_u8(offset: u64, value: u8): void;

@external("extism:host/env", "error_set")
declare function extism_error_set(offset: u64): void;

/** Copies UTF-8 text into an Extism memory block. */
function block(text: string): u64 {
  const bytes = Uint8Array.wrap(String.UTF8.encode(text));
  const offset = extism_alloc(bytes.length);
  for (let i = 0; i < bytes.length; i++) {
    extism_store_u8(offset + <u64>i, bytes[i]);
  }
  return offset;
}

/** Writes to the host's log ("trace", "debug", "info", "warn", "error"). */
export function log(level: string, message: string): void {
  rlhost_log(block("{\"level\":" + quote(level) + ",\"message\":" + quote(message) + "}"));
}

/** The rollout's seed (the same for every call of one rollout). */
export function rolloutSeed(): u64 {
  return <u64>rlhost_rollout_seed();
}

/** A block the host returned, as bytes. */
function bytesOf(offset: u64): Uint8Array {
  return new Memory(offset, extism_length(offset)).toUint8Array();
}

/** A file of the plugin's data folder (or the host's error message). */
export class DataFile {
  constructor(public ok: bool, public text: string) {}
}

/** Reads a file of the plugin's data folder as UTF-8 text. */
export function readData(path: string): DataFile {
  const reply = bytesOf(rlhost_read_data(block(path)));
  const body = String.UTF8.decode(reply.buffer.slice(1));
  return new DataFile(reply.length > 0 && reply[0] == 0, body);
}

/** Runs Python in the host's sandbox; the host's JSON reply:
 *  `{"ok": {"stdout", "stderr", "exit_code", "timed_out"}}` or `{"err": "…"}`. */
export function runPython(code: string, timeoutMs: u32 = 10000): JSON.Obj {
  const request = "{\"code\":" + quote(code) + ",\"limits\":{\"timeout_ms\":" + timeoutMs.toString() +
    ",\"memory_mib\":256,\"max_output_bytes\":8192}}";
  const reply = bytesOf(rlhost_run_python(block(request)));
  return <JSON.Obj>JSON.parse(reply);
}

/** AssemblyScript's `abort`, routed to an Extism error (use with `--use abort=…`). */
export function abortToHost(message: string | null, file: string | null, line: u32, column: u32): void {
  const text = (message ? message : "abort") + " at " + (file ? file : "?") + ":" + line.toString() + ":" + column.toString();
  extism_error_set(block(text));
  unreachable();
}

// ---- output -------------------------------------------------------------------------------

/** Sets the call's output to UTF-8 text (the PDK's outputString counts UTF-16 units). */
export function output(text: string): void {
  Host.output(Uint8Array.wrap(String.UTF8.encode(text)));
}

/** `{"ok": value}`: a WIT `result` that succeeded (`value` is JSON text). */
export function ok(value: string): string {
  return "{\"ok\":" + value + "}";
}

/** `{"err": {"kind": kind, "message": message}}`: a WIT `plugin-error`
 *  (kind: invalid-args, invalid-input, unknown-split, internal). */
export function err(kind: string, message: string): string {
  return "{\"err\":{\"kind\":" + quote(kind) + ",\"message\":" + quote(message) + "}}";
}

const HEX = "0123456789abcdef";

/** A JSON string literal. */
export function quote(s: string): string {
  const parts = new Array<string>();
  parts.push("\"");
  let start = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    let escaped: string | null = null;
    if (c == 0x22) escaped = "\\\"";
    else if (c == 0x5c) escaped = "\\\\";
    else if (c == 0x0a) escaped = "\\n";
    else if (c == 0x0d) escaped = "\\r";
    else if (c == 0x09) escaped = "\\t";
    else if (c < 0x20) {
      escaped = "\\u00" + HEX.charAt(c >> 4) + HEX.charAt(c & 15);
    }
    if (escaped !== null) {
      parts.push(s.substring(start, i));
      parts.push(escaped);
      start = i + 1;
    }
  }
  parts.push(s.substring(start));
  parts.push("\"");
  return parts.join("");
}

/** A JSON array of already-encoded items. */
export function array(items: string[]): string {
  return "[" + items.join(",") + "]";
}

/** A message: role, content, and optionally the tool call it answers. */
export function message(role: string, content: string, toolCallId: string | null = null): string {
  let out = "{\"role\":" + quote(role) + ",\"content\":" + quote(content);
  if (toolCallId !== null) out += ",\"tool_call_id\":" + quote(toolCallId);
  return out + "}";
}

/** A metric. */
export function metric(name: string, value: f64): string {
  return "{\"name\":" + quote(name) + ",\"value\":" + value.toString() + "}";
}

// ---- input --------------------------------------------------------------------------------

/** The call's input, parsed. */
export function input(): JSON.Obj {
  return <JSON.Obj>JSON.parse(Host.input());
}

/** A string field, or "" when absent. */
export function str(obj: JSON.Obj, key: string): string {
  const v = obj.getString(key);
  return v === null ? "" : v.valueOf();
}

/** An array field, or an empty one. */
export function arr(obj: JSON.Obj, key: string): JSON.Value[] {
  const v = obj.getArr(key);
  return v === null ? new Array<JSON.Value>() : v.valueOf();
}

/** The last message with role `assistant`, if any. */
export function lastAssistant(conversation: JSON.Value[]): JSON.Obj | null {
  for (let i = conversation.length - 1; i >= 0; i--) {
    const m = <JSON.Obj>conversation[i];
    if (str(m, "role") == "assistant") return m;
  }
  return null;
}

/** Tool calls made in a conversation. */
export function toolCallCount(conversation: JSON.Value[]): i32 {
  let n = 0;
  for (let i = 0; i < conversation.length; i++) {
    n += arr(<JSON.Obj>conversation[i], "tool_calls").length;
  }
  return n;
}

/** The content of the last `\boxed{…}` / `\fbox{…}` (braces balanced; `\boxed 5` too), or null:
 *  the SDKs' `extract_boxed`. */
export function extractBoxed(text: string): string | null {
  let found: string | null = null;
  let from = 0;
  while (true) {
    const hit = nextBoxed(text, from);
    if (hit === null) return found;
    found = text.substring(hit[0], hit[1]);
    from = hit[1];
  }
}

function nextBoxed(text: string, from: i32): i32[] | null {
  let search = from;
  while (true) {
    const b = text.indexOf("\\boxed", search);
    const f = text.indexOf("\\fbox", search);
    let pos = -1;
    let len = 0;
    if (b >= 0 && (f < 0 || b <= f)) {
      pos = b;
      len = 6;
    } else if (f >= 0) {
      pos = f;
      len = 5;
    }
    if (pos < 0) return null;
    const after = pos + len;
    if (text.charAt(after) == "{") {
      const open = after + 1;
      let depth = 1;
      for (let i = open; i < text.length; i++) {
        const c = text.charAt(i);
        if (c == "{") depth++;
        else if (c == "}") {
          depth--;
          if (depth == 0) return [open, i];
        }
      }
      return null;
    }
    if (text.charAt(after) == " ") {
      const start = after + 1;
      let end = start;
      while (end < text.length && !isSpace(text.charCodeAt(end)) && text.charAt(end) != "$") end++;
      if (end > start) return [start, end];
    }
    search = after;
  }
}

function isSpace(c: i32): bool {
  return c == 0x20 || (c >= 0x09 && c <= 0x0d) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
    (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
    c == 0x3000;
}
