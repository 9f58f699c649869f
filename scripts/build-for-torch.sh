#!/usr/bin/env bash
# Build `host` against a PyTorch that is already installed (a user's GPU box, the GPU machines'
# image) instead of the libtorch scripts/setup.sh installs.
#
#   scripts/build-for-torch.sh [--python PY] [--cuda] [--print-dir]
#
#   --python PY   the interpreter whose `torch` to build against (default: python3); torch is
#                 found without importing it, so a torch whose CUDA wheels are absent still works
#   --cuda        build with `--features cuda` (libtorch_cuda linked; the CUDA wheels that torch
#                 needs must be installed beside it, as `pip install torch` does)
#   --print-dir   print the folder the binary will be in and exit
#
# The binary goes to $CARGO_TARGET_DIR (default target/)/torch-<version>[-cuda]/release/host, with
# that torch's lib folder on its rpath.
#
# One tree, two torch versions: each tch release accepts exactly one libtorch (its build script
# checks `version.py`), so the torch version picks the tch version (table below). For the tch the
# workspace pins (0.26.0, torch 2.13.0) the workspace itself is built. For another one, an overlay
# workspace is made under target/: its Cargo.toml is the root one with only the tch and torch-sys
# pins changed, its members are symlinks to the real crates, and its Cargo.lock starts as a copy of
# the root one, so cargo changes nothing but those two packages (checked: anything else changing
# fails the build). The overlay's intermediate artifacts share the workspace's build folder, so
# only what depends on tch compiles again (torch-sys' C++, tch and rlhost: about 5
# minutes on 2 cores; 15 when everything compiled a second time); nothing in the code: the crate
# compiles unchanged against tch 0.24 and 0.26.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=python3
CUDA=0
PRINT_DIR=0
while [ $# -gt 0 ]; do
  case "$1" in
    --python) PYTHON=$2; shift 2 ;;
    --cuda) CUDA=1; shift ;;
    --print-dir) PRINT_DIR=1; shift ;;
    *) echo "build-for-torch.sh: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done

# The tch release that accepts each torch version (torch-sys' build script, TORCH_VERSION).
tch_for_torch() {
  case "$1" in
    2.13.0) echo 0.26.0 ;;
    2.11.0) echo 0.24.0 ;;
    *) return 1 ;;
  esac
}

TORCH_DIR=$("$PYTHON" - <<'PY'
import importlib.util, sys
spec = importlib.util.find_spec("torch")
if spec is None or not spec.submodule_search_locations:
    sys.exit("no `torch` package for this interpreter")
print(spec.submodule_search_locations[0])
PY
) || { echo "build-for-torch.sh: $PYTHON has no torch package" >&2; exit 1; }
FULL_VERSION=$(sed -n "s/^__version__ = '\(.*\)'/\1/p" "$TORCH_DIR/version.py")
VERSION=${FULL_VERSION%%+*}
TCH=$(tch_for_torch "$VERSION") || {
  echo "build-for-torch.sh: torch $FULL_VERSION ($TORCH_DIR) has no matching tch here; supported: 2.13.0 (tch 0.26.0), 2.11.0 (tch 0.24.0)" >&2
  exit 1
}
[ -f "$TORCH_DIR/lib/libtorch_cpu.so" ] || { echo "build-for-torch.sh: $TORCH_DIR/lib has no libtorch_cpu.so" >&2; exit 1; }
if [ "$CUDA" = 1 ] && [ ! -f "$TORCH_DIR/lib/libtorch_cuda.so" ]; then
  echo "build-for-torch.sh: --cuda, but torch $FULL_VERSION has no libtorch_cuda.so (a CPU build)" >&2
  exit 1
fi

