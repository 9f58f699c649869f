"""Report of scripts/bench-signal.sh: per variant and seed, the held-out Correct of the warm start
and of the last checkpoint, the gain, and the steps and GRPO wall seconds (the run's `elapsed_s`)
to the first checkpoint at or above the target; then each variant's mean and spread over the
seeds, and its seconds as a ratio to plain's (the peer: every sample trained) from the same run.

    python3 scripts/bench-signal.py WORK TARGET "VARIANTS" "SEEDS"
"""

import json
import statistics
import sys
from pathlib import Path


def correct(summary: Path) -> float:
    metrics = dict(json.loads(summary.read_text())["metrics"])
    return metrics["correct"]


def run(path: Path, before: float, target: float) -> dict:
    lines = [json.loads(l) for l in (path / "metrics.jsonl").read_text().splitlines() if l.strip()]
    steps = {l["step"]: l for l in lines if l["step"] > 0}
    evals = sorted(
        (int(d.name.removeprefix("step_")), correct(d / "arith" / "summary.json"))
        for d in (path / "eval").iterdir()
        if (d / "arith" / "summary.json").is_file()
    )
    reached = next(((s, steps[s]["elapsed_s"]) for s, c in evals if c >= target), None)
    last = steps[max(steps)]
    return {
        "before": before,
        "after": evals[-1][1],
        "best": max(c for _, c in evals),
        "reached": reached,
        "grpo_s": last["elapsed_s"],
        "informative": sum(l["informative_groups"] for l in steps.values()),
        "groups": sum(l["groups"] for l in steps.values()),
        "resampled": sum(l["resampled_groups"] for l in steps.values()),
        "skipped": sum(l["zero_advantage_samples"] for l in steps.values()),
        "rollout_s": sum(l["rollout_s"] for l in steps.values()),
        "train_s": sum(l["train_s"] for l in steps.values()),
    }


def main() -> None:
    work, target = Path(sys.argv[1]), float(sys.argv[2])
    variants, seeds = sys.argv[3].split(), sys.argv[4].split()
    print(f"# GRPO signal on the demo (target Correct {target:.2f})\n")
    print("| variant | seed | Correct before | after | gain | best | steps to target | GRPO s to target | GRPO s (all steps) | informative groups | resampled groups | zero-adv samples skipped | train s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    runs = {}
    before = correct(work / "warm" / "arith" / "summary.json")
    for v in variants:
        for s in seeds:
            r = run(work / f"{v}-{s}", before, target)
            runs[(v, s)] = r
            reached = r["reached"]
            print(
                f"| {v} | {s} | {r['before']:.3f} | {r['after']:.3f} | {r['after'] - r['before']:+.3f} "
                f"| {r['best']:.3f} | {reached[0] if reached else 'not reached'} "
                f"| {f'{reached[1]:.1f}' if reached else '-'} | {r['grpo_s']:.1f} "
                f"| {r['informative']}/{r['groups']} | {r['resampled']} | {r['skipped']} | {r['train_s']:.1f} |"
            )
    print(
        "\n| variant | gain mean | gain min..max | reached target | GRPO s to target, mean of "
        "those reached | vs plain | GRPO s (all steps) mean | vs plain | trainer s mean | vs plain |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    peer = {}
    for v in variants:
        rs = [runs[(v, s)] for s in seeds]
        gains = [r["after"] - r["before"] for r in rs]
        hit = [r["reached"][1] for r in rs if r["reached"]]
        figures = {
            "to_target": statistics.mean(hit) if hit else None,
            "grpo_s": statistics.mean(r["grpo_s"] for r in rs),
            "train_s": statistics.mean(r["train_s"] for r in rs),
        }
        if v == "plain" or not peer:
            peer = figures

        def cell(k: str) -> str:
            x, p = figures[k], peer[k]
            ratio = f"{x / p:.2f}x" if x is not None and p else "-"
            return f"{x:.1f} | {ratio}" if x is not None else f"- | {ratio}"

        print(
            f"| {v} | {statistics.mean(gains):+.3f} | {min(gains):+.3f}..{max(gains):+.3f} "
            f"| {len(hit)}/{len(rs)} | {cell('to_target')} | {cell('grpo_s')} | {cell('train_s')} |"
        )

if __name__ == "__main__":
    main()
