#!/usr/bin/env bash
# GRPO throughput: `host rl` against TRL's GRPOTrainer (the peer, in .venv-bench), interleaved in
# one run on the CPU, on two workloads of the arith plugin (level-1 questions, groups of 8, 32
# rollouts a step, 48 new tokens a turn, temperature 1, no KL, AdamW, constant lr):
#
#   single  single turn, no tool (`{"tools": "none"}`), on a fresh tiny Qwen3 (or MODEL);
#   tool    the demo's workload: the environment's python tool (system prompt + tool schema,
#           up to 3 turns, `{max_turns = 3}` as in configs/arith/rl/orch.toml) on a model that
#           calls the tool: TOOL_MODEL, by default the demo's warm start target/demo/warm. TRL
#           runs in its tools mode (`GRPOTrainer(tools=[python])`, max_tool_calling_iterations 2)
#           with the same tool schema, prompts and tool contract (scripts/trl-grpo-peer.py).
#
#   scripts/bench-rl.sh [MODEL] [STEPS] [ROUNDS] [TOOL_MODEL]   (make bench-rl; needs make
#                                                                setup-py-bench and make demo)
#   WORKLOADS="single tool" (default: both), THREADS=2, PYTHON_TOOL=subprocess|exec (TRL's tool)
#
# Both sides train on the same questions in the same steps: the plugin renders the whole split
# (`host eval -n -1`, one token generated) and scripts/bench-rl-prompts.py keeps the questions
# host rl's orchestrator draws, in its order, for TRL to take unshuffled.
#
# Each round runs, per workload, host rl synchronously (async_level 0, like TRL), host rl with
# async_level 1 (its default mode: the next batch is generated while the trainer trains), then
# TRL, each for STEPS steps; the best round of each is kept. Seconds per step are whole runs
# divided by STEPS: host rl timed as a process (model, engine and plugin start-up included),
# TRL's trainer.train() only. The steady state (median step after the first) is printed too, and
# for the tool workload the tool calls each side executed (so a run where no tool is called
# cannot pass for the tool workload). Rounds are kept in $WORK/rounds.jsonl.
# The arith plugin comes from $RLHOST_HOME, by default the home `make demo` installed it into
# (target/demo/home).
set -euo pipefail
export RLHOST_HOME=${RLHOST_HOME:-$(realpath -m "${TARGET_DIR:-target}/demo/home")}
# The models are local folders: keep transformers off the network (here a hub lookup it makes
# inside TRL's first step stalls ~12 s without network, which is no part of the workload).
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
HOST=$(realpath "${HOST:-target/release/host}")
PY=${PY:-.venv-bench/bin/python}
WORK=$(realpath -m "${TARGET_DIR:-target}/bench-rl")
STEPS=${2:-16}
ROUNDS=${3:-3}
THREADS=${THREADS:-2}
WORKLOADS=${WORKLOADS:-single tool}
PYTHON_TOOL=${PYTHON_TOOL:-subprocess}
TOOL_MODEL=${4:-${TOOL_MODEL:-${TARGET_DIR:-target}/demo/warm}}
[ -x "$PY" ] || { echo "bench-rl: $PY is missing: run make setup-py-bench" >&2; exit 1; }
for w in $WORKLOADS; do
  case $w in single | tool) ;; *) echo "bench-rl: unknown workload $w (single, tool)" >&2; exit 2 ;; esac
done
if [[ " $WORKLOADS " == *" tool "* ]]; then
  [ -f "$TOOL_MODEL/config.json" ] || {
    echo "bench-rl: the tool workload's model $TOOL_MODEL is missing: run make demo first" \
      "(it makes target/demo/warm), or pass a model that calls the python tool as TOOL_MODEL" >&2
    exit 1
  }
  TOOL_MODEL=$(realpath "$TOOL_MODEL")
fi
rm -rf "$WORK"
mkdir -p "$WORK"
prompts() {  # workload, model, env args
  # The whole split rendered by the plugin (one token generated), then the questions host rl
  # draws (its seeded order, 4 a step), so TRL trains on the same questions in the same steps.
  "$HOST" eval arith -m "$2" --split train-d1 -n -1 -r 1 --max-tokens 1 -a "$3" \
    -s "$WORK/prompts-$1-all" >/dev/null
  python3 scripts/bench-rl-prompts.py "$WORK/prompts-$1-all/arith/results.jsonl" \
    "$WORK/prompts-$1.jsonl" --steps "$STEPS" --problems 4 --seed 0
  rm -rf "$WORK/prompts-$1-all"
}
MODEL=${1:-}
if [[ " $WORKLOADS " == *" single "* ]]; then
  if [ -z "$MODEL" ]; then
    MODEL="$WORK/tiny"
    "$HOST" model init --preset tiny --seed 0 --out "$MODEL" >/dev/null
  fi
  MODEL=$(realpath "$MODEL")
  # The prompts: the arith plugin's own rendering of level-1 questions without the tool.
  prompts single "$MODEL" '{"tools": "none"}'
