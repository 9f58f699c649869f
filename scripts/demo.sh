#!/usr/bin/env bash
# The CPU demo (`make demo`). Its final form: install plugins from a registry, evaluate a tiny
# Qwen3-architecture model, train it with GRPO, evaluate again and show the gain. It runs the most
# complete journey that exists today and grows as each piece lands.
#
# Everything it writes lives under target/demo (its own $RLHOST_HOME and registry), so it is
# repeatable and leaves ~/.rlhost alone.
set -euo pipefail
HOST=${HOST:-target/release/host}
HOST=$(realpath "$HOST")
DIST=$(realpath plugins/target/dist)
DEMO=$(realpath -m "${TARGET_DIR:-target}/demo")

rm -rf "$DEMO"
mkdir -p "$DEMO/packages"
export RLHOST_HOME="$DEMO/home"
unset RLHOST_REGISTRY  # the default registry: $RLHOST_HOME/registry

echo "== host doctor: what this installation has"
"$HOST" doctor
echo
echo "== a local registry, a publisher key, and the first-party plugins published to it"
"$HOST" registry init --root "$RLHOST_HOME/registry"
"$HOST" registry keygen --out "$DEMO/publisher.key" >/dev/null
for owner in rlhost will; do
  "$HOST" registry add-key --root "$RLHOST_HOME/registry" --owner "$owner" --key-file "$DEMO/publisher.key"
done
for plugin in arith arith-tools exact-match math-verify math-python math500 aime2024 aime2025 deepscaler; do
  "$HOST" env pack "$DIST/$plugin" -o "$DEMO/packages/$plugin.rlpkg"
  "$HOST" env publish "$DEMO/packages/$plugin.rlpkg" --key "$DEMO/publisher.key"
done
echo
echo "== host env search / install / list"
"$HOST" env search
"$HOST" env install rlhost/arith arith-tools exact-match will/math-python math500 aime2024 aime2025 deepscaler rlhost/math-verify
"$HOST" env list
"$HOST" env info will/math-python
echo
echo "== host bench plugins: the installed arith as a sandboxed component vs its native build"
"$HOST" bench plugins --component "$RLHOST_HOME/plugins/rlhost/arith/0.2.0" --native "$DIST/arith-native"
echo
echo "== host bench math-verify: the installed reward plugin vs Python math-verify (MATH-500 golds)"
if [ -x .venv-ref/bin/python ]; then
  "$HOST" bench math-verify --golds 500 --python .venv-ref/bin/python
else
  echo "(skipped: .venv-ref with Python math-verify is absent; run make setup-py-reference)"
fi
echo
echo "== host sandbox run: model-written Python, isolated (CPython in WebAssembly, sympy preloaded)"
"$HOST" sandbox run -c 'from sympy import *
x = symbols("x")
integrate(sin(x)**2, x)'
"$HOST" sandbox run -c 'while True: pass' --timeout 1 || echo "(exit code $?)"
echo
echo "== host bench sandbox: python tool calls vs python -c subprocesses"
if [ -x .venv-ref/bin/python ]; then
  # The reference venv has sympy, so it can also run the native fallback's preload.
  "$HOST" bench sandbox --python .venv-ref/bin/python --native-python .venv-ref/bin/python --scale 0.5
else
  echo "(no native sympy preload: .venv-ref is absent; make setup-py-reference builds it)"
  "$HOST" bench sandbox --python python3 --scale 0.5
fi
echo
echo "== a tiny Qwen3 (1.7M parameters, rlhost's own tokenizer) served over the OpenAI API"
"$HOST" model init --preset tiny --seed 0 --out "$DEMO/tiny"
"$HOST" model info "$DEMO/tiny"
"$HOST" inference @ configs/tiny/infer.toml --model.name "$DEMO/tiny" --port 0 > "$DEMO/inference.log" 2>&1 &
SERVER=$!
for _ in $(seq 100); do grep -q "on http://" "$DEMO/inference.log" && break; sleep 0.1; done
BASE=$(grep -o 'http://[0-9.:]*/v1' "$DEMO/inference.log")
curl -s "$BASE/chat/completions" -H 'content-type: application/json' \
  -d '{"messages": [{"role": "user", "content": "What is 6 times 7?"}], "max_tokens": 12, "seed": 1}'
echo
kill -TERM "$SERVER"; wait "$SERVER" || true
echo
echo "== host bench generate: rlhost's engine vs transformers generate on the same folder"
if [ -x .venv-ref/bin/python ]; then
  "$HOST" bench generate --model "$DEMO/tiny" --repeats 2
else
  echo "(no transformers column: .venv-ref, with transformers, is absent; make setup-py-reference builds it)"
  "$HOST" bench generate --model "$DEMO/tiny" --repeats 2 --no-peer
fi
echo
echo "== the training pipeline on arith: teacher rollouts -> host sft -> host eval -> host rl (GRPO) -> host eval"
# A scripted teacher (scripts/arith-teacher.py) answers 40% of the level-1 questions with the
# python tool and the rest with a lazy mental estimate; its conversations, recorded through the
# real environment and sandbox, warm-start the tiny model, which learns both habits: it copies
# expressions into tool calls well but calls the tool only about as often as the teacher did.
# GRPO on the train split then has to discover that the tool pays. Before/after are measured on
# the held-out test-d1 split, sampling at temperature 1 as the policy does, seeded.
python3 scripts/arith-teacher.py --tool-rate 0.4 > "$DEMO/teacher.url" &
TEACHER=$!
for _ in $(seq 100); do [ -s "$DEMO/teacher.url" ] && break; sleep 0.1; done
"$HOST" eval arith -b "$(cat "$DEMO/teacher.url")" -n 3000 -r 1 -c 16 --split train-d1 -s "$DEMO/traces" | tail -1
kill "$TEACHER"; wait "$TEACHER" 2>/dev/null || true
"$HOST" sft -m "$DEMO/tiny" --data "$DEMO/traces/arith/results.jsonl" \
  --steps 900 --batch-size 16 --lr 6e-3 --schedule cosine --out "$DEMO/warm"
EVAL=(eval arith --split test-d1 -n 100 -r 2 --max-tokens 48 --temperature 1 --seed 1)
"$HOST" "${EVAL[@]}" -m "$DEMO/warm" -s "$DEMO/eval-before" > "$DEMO/eval-before.txt"
"$HOST" rl --plugin arith --model.name "$DEMO/warm" --output-dir "$DEMO/rl"
"$HOST" "${EVAL[@]}" -m "$DEMO/rl/final" -s "$DEMO/eval-after" > "$DEMO/eval-after.txt"
echo
echo "held-out test-d1, 100 questions x 2 samples at temperature 1:"
echo "before RL: $(tail -1 "$DEMO/eval-before.txt")"
echo "after RL:  $(tail -1 "$DEMO/eval-after.txt")"
python3 - "$DEMO/eval-before/arith/summary.json" "$DEMO/eval-after/arith/summary.json" <<'PY'
import json, sys
def correct(path):
    return dict(json.load(open(path))["metrics"])["correct"]
before, after = (correct(p) for p in sys.argv[1:])
print(f"Correct {before:.3f} -> {after:.3f} ({after - before:+.3f})")
PY
echo "training curves: $DEMO/rl/curves.png"
