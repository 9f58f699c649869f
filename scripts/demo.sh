#!/usr/bin/env bash
# The CPU demo (`make demo`). Its final form: install plugins from a registry, evaluate a tiny
# Qwen3-architecture model, train it with GRPO, evaluate again and show the gain. It runs the most
# complete journey that exists today and grows as each piece lands.
set -euo pipefail
HOST=${HOST:-target/release/host}
DIST=plugins/target/dist

echo "== host doctor: what this installation has"
"$HOST" doctor
echo
echo "== host bench plugins: the arith environment as a sandboxed component vs a native library"
"$HOST" bench plugins --component "$DIST/arith" --native "$DIST/arith-native"
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
  "$HOST" bench sandbox --python python3 --scale 0.5
fi
