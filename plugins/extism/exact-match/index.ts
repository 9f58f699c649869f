// exact-match as an Extism reward plugin in AssemblyScript: the completion's last \boxed{…} (or,
// with {"fallback": "last-line"} in info, its last non-empty line) must equal the reference after
// light normalisation. The same reward as plugins/exact-match (Rust) and the Python example.

import { JSON } from "assemblyscript-json/assembly";
import { abortToHost, array, err, extractBoxed, input, metric, ok, output, str } from "../lib/rlhost";

export function abort(message: string | null, file: string | null, line: u32, column: u32): void {
  abortToHost(message, file, line, column);
}

export function rlhost_abi_version(): i32 {
  output("rlhost:env/reward-fn@0.1.0");
  return 0;
}

export function info(): i32 {
  output(
    "{\"name\":\"exact-match\",\"version\":\"0.1.0\"," +
    "\"description\":\"final boxed answer equals the reference\"," +
    "\"metrics\":[\"exact_match\",\"has_answer\"]}",
  );
  return 0;
}

function isSpace(c: i32): bool {
  return c == 0x20 || (c >= 0x09 && c <= 0x0d);
}

function normalise(s: string): string {
  let t = s.trim();
  if (t.endsWith(".")) t = t.substring(0, t.length - 1);
  let start = 0;
  let end = t.length;
  while (start < end && t.charAt(start) == "$") start++;
  while (end > start && t.charAt(end - 1) == "$") end--;
  t = t.substring(start, end).trim();
  const words = new Array<string>();
  let word = "";
  for (let i = 0; i < t.length; i++) {
    if (isSpace(t.charCodeAt(i))) {
      if (word.length > 0) words.push(word);
      word = "";
    } else {
      word += t.charAt(i);
    }
  }
  if (word.length > 0) words.push(word);
  return words.join(" ").toLowerCase();
}

export function score(): i32 {
  const req = input();
  const completion = str(req, "completion");
  const answer = str(req, "answer");
  const info = <JSON.Obj>JSON.parse(str(req, "info"));
  const fallbackValue = info.getString("fallback");
  let lastLine = false;
  if (fallbackValue !== null) {
    const f = fallbackValue.valueOf();
    if (f != "last-line") {
      output(err("invalid-input", "unknown fallback \"" + f + "\" (expected \"last-line\")"));
      return 0;
    }
    lastLine = true;
  }
  let candidate = extractBoxed(completion);
  if (candidate === null && lastLine) {
    const lines = completion.split("\n");
    for (let i = lines.length - 1; i >= 0; i--) {
      if (lines[i].trim().length > 0) {
        candidate = lines[i];
        break;
      }
    }
  }
  let exact = false;
  if (candidate !== null) exact = normalise(candidate) == normalise(answer);
  output(ok(array([
    metric("exact_match", exact ? 1.0 : 0.0),
    metric("has_answer", candidate !== null ? 1.0 : 0.0),
  ])));
  return 0;
}
