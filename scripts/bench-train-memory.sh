#!/usr/bin/env bash
# make bench-train-memory: the trainer's memory goals measured on this machine's CPU, Qwen3-0.6B's
# shape (random weights), one row per micro-batch (docs/benchmarks.md has the figures):
#   1. bf16 + full activation checkpointing + optimizer offload against today's default step (f32,
#      no checkpointing, no offload) at SEQ tokens, the longest f32 step 24 GiB holds: the ratio
#      of device peaks; the activation model is fitted on the default step;
#   2. the same options at 4,096 and 8,192 tokens, with that fitted model: linear, not quadratic;
#   3. checkpointing's step time: f32 with and without it at 1,024 tokens, 3 steps each.
# Each figure is one `host bench train-memory` process (a peak resident memory is per process).
set -euo pipefail
HOST=${HOST:-target/release/host}
OUT=${OUT:-target/bench-train-memory}
SEQ=${SEQ:-2048}
mkdir -p "$OUT"
bench() { "$HOST" bench train-memory --preset 0.6b --device cpu --json "$@"; }
echo "==> bf16 + ac full + offload vs f32 at $SEQ tokens (about 4 min)"
bench --seq-len "$SEQ" --dtype bf16 --ac full --offload --baseline > "$OUT/vs-default.json"
scale=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['activation_scale'])" "$OUT/vs-default.json")
for n in 4096 8192; do
  echo "==> bf16 + ac full + offload at $n tokens"
  bench --seq-len "$n" --dtype bf16 --ac full --offload --activation-scale "$scale" > "$OUT/len-$n.json"
done
echo "==> checkpointing's step time, f32, 1,024 tokens"
bench --seq-len 1024 --dtype f32 --ac full --steps 3 --baseline > "$OUT/ac-time.json"
python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
read = lambda n: json.load(open(os.path.join(out, n)))
gib = lambda b: b / 2**30
v, a, b, t = read("vs-default.json"), read("len-4096.json"), read("len-8192.json"), read("ac-time.json")
for r in (v, a, b, t):
    m = r["measured"]
    if m.get("error"):
        sys.exit(f"{r['seq_len']} tokens, {r['dtype']}, ac {r['ac']}: the step failed: {m['error']}")
print(f"\nQwen3-0.6B shape, one row, CPU; device peak = weights + grads + optimizer unless offloaded + the step's transient")
print(f"| run | tokens | device peak GiB | model's prediction GiB | step s |")
print(f"|---|---|---|---|---|")
base = v["baseline"]
print(f"| f32, ac none, optimizer on the device (today's default) | {v['seq_len']} | {gib(base['device_peak']):.2f} | (fitted: x{v['activation_scale']:.3f}) | {base['step_s']:.1f} |")
for r in (v, a, b):
    m = r["measured"]
    print(f"| bf16, ac full, optimizer offloaded | {r['seq_len']} | {gib(m['device_peak']):.2f} | {gib(r['predicted_peak']):.2f} | {m['step_s'][0]:.1f} |")
print(f"\ngoal: bf16 + ac + offload <= 35% of the default step's peak at {v['seq_len']} tokens: {base['memory_ratio']:.3f}")
ratio = b["measured"]["device_peak"] / a["measured"]["device_peak"]
print(f"goal: peak at 8,192 tokens <= 2.2x the peak at 4,096: {ratio:.2f}x")
print(f"goal: checkpointing's step time <= 1.4x (f32, 1,024 tokens, median of steps 2-3): {t['baseline']['time_ratio']:.2f}x")
PY
