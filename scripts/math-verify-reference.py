#!/usr/bin/env python3
"""Reference verdicts of HF math-verify for rlhost's agreement check and benchmark.

Builds answer pairs from real gold answers (MATH-500 and MATH test, read from the shared data
folder): each gold against itself, against the dataset's own boxed answer in its reference
solution, against equivalent rewrites (spacing, \\dfrac, \\left/\\right, decimals, thousands
separators, units, reordered sets, `x = …`) and against near-misses (off by one, sign, doubled
values, a changed digit, reordered tuples, a dropped element). Every pair is judged by Python
math-verify under two conventions:

  math-rubric  verifiers' MathRubric: verify(parse("\\boxed{gold}"), parse("\\boxed{pred}"))
  seed         verifiers' math_python rubric (Aug 2025): verify(parse(pred), parse(gold))

Writes one JSON object per line: {"id", "kind", "gold", "pred", "math_rubric", "seed"} and a
last line {"timing": {...}} with verdicts per second measured in this process.

Usage: math-verify-reference.py --data DIR --out FILE [--golds N] [--jobs J]
"""

import argparse
import json
import logging
import multiprocessing as mp
import os
import re
import sys
import time

logging.disable(logging.CRITICAL)


def first_boxed(text):
    start = text.find("\\boxed{")
    if start < 0:
        return None
    i, depth = start + 7, 1
    while i < len(text):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 7:i]
        i += 1
    return None


def top_level_split(s):
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


INT = re.compile(r"^-?\d+$")
FRAC = re.compile(r"^(-?)\\frac\{(\d+)\}\{(\d+)\}$")


def candidates(gold, solution):
    """(kind, pred) pairs for one gold answer; kinds ending in `near` are meant to differ."""
    out = [("self", gold)]
    if solution:
        b = first_boxed(solution)
        if b is not None and b != gold:
            out.append(("solution", b))
    g = gold.strip()
    rewrites = []
    if "," in g:
        rewrites.append(("spaced", ", ".join(p.strip() for p in top_level_split(g))))
    if "\\frac" in g:
        rewrites.append(("dfrac", g.replace("\\frac", "\\dfrac")))
    if "(" in g and "\\left" not in g:
        rewrites.append(("left-right", g.replace("(", "\\left(").replace(")", "\\right)")))
    if INT.match(g):
        n = int(g)
        rewrites.append(("float", f"{n}.0"))
        rewrites.append(("units", f"{n}\\text{{ units}}"))
        rewrites.append(("dollars", f"\\${n}"))
        if abs(n) >= 1000:
            rewrites.append(("thousands", f"{n:,}"))
        out.append(("off-by-one near", str(n + 1)))
        if n != 0:
            out.append(("sign near", str(-n)))
        out.append(("percent", f"{n}\\%"))
    m = FRAC.match(g)
    if m:
        sign, a, b = m.group(1), int(m.group(2)), int(m.group(3))
        v = (a / b) * (-1 if sign else 1)
        rewrites.append(("slash", f"{sign}{a}/{b}"))
        rewrites.append(("decimal6", f"{v:.6f}"))
        out.append(("decimal2 near", f"{v:.2f}"))
        out.append(("numerator near", f"{sign}\\frac{{{a + 1}}}{{{b}}}"))
    parts = top_level_split(g)
    if len(parts) > 1 and not g.startswith("(") and not g.startswith("["):
        rewrites.append(("reordered", ",".join(reversed(parts))))
        out.append(("dropped near", ",".join(parts[:-1])))
    if g.startswith("(") and g.endswith(")") and len(parts) > 1:
        inner = top_level_split(g[1:-1])
        if len(inner) > 1:
            out.append(("swapped near", "(" + ",".join(reversed(inner)) + ")"))
    if "=" not in g and "," not in g and not g.startswith("\\text"):
        rewrites.append(("assignment", f"x = {g}"))
    digits = [i for i, c in enumerate(g) if c.isdigit()]
    if digits:
        i = digits[0]
        out.append(("digit near", g[:i] + str((int(g[i]) + 1) % 10) + g[i + 1:]))
    if g and not INT.match(g) and "\\" not in g and "," not in g:
        out.append(("doubled near", f"2({g})"))
    if " " in g:
        rewrites.append(("nospace", g.replace(" ", "")))
    rewrites.append(("braced", "{" + g + "}"))
    if "\\times" in g:
        rewrites.append(("cdot", g.replace("\\times", "\\cdot")))
    if "\\frac" in g:
        rewrites.append(("tfrac", g.replace("\\frac", "\\tfrac")))
    if m:
        rewrites.append(("scaled", f"{sign}\\frac{{{2 * a}}}{{{2 * b}}}"))
    if INT.match(g):
        rewrites.append(("degrees", f"{g}^\\circ"))
        rewrites.append(("mathrm-units", f"{g}\\mathrm{{cm}}"))
    sq = re.search(r"\\sqrt\{([^{}]+)\}", g)
    if sq:
        rewrites.append(("sqrt-power", g[:sq.start()] + "(" + sq.group(1) + ")^{1/2}" + g[sq.end():]))
        out.append(("sqrt near", g[:sq.start()] + "\\sqrt{2" + sq.group(1) + "}" + g[sq.end():]))
    if g.count("=") == 1 and "," not in g:
        lhs, rhs = g.split("=")
        rewrites.append(("flipped-equation", f"{rhs.strip()} = {lhs.strip()}"))
    ex = re.search(r"\^\{?(\d+)\}?", g)
    if ex:
        out.append(("exponent near", g[:ex.start()] + "^{" + str(int(ex.group(1)) + 1) + "}" + g[ex.end():]))
    out.extend(rewrites)
    seen, uniq = set(), []
    for kind, p in out:
        if (kind == "self") or p not in seen:
            seen.add(p)
            uniq.append((kind, p))
    return uniq


