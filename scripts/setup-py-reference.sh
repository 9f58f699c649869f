#!/usr/bin/env bash
# Creates .venv-ref: the Python reference packages (torch 2.13.0, transformers, tokenizers,
# safetensors, math-verify, openai, anthropic) that parity tests compare rlhost against. Tests
# that need it skip with a printed reason when it is absent; CI creates it.
#
# `setup-py-reference.sh bench` creates .venv-bench instead: the reference packages plus the
# Python peers of the benchmarks (TRL's GRPOTrainer), from scripts/requirements-bench.txt.
#
# The venv itself lives in ~/.cache/rlhost, keyed by a hash of scripts/requirements-ref.txt, and
# .venv-ref is a symlink to it: a fresh clone on the same machine reuses it, and a change to the
# requirements builds a new one beside the old. Idempotent; prints what it does.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/rlhost"
NAME=${1:-ref}
case "$NAME" in
  ref | bench) ;;
  *) echo "usage: setup-py-reference.sh [ref|bench]" >&2; exit 2 ;;
esac
REQ="$ROOT/scripts/requirements-$NAME.txt"
PYTHON=${PYTHON:-python3}
KEY=$( (cat "$REQ"; [ "$NAME" = ref ] || cat "$ROOT/scripts/requirements-ref.txt"; "$PYTHON" --version) | sha256sum | cut -c1-16)
VENV="$CACHE/venv-$NAME-$KEY"
LINK="$ROOT/.venv-$NAME"

say() { printf '==> %s\n' "$*"; }

if [ -f "$VENV/.complete" ]; then
  say "$NAME venv already built: $VENV"
else
  say "building the $NAME venv in $VENV (torch with its CUDA wheels is about 5 GB; 3-5 min)"
  tmp="$VENV.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$CACHE"
  "$PYTHON" -m venv "$tmp"
  "$tmp/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
  (cd "$ROOT/scripts" && "$tmp/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQ")
  "$tmp/bin/python" -c 'import torch, transformers, tokenizers, safetensors, math_verify, openai, anthropic, tensorboard, mlflow, prometheus_client, peft; print("reference packages import: torch", torch.__version__, "transformers", transformers.__version__)'
  if [ "$NAME" = bench ]; then "$tmp/bin/python" -c 'import trl; print("trl", trl.__version__)'; fi
  touch "$tmp/.complete"
  # venvs record their own path in scripts: build in place under the final name.
  rm -rf "$VENV"
  mv "$tmp" "$VENV"
  # pip wrote the temporary path into the console scripts and pyvenv.cfg; fix both.
  grep -rlF "$tmp" "$VENV/bin" "$VENV/pyvenv.cfg" 2>/dev/null | xargs -r sed -i "s#$tmp#$VENV#g"
fi

ln -sfn "$VENV" "$LINK.tmp.$$"
mv -T "$LINK.tmp.$$" "$LINK"
say "linked $LINK -> $VENV"
"$LINK/bin/python" -c 'import torch; print("torch", torch.__version__)'
