#!/usr/bin/env bash
# The GPU bundle's `rlhost` (copied there by scripts/gpu-bundle.sh): runs the bundle's `host`
# against the PyTorch installed on this machine.
#
#   ./rlhost doctor            any host command
#
# - torch: the one `$RLHOST_PYTHON` (default: python3) imports, located without importing it (its
#   CUDA wheels need not load for this); its release must be the one the bundle was built against
#   (MANIFEST.json), since each tch release accepts exactly one libtorch.
# - the payload (host, tokenizer, registry) is unpacked once into $RLHOST_BUNDLE_CACHE (default:
#   $TMPDIR/rlhost-bundle, outside the bundle so the bundle stays small enough to carry), again
#   whenever the payload changes.
# - torch's lib folder goes on LD_LIBRARY_PATH; libtorch_cuda.so finds cuBLAS, cuDNN, NCCL... in
#   site-packages/nvidia through its own RPATH, as `import torch` does.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${RLHOST_PYTHON:-python3}
fail() { echo "rlhost bundle: $*" >&2; exit 1; }

WANT=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["torch"])' "$HERE/MANIFEST.json" 2>/dev/null) \
  || fail "cannot read $HERE/MANIFEST.json with $PY"
TORCH_DIR=$("$PY" -c 'import importlib.util as u; s = u.find_spec("torch"); print(s.submodule_search_locations[0] if s else "")') \
  || fail "$PY does not run"
[ -n "$TORCH_DIR" ] || fail "$PY has no torch package (set RLHOST_PYTHON to the interpreter that has PyTorch $WANT)"
HAVE=$(sed -n "s/^__version__ = '\(.*\)'/\1/p" "$TORCH_DIR/version.py")
[ "${HAVE%%+*}" = "$WANT" ] \
  || fail "this bundle was built against PyTorch $WANT, but $PY has $HAVE ($TORCH_DIR): rebuild it with GPU_TORCH_VERSION=${HAVE%%+*} make gpu-bundle (supported: scripts/build-for-torch.sh)"

GLIBC=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("needs_glibc", "0"))' "$HERE/MANIFEST.json")
HAVE_GLIBC=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
if [ -n "$HAVE_GLIBC" ] && [ "$(printf '%s\n%s\n' "$GLIBC" "$HAVE_GLIBC" | sort -V | head -1)" != "$GLIBC" ]; then
  fail "this bundle's host needs glibc $GLIBC or newer; this machine has $HAVE_GLIBC"
fi

DEST=${RLHOST_BUNDLE_CACHE:-${TMPDIR:-/tmp}/rlhost-bundle}
STAMP=$(cksum <"$HERE/payload.tar.gz" | cut -d' ' -f1)
if [ "$(cat "$DEST/.payload" 2>/dev/null)" != "$STAMP" ]; then
  tmp="$DEST.tmp.$$"
  rm -rf "$tmp" && mkdir -p "$tmp"
  tar -C "$tmp" -xzf "$HERE/payload.tar.gz"
  echo "$STAMP" >"$tmp/.payload"
  rm -rf "$DEST" && mv "$tmp" "$DEST"
fi

export LD_LIBRARY_PATH="$TORCH_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
# Assets the host looks for in a source tree: the peer scripts shipped beside this file.
export RLHOST_SOURCE=${RLHOST_SOURCE:-$HERE}
export RLHOST_BUNDLE_DIR="$DEST"
exec "$DEST/host" "$@"
