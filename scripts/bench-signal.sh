#!/usr/bin/env bash
# GRPO's signal on the demo: how many wall-clock seconds of `host rl` the demo's task needs to
# reach its after-RL Correct, with and without the signal-density options, on the same seeds.
#
#   scripts/bench-signal.sh [STEPS] [SEEDS]     (make bench-signal; after make demo)
#   defaults: 30 steps (the demo's), seeds "0 1 2"; TARGET (default 0.85), the Correct to reach;
#   VARIANTS (default "plain skip dynamic")
#
# Each variant is the demo's run (configs/arith/rl, the warm start target/demo/warm, `host rl
# --plugin arith`) with `orchestrator.seed` = SEED and a checkpoint every 3 steps:
#
#   plain    every sample through the trainer (trainer.skip_zero_advantage = false): the
#            trainer as it was before zero-advantage skipping;
#   skip     the default: samples of advantage 0 skipped in the trainer (the same update);
#   dynamic  skip + DAPO dynamic sampling: orchestrator.filter_groups on `correct`, at most 4
#            generation rounds a step.
#
# Nothing else runs during a run (no evaluation in it), so its per-step `elapsed_s` is GRPO's
# wall time (checkpoints included). Afterwards every checkpoint, and the warm start, is scored
# with the demo's held-out evaluation (`host eval arith --split test-d1 -n 100 -r 2 --max-tokens
# 48 --temperature 1 --seed 1`). Variants alternate within each seed, so the machine's drift
# spreads over all of them. The report (scripts/bench-signal.py) gives, per run, Correct before
# and after, and the steps and GRPO seconds to the first checkpoint at or above TARGET. Runs stay
# in target/bench-signal/<variant>-<seed>/; the report goes to target/bench-signal/report.md.
set -euo pipefail
export RLHOST_HOME=${RLHOST_HOME:-$(realpath -m "${TARGET_DIR:-target}/demo/home")}
if [ -z "${RLHOST_PYTHON_SANDBOX:-}" ] && [ -f sandbox/target/python-sandbox.wasm ]; then
  export RLHOST_PYTHON_SANDBOX=$PWD/sandbox/target/python-sandbox.wasm
fi
HOST=$(realpath "${HOST:-target/release/host}")
WORK=$(realpath -m "${TARGET_DIR:-target}/bench-signal")
WARM=$(realpath -m "${TARGET_DIR:-target}/demo/warm")
STEPS=${1:-30}
SEEDS=${2:-"0 1 2"}
TARGET=${TARGET:-0.85}
VARIANTS=${VARIANTS:-"plain skip dynamic"}
[ -f "$WARM/config.json" ] || { echo "no warm start at $WARM: run make demo first" >&2; exit 1; }
mkdir -p "$WORK"

# score MODEL_DIR OUT: the demo's held-out evaluation of a model folder.
score() {
  "$HOST" eval arith --split test-d1 -n 100 -r 2 --max-tokens 48 --temperature 1 --seed 1 \
    -m "$1" -s "$2" >"$2.log" 2>&1 || { tail -20 "$2.log" >&2; exit 1; }
}

[ -f "$WORK/warm/arith/summary.json" ] || score "$WARM" "$WORK/warm"
for seed in $SEEDS; do
  for variant in $VARIANTS; do
    case $variant in
      plain) extra=(--trainer.skip-zero-advantage false) ;;
      skip) extra=() ;;
      dynamic) extra=(--orchestrator.filter-groups.metric correct
                      --orchestrator.filter-groups.max-num-gen-batches 4) ;;
      *) echo "unknown variant $variant" >&2; exit 2 ;;
    esac
    out="$WORK/$variant-$seed"
    rm -rf "$out"
    echo "== $variant, seed $seed"
    "$HOST" rl --plugin arith --model.name "$WARM" --output-dir "$out" \
      --orchestrator.seed "$seed" --trainer.max-steps "$STEPS" --orchestrator.max-steps "$STEPS" \
      --trainer.ckpt.interval 3 --trainer.ckpt.keep 1000 "${extra[@]}" >"$out.log" 2>&1 ||
      { tail -20 "$out.log" >&2; exit 1; }
    tail -1 "$out.log"
    # Each checkpoint as a model folder (its weights, the warm start's tokenizer), scored.
    for ckpt in "$out"/checkpoints/step_*; do
      m="$out/eval/$(basename "$ckpt")"
      mkdir -p "$m/model"
      cp "$WARM"/tokenizer*.json "$WARM"/generation_config.json "$m/model/"
      ln -sf "$ckpt/config.json" "$ckpt/model.safetensors" "$m/model/"
      score "$m/model" "$m"
    done
  done
done
python3 scripts/bench-signal.py "$WORK" "$TARGET" "$VARIANTS" "$SEEDS" | tee "$WORK/report.md"