fi
if [[ " $WORKLOADS " == *" tool "* ]]; then
  # The prompts with the tool: the environment's system prompt, its python tool's schema (kept
  # in each record) and the rendered prompt's token ids, which the peer checks TRL reproduces.
  prompts tool "$TOOL_MODEL" '{"max_turns": 3}'
fi
export OMP_NUM_THREADS=$THREADS
: > "$WORK/rounds.jsonl"

host_run() {  # workload, async level, output folder
  local model args
  if [ "$1" = tool ]; then model=$TOOL_MODEL args='{max_turns = 3}'; else model=$MODEL args='{tools = "none"}'; fi
  rm -rf "$3"
  local t0 t1
  t0=$(date +%s.%N)
  "$HOST" rl --plugin arith --model.name "$model" --output-dir "$3" \
    --trainer.max-steps "$STEPS" --orchestrator.max-steps "$STEPS" --trainer.ckpt.interval 0 \
    "--orchestrator.env[0].args" "$args" --orchestrator.async-level "$2" >"$3.log" 2>&1 || {
    echo "bench-rl: host rl failed ($1, async_level $2); the end of $3.log:" >&2
    tail -5 "$3.log" >&2
    exit 1
  }
  t1=$(date +%s.%N)
  python3 -c "print($t1 - $t0)"
}

trl_run() {  # workload
  local extra=()
  if [ "$1" = tool ]; then
    extra=(--model "$TOOL_MODEL" --tools --max-turns 3 --python-tool "$PYTHON_TOOL")
  else
    extra=(--model "$MODEL")
  fi
  # TRL prints its step logs on stdout too; the peer's JSON is the last line.
  "$PY" scripts/trl-grpo-peer.py "${extra[@]}" --prompts "$WORK/prompts-$1.jsonl" --in-order \
    --steps "$STEPS" --threads "$THREADS" --out "$WORK/trl-run" >"$WORK/trl-$1.out" \
    2>"$WORK/trl-$1.log" || {
    echo "bench-rl: TRL failed ($1); the end of $WORK/trl-$1.log:" >&2
    tail -5 "$WORK/trl-$1.log" >&2
    exit 1
  }
  tail -1 "$WORK/trl-$1.out" | tee "$WORK/trl-$1.json"
}

for round in $(seq "$ROUNDS"); do
  for w in $WORKLOADS; do
    sync_s=$(host_run "$w" 0 "$WORK/host-$w-sync")
    async_s=$(host_run "$w" 1 "$WORK/host-$w-async")
    trl_json=$(trl_run "$w")
    python3 - "$w" "$WORK/host-$w-sync/metrics.jsonl" "$WORK/host-$w-async/metrics.jsonl" \
      "$sync_s" "$async_s" "$trl_json" "$round" "$STEPS" >> "$WORK/rounds.jsonl" <<'PY'
import json, statistics, sys
w, sync_m, async_m, sync_s, async_s, trl, rnd, n = sys.argv[1:]
sync_steps = [json.loads(l) for l in open(sync_m)]
async_steps = [json.loads(l) for l in open(async_m)]
trl = json.loads(trl)
n = int(n)
mean = lambda xs: statistics.mean(xs) if xs else None
# Per step: the environment's metrics are means over the step's 32 rollouts.
calls = lambda steps: mean([s["metrics"].get("num_tool_calls", 0.0) * 32 for s in steps])
row = {"workload": w, "round": int(rnd),
       "host_sync_s": float(sync_s) / n,
       "host_async_s": float(async_s) / n,
       "trl_s": trl["seconds"] / n,
       "host_sync_steady_s": statistics.median(s["rollout_s"] + s["train_s"] for s in sync_steps[1:] or sync_steps),
       "trl_steady_s": statistics.median(trl["step_seconds"][1:] or trl["step_seconds"]),
       "host_seq_len": mean([s["seq_len"] for s in sync_steps]),
       "trl_completion_tokens": trl["completion_tokens_mean"],
       "host_correct": mean([s["metrics"].get("correct", 0.0) for s in sync_steps]),
       "trl_correct": trl.get("correct_mean")}
