#!/usr/bin/env python3
"""The prompts TRL gets in `scripts/bench-rl.sh`: the questions `host rl` draws, in its order.

  bench-rl-prompts.py ALL.jsonl OUT.jsonl --steps N [--problems 4 --seed 0]

ALL.jsonl is a `host eval -n -1 -r 1 -s` results.jsonl of the whole training split (one record
per example: the rendered prompt messages, the tools, the prompt's token ids). host rl's
orchestrator walks a seeded permutation of the split (Fisher-Yates driven by the engine's
splitmix64 generator seeded with `orchestrator.seed ^ 0xda7a`; `permutation` in
host/src/rl/run.rs) and takes `problems = batch_size / rollouts_per_example` examples a step;
OUT.jsonl gets those records, step by step, so a TRL run over them in order (no shuffling) sees
the same questions in the same steps as host rl.
"""

import argparse
import json

MASK = (1 << 64) - 1


def permutation(n, seed):
    state = (seed ^ 0xDA7A) & MASK
    v = list(range(n))
    for i in range(n - 1, 0, -1):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z ^= z >> 31
        u = ((z >> 11) + 1) / float(1 << 53)  # uniform in (0, 1]
        j = min(int(u * (i + 1)), i)
        v[i], v[j] = v[j], v[i]
    return v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("all")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--problems", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    records = {}
    for line in open(args.all):
        r = json.loads(line)
        if r.get("rollout_index", 0) == 0:
            records[r["example_index"]] = line
    n = len(records)
    if sorted(records) != list(range(n)):
        raise SystemExit(f"bench-rl-prompts: {args.all} does not hold examples 0..{n - 1}")
    order = permutation(n, args.seed)
    with open(args.out, "w") as f:
        for k in range(args.steps * args.problems):
            f.write(records[order[k % n]])


if __name__ == "__main__":
    main()