def judge(pair):
    from math_verify import parse, verify
    gold, pred = pair["gold"], pair["pred"]
    try:
        mr = bool(verify(parse(f"\\boxed{{{gold}}}"), parse(f"\\boxed{{{pred}}}")))
    except BaseException:
        mr = False
    try:
        seed = bool(verify(parse(pred), parse(gold)))
    except BaseException:
        seed = False
    return dict(pair, math_rubric=mr, seed=seed)


def load(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--golds", type=int, default=0, help="gold answers used, MATH-500 first (0: all)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()

    rows = load(os.path.join(args.data, "math500", "test.jsonl"))
    rows += [r for r in load(os.path.join(args.data, "math", "test.jsonl")) if not r.get("in_math500")]
    if args.golds:
        rows = rows[: args.golds]
    pairs = []
    for r in rows:
        for kind, pred in candidates(r["answer"], r.get("solution")):
            pairs.append({"id": f"{r['id']}#{len(pairs)}", "kind": kind, "gold": r["answer"], "pred": pred})

    start = time.perf_counter()
    if args.jobs > 1:
        with mp.Pool(args.jobs) as pool:
            judged = pool.map(judge, pairs, chunksize=64)
    else:
        judged = [judge(p) for p in pairs]
    elapsed = time.perf_counter() - start

    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for j in judged:
            f.write(json.dumps(j, ensure_ascii=False) + "\n")
        timing = {"pairs": len(pairs), "conventions": 2, "seconds": elapsed, "jobs": args.jobs,
                  "verdicts_per_second": 2 * len(pairs) / elapsed}
        f.write(json.dumps({"timing": timing}) + "\n")
    os.replace(tmp, args.out)
    print(f"{len(pairs)} pairs judged in {elapsed:.1f}s with {args.jobs} processes", file=sys.stderr)


if __name__ == "__main__":
    main()
