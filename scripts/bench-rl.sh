#!/usr/bin/env bash
# GRPO throughput: `host rl` against TRL's GRPOTrainer (the peer, in .venv-bench), interleaved in
# one run on the CPU: the same tiny Qwen3, the same arith prompts (level 1, single turn, no
# tool), group 8, batch 32, 48 new tokens, temperature 1, no KL, AdamW, constant lr.
#
#   scripts/bench-rl.sh [MODEL] [STEPS] [ROUNDS]     (make bench-rl; needs make setup-py-bench)
#
# Each round runs host rl synchronously (async_level 0, like TRL), host rl with async_level 1
# (its default mode: the next batch is generated while the trainer trains), then TRL, each for
# STEPS steps; the best round of each is kept. Seconds per step are whole runs divided by STEPS:
# host rl timed as a process (model, engine and plugin start-up included), TRL's
# trainer.train() only. The steady state (median step after the first) is printed too.
# The arith plugin comes from $RLHOST_HOME, by default the home `make demo` installed it into
# (target/demo/home).
set -euo pipefail
export RLHOST_HOME=${RLHOST_HOME:-$(realpath -m "${TARGET_DIR:-target}/demo/home")}
HOST=$(realpath "${HOST:-target/release/host}")
PY=${PY:-.venv-bench/bin/python}
WORK=$(realpath -m "${TARGET_DIR:-target}/bench-rl")
STEPS=${2:-16}
ROUNDS=${3:-3}
THREADS=${THREADS:-2}
[ -x "$PY" ] || { echo "bench-rl: $PY is missing: run make setup-py-bench" >&2; exit 1; }
rm -rf "$WORK"
mkdir -p "$WORK"
MODEL=${1:-}
if [ -z "$MODEL" ]; then
  MODEL="$WORK/tiny"
  "$HOST" model init --preset tiny --seed 0 --out "$MODEL" >/dev/null
fi
MODEL=$(realpath "$MODEL")
ARGS='{"tools": "none"}'
# The prompts: the arith plugin's own rendering of level-1 questions without the tool.
"$HOST" eval arith -m "$MODEL" --split train-d1 -n $((STEPS * 4)) -r 1 --max-tokens 1 -a "$ARGS" \
  -s "$WORK/prompts" >/dev/null
export OMP_NUM_THREADS=$THREADS
: > "$WORK/rounds.jsonl"
host_run() {  # async level, output folder
  rm -rf "$2"
  local t0 t1
  t0=$(date +%s.%N)
  "$HOST" rl --plugin arith --model.name "$MODEL" --output-dir "$2" \
    --trainer.max-steps "$STEPS" --orchestrator.max-steps "$STEPS" --trainer.ckpt.interval 0 \
    --orchestrator.environment.args '{tools = "none"}' --orchestrator.async-level "$1" >/dev/null
  t1=$(date +%s.%N)
  python3 -c "print($t1 - $t0)"
}
for round in $(seq "$ROUNDS"); do
  sync_s=$(host_run 0 "$WORK/host-sync")
  async_s=$(host_run 1 "$WORK/host-async")
  trl_json=$("$PY" scripts/trl-grpo-peer.py --model "$MODEL" --prompts "$WORK/prompts/arith/results.jsonl" \
    --steps "$STEPS" --threads "$THREADS" --out "$WORK/trl-run" 2>"$WORK/trl.log" | tail -1)
  python3 - "$WORK/host-sync/metrics.jsonl" "$sync_s" "$async_s" "$trl_json" "$round" "$STEPS" >> "$WORK/rounds.jsonl" <<'PY'
import json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
trl = json.loads(sys.argv[4])
n = int(sys.argv[6])
row = {"round": int(sys.argv[5]),
       "host_sync_s": float(sys.argv[2]) / n,
       "host_async_s": float(sys.argv[3]) / n,
       "trl_s": trl["seconds"] / n,
       "host_sync_steady_s": statistics.median(s["rollout_s"] + s["train_s"] for s in steps[1:]),
       "trl_steady_s": statistics.median(trl["step_seconds"][1:]),
       "host_seq_len": statistics.mean(s["seq_len"] for s in steps),
       "trl_completion_tokens": trl["completion_tokens_mean"]}
print(json.dumps(row))
print(f"round {row['round']}: s/step host rl sync {row['host_sync_s']:.2f}, async {row['host_async_s']:.2f}, "
      f"TRL {row['trl_s']:.2f}", file=sys.stderr)
PY
done
python3 - "$WORK/rounds.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
best = lambda k: min(r[k] for r in rows)
trl = best("trl_s")
print(f"whole runs, best of {len(rows)} rounds, 32 rollouts a step (host rl timed as a process):")
print(f"{'':28}{'s/step':>8}{'rollouts/s':>12}{'vs TRL':>8}")
for name, k in [("host rl, async_level 0", "host_sync_s"), ("host rl, async_level 1", "host_async_s"),
                ("TRL GRPOTrainer", "trl_s")]:
    print(f"{name:28}{best(k):>8.2f}{32 / best(k):>12.1f}{trl / best(k):>7.2f}x")
print(f"steady state (median step after the first): host rl sync {best('host_sync_steady_s'):.2f} s, "
      f"TRL {best('trl_steady_s'):.2f} s")
print(f"mean completion tokens (TRL): {rows[-1]['trl_completion_tokens']:.1f}; "
      f"mean sequence tokens, prompt + completion (host): {rows[-1]['host_seq_len']:.1f}")
PY
