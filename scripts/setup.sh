#!/usr/bin/env bash
# One-command setup for rlhost developers and CI. Idempotent: safe to re-run; each step says what it
# does and skips work that is already done.
#
#   1. the pinned Rust toolchain (rust-toolchain.toml) with clippy, rustfmt and wasm32-wasip2;
#   2. libtorch for tch, from PyPI's torch wheel, minimal `--no-deps --target` install, cached under
#      ~/.cache/rlhost (see ../shared/SETUP-NOTES.md for why each piece is there);
#   3. Node.js and npm (the AssemblyScript plugins' compiler comes from npm);
#   4. a headless Chromium (Debian's chromium-headless-shell), where apt is available: the hub's
#      browser test (host/tests/e2e/hub.rs) walks the registry's web pages in it;
#   5. `.rlhost-env`, a small env file that the Makefile and .ci/run source.
#
# With --cuda (`make build CUDA=1`), step 2 also installs the CUDA wheels torch's METADATA names for
# Linux (cuBLAS, cuDNN, cuFFT, cuFile, cuRAND, cuSOLVER, cuSPARSE(Lt), NCCL, NVRTC, NVSHMEM...,
# about 3 GB) next to libtorch, where libtorch_cuda.so's RPATH looks for them.
set -euo pipefail
CUDA=0
for arg in "$@"; do
  case "$arg" in
    --cuda) CUDA=1 ;;
    *) echo "setup.sh: unknown argument '$arg' (--cuda: also the CUDA libraries)" >&2; exit 2 ;;
  esac
done

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/rlhost"
ENV_FILE="$ROOT/.rlhost-env"

# Pins. tch 0.26.0 accepts exactly this libtorch; the two CUDA wheels carry the shared objects that
# libtorch_cpu.so itself links against (libcudart.so.13, libcupti.so.13).
RUST_VERSION=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' "$ROOT/rust-toolchain.toml")
TORCH_VERSION=2.13.0
CUDA_RUNTIME_VERSION=13.0.96
CUDA_CUPTI_VERSION=13.0.85
LIBTORCH_DIR="$CACHE/libtorch-$TORCH_VERSION"

say() { printf '==> %s\n' "$*"; }

# --- 1. Rust toolchain ------------------------------------------------------------------------
# RUSTUP_AUTO_INSTALL=0 is set on our machines, so rust-toolchain.toml alone installs nothing.
if rustup run "$RUST_VERSION" rustc --version >/dev/null 2>&1 \
  && rustup component list --toolchain "$RUST_VERSION" --installed 2>/dev/null | grep -q '^clippy' \
  && rustup component list --toolchain "$RUST_VERSION" --installed 2>/dev/null | grep -q '^rustfmt' \
  && rustup target list --toolchain "$RUST_VERSION" --installed 2>/dev/null | grep -qx 'wasm32-wasip2'; then
  say "rust $RUST_VERSION with clippy, rustfmt, wasm32-wasip2: already installed"
else
  say "installing rust $RUST_VERSION (clippy, rustfmt, wasm32-wasip2)"
  rustup toolchain install "$RUST_VERSION" --profile minimal -c clippy -c rustfmt -t wasm32-wasip2
fi

# --- 2. libtorch ------------------------------------------------------------------------------
PYTHON=${PYTHON:-python3}
if [ -f "$LIBTORCH_DIR/.complete" ] && [ -f "$LIBTORCH_DIR/torch/lib/libtorch_cpu.so" ]; then
  say "libtorch $TORCH_VERSION: already in $LIBTORCH_DIR"
else
  say "installing libtorch $TORCH_VERSION from PyPI into $LIBTORCH_DIR (about 1.2 GB)"
  # Install into a temporary folder and rename, so an interrupted download never looks complete.
  tmp="$LIBTORCH_DIR.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$CACHE"
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps --target "$tmp" \
    "torch==$TORCH_VERSION" \
    "nvidia-cuda-runtime==$CUDA_RUNTIME_VERSION" \
    "nvidia-cuda-cupti==$CUDA_CUPTI_VERSION"
  touch "$tmp/.complete"
  rm -rf "$LIBTORCH_DIR"
  mv "$tmp" "$LIBTORCH_DIR"