if w == "tool":
    row.update({
        "host_sync_tool_calls_per_step": calls(sync_steps),
        "host_async_tool_calls_per_step": calls(async_steps),
        "host_turns_per_rollout": mean([s["metrics"].get("num_turns", 1.0) for s in sync_steps]),
        "trl_tool_calls_per_step": mean(trl["tool_calls_per_step"]),
        "trl_tool_calls_logged_per_step": mean(trl["tool_calls"]),
        "trl_turns_per_rollout": trl["turns_mean"],
        "trl_tool_seconds_per_step": trl["tool_seconds"] / n,
        "trl_python_tool": trl["python_tool"],
        "trl_prompt_matches_host": trl["prompt_matches_host"],
    })
print(json.dumps(row))
msg = (f"round {row['round']} {w}: s/step host rl sync {row['host_sync_s']:.2f}, "
       f"async {row['host_async_s']:.2f}, TRL {row['trl_s']:.2f}")
if w == "tool":
    msg += (f"; tool calls/step host {row['host_sync_tool_calls_per_step']:.1f} / "
            f"{row['host_async_tool_calls_per_step']:.1f}, TRL {row['trl_tool_calls_per_step']:.1f}")
print(msg, file=sys.stderr)
PY
  done
done

python3 - "$WORK/rounds.jsonl" "$STEPS" "${MODEL:-}" "${TOOL_MODEL:-}" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps, model, tool_model = int(sys.argv[2]), sys.argv[3], sys.argv[4]
titles = {"single": f"single turn, no tool ({model})",
          "tool": f"python tool, up to 3 turns ({tool_model})"}
n_rounds = len({r["round"] for r in rows})
print(f"GRPO on arith level 1: {steps} steps of 32 rollouts (groups of 8), 48 tokens a turn; "
      f"best of {n_rounds} rounds")
print("(host rl timed as a process, start-up included; TRL's trainer.train() only)")
for w in ("single", "tool"):
    ws = [r for r in rows if r["workload"] == w]
    if not ws:
        continue
    best = lambda k: min(r[k] for r in ws)
    trl = best("trl_s")
    last = ws[-1]
    print()
    print(titles[w])
    head = f"  {'':32}{'s/step':>8}{'rollouts/s':>12}{'vs TRL':>8}"
    if w == "tool":
        head += f"{'tool calls/step':>17}"
    print(head)
    entries = [("host rl, async_level 0", "host_sync_s", "host_sync_tool_calls_per_step"),
               ("host rl, async_level 1", "host_async_s", "host_async_tool_calls_per_step"),
               ("TRL 1.16 GRPOTrainer" + (" (tools)" if w == "tool" else ""), "trl_s",
                "trl_tool_calls_per_step")]
    for name, k, calls in entries:
        line = f"  {name:32}{best(k):>8.2f}{32 / best(k):>12.1f}{trl / best(k):>7.2f}x"
        if w == "tool":
            line += f"{sum(r[calls] for r in ws) / len(ws):>17.1f}"
        print(line)
    print(f"  steady state (median step after the first): host rl sync {best('host_sync_steady_s'):.2f} s, "
          f"TRL {best('trl_steady_s'):.2f} s")
    tok = f"  mean sequence tokens per sample (host): {last['host_seq_len']:.1f}; model tokens per rollout (TRL): "
    tok += f"{last['trl_completion_tokens']:.1f}" if last["trl_completion_tokens"] is not None else "-"
    print(tok)
    fmt = lambda x: "-" if x is None else f"{x:.3f}"
    corr = f"  mean correct over the run: host rl sync {fmt(last['host_correct'])}, TRL {fmt(last['trl_correct'])}"
    if w == "tool":
        corr += (f"; turns per rollout: host {last['host_turns_per_rollout']:.2f}, "
                 f"TRL {last['trl_turns_per_rollout']:.2f}")
        print(corr)
        print(f"  TRL's python tool: {last['trl_python_tool']} ({last['trl_tool_seconds_per_step']:.3f} s/step in tool "
              f"calls); TRL's prompt == host's prompt tokens: {last['trl_prompt_matches_host']}")
        if any(r["trl_tool_calls_per_step"] == 0 or r["host_sync_tool_calls_per_step"] == 0 for r in ws):
            print("  WARNING: a side executed no tool call: this model does not exercise the tool workload")
    else:
        print(corr)
PY