NAME="torch-$VERSION$([ "$CUDA" = 1 ] && echo -cuda)"
# Under the caller's CARGO_TARGET_DIR when set (CI keeps its builds in a cache), else target/.
BASE=${CARGO_TARGET_DIR:-$ROOT/target}
export CARGO_TARGET_DIR="$BASE/$NAME"
# The intermediate artifacts go to the workspace's own build folder (cargo's build-dir): every
# crate that does not depend on tch (wasmtime, tokio, tokenizers... most of the build) is the
# same unit there as in the workspace's build and is reused, not compiled a second time. Only
# the binary lands in $CARGO_TARGET_DIR, so the workspace's target/release/host is untouched.
export CARGO_BUILD_BUILD_DIR="${CARGO_BUILD_BUILD_DIR:-$BASE}"
if [ "$PRINT_DIR" = 1 ]; then echo "$CARGO_TARGET_DIR/release"; exit 0; fi

WORKSPACE_TCH=$(sed -n 's/^tch = "=\(.*\)"/\1/p' "$ROOT/Cargo.toml")
if [ "$TCH" = "$WORKSPACE_TCH" ]; then
  WS=$ROOT
else
  WS="$BASE/$NAME/workspace"
  mkdir -p "$WS"
  for member in $(sed -n 's/^members = \[\(.*\)\]/\1/p' "$ROOT/Cargo.toml" | tr -d '",'); do
    ln -sfn "$ROOT/$member" "$WS/$member"
  done
  cp "$ROOT/rust-toolchain.toml" "$WS/"
  sed -e "s/^tch = \"=$WORKSPACE_TCH\"/tch = \"=$TCH\"/" \
      -e "s/^torch-sys = \"=$WORKSPACE_TCH\"/torch-sys = \"=$TCH\"/" \
      "$ROOT/Cargo.toml" >"$WS/Cargo.toml.tmp"
  grep -q "^tch = \"=$TCH\"" "$WS/Cargo.toml.tmp" || { echo "build-for-torch.sh: could not re-pin tch in the overlay" >&2; exit 1; }
  mv "$WS/Cargo.toml.tmp" "$WS/Cargo.toml"
  # Re-derive the lock only when the root one changed (its copy is kept as Cargo.lock.root), so an
  # unchanged tree rebuilds nothing.
  if ! cmp -s "$ROOT/Cargo.lock" "$WS/Cargo.lock.root" || [ ! -f "$WS/Cargo.lock" ]; then
    cp "$ROOT/Cargo.lock" "$WS/Cargo.lock.tmp"
    mv "$WS/Cargo.lock.tmp" "$WS/Cargo.lock"
    (cd "$WS" && cargo metadata --format-version 1 >/dev/null)
    cp "$ROOT/Cargo.lock" "$WS/Cargo.lock.root"
  fi
  # Only tch and torch-sys may differ from the root lock.
  packages() { awk '/^name = /{n=$3} /^version = /{print n, $3}' "$1" | grep -v '^"tch" \|^"torch-sys" ' | sort; }
  if ! diff <(packages "$ROOT/Cargo.lock") <(packages "$WS/Cargo.lock") >/dev/null; then
    echo "build-for-torch.sh: re-pinning tch $TCH changed other packages in Cargo.lock:" >&2
    diff <(packages "$ROOT/Cargo.lock") <(packages "$WS/Cargo.lock") >&2 || true
    exit 1
  fi
fi

export LIBTORCH="$TORCH_DIR" LIBTORCH_CXX11_ABI=1
unset LIBTORCH_USE_PYTORCH LIBTORCH_BYPASS_VERSION_CHECK
# libtorch_cuda.so's own libraries (cuBLAS, cuDNN, NCCL... in site-packages/nvidia) are found
# through its RPATH at run time; build.rs hands their folders to the linker (-rpath-link).
FEATURES=()
[ "$CUDA" = 1 ] && FEATURES=(--features cuda)
echo "==> host against torch $FULL_VERSION ($TORCH_DIR), tch $TCH$([ "$CUDA" = 1 ] && echo ', CUDA'): $CARGO_TARGET_DIR/release/host"
(cd "$WS" && cargo build --release --locked -p rlhost --bin host "${FEATURES[@]}")