fi

if [ "$CUDA" = 1 ]; then
  if [ -f "$LIBTORCH_DIR/.cuda-complete" ]; then
    say "CUDA libraries for torch $TORCH_VERSION: already in $LIBTORCH_DIR/nvidia"
  else
    # Exactly what torch's METADATA requires on Linux, less its Python-only packages (triton,
    # cuda-bindings); pip resolves the cuda-toolkit extras to their wheels.
    REQS=$("$PYTHON" - "$LIBTORCH_DIR/torch-$TORCH_VERSION.dist-info/METADATA" <<'PY'
import re, sys
for line in open(sys.argv[1]):
    if not line.startswith("Requires-Dist:"):
        continue
    req, _, marker = line.split(":", 1)[1].strip().partition(";")
    name = re.split(r"[\[=<>!~ ]", req.strip())[0]
    if 'platform_system == "Linux"' in marker and name not in ("triton", "cuda-bindings"):
        print(req.strip())
PY
)
    say "installing the CUDA libraries torch $TORCH_VERSION names (about 3 GB): $(echo $REQS)"
    tmp="$LIBTORCH_DIR.cuda.tmp.$$"
    rm -rf "$tmp"
    # shellcheck disable=SC2086
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --only-binary :all: --target "$tmp" $REQS
    # The wheels share the `nvidia/` folder: merge it (and their records) into libtorch's.
    cp -a "$tmp/nvidia/." "$LIBTORCH_DIR/nvidia/"
    cp -a "$tmp"/*.dist-info "$LIBTORCH_DIR/"
    rm -rf "$tmp"
    touch "$LIBTORCH_DIR/.cuda-complete"
  fi
fi

# libtorch_cpu.so finds libcudart/libcupti through LD_LIBRARY_PATH; collect their folders (with
# --cuda, every CUDA library's: libtorch_cuda.so also finds them through its RPATH).
CUDA_LIBS=$(find "$LIBTORCH_DIR/nvidia" -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u | paste -sd: -)

# --- 3. Node.js --------------------------------------------------------------------------------
# npm brings the AssemblyScript compiler and the Extism PDK for the Extism plugins (plugins/extism).
if command -v node >/dev/null && command -v npm >/dev/null; then
  say "node $(node --version) and npm: already installed"
else
  say "installing Node.js and npm (Debian packages)"
  SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq nodejs npm >/dev/null
fi

# --- 4. Chromium -------------------------------------------------------------------------------
# The registry's web pages are tested in a real browser; without one that test says it skipped
# (and CI, which runs this script, fails on the skip).
if command -v chromium-headless-shell >/dev/null || command -v chromium >/dev/null; then
  say "chromium: already installed"
elif command -v apt-get >/dev/null && { [ "$(id -u)" = 0 ] || command -v sudo >/dev/null; }; then
  say "installing chromium-headless-shell (Debian package, for the hub's browser test)"
  SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium-headless-shell >/dev/null
else
  say "no apt-get: not installing chromium (the hub's browser test will skip)"
fi

# --- 5. env file ------------------------------------------------------------------------------
say "writing $ENV_FILE"
tmp_env="$ENV_FILE.tmp.$$"
cat >"$tmp_env" <<ENV
# Written by scripts/setup.sh; sourced by the Makefile and .ci/run. Do not edit: re-run the script.
export LIBTORCH="$LIBTORCH_DIR/torch"
export LIBTORCH_CXX11_ABI=1
export LD_LIBRARY_PATH="$LIBTORCH_DIR/torch/lib${CUDA_LIBS:+:$CUDA_LIBS}\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export OMP_WAIT_POLICY=PASSIVE
# The checkout whose assets (sandbox component, sdk, configs, peer scripts, .venv-ref) the host
# binary and the tests use; an installed host finds them in its prefix or its home instead.
export RLHOST_SOURCE="$ROOT"
ENV
mv "$tmp_env" "$ENV_FILE"
say "done: source $ENV_FILE (the Makefile does this for you)"
