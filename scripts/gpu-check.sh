#!/usr/bin/env bash
# The GPU check: one command that proves inference and GRPO on a GPU machine and measures them
# against transformers on the same GPU, writing $OUT/gpu-report.md, $OUT/gpu-report.json and
# $OUT/gpu-check.log (docs/gpu.md says how it runs and keeps the dated reports).
#
#   bash target/gpu-bundle/gpu-check.sh          from the bundle (make gpu-bundle), on the GPU box
#   bash scripts/gpu-check.sh                    the same, from a checkout holding target/gpu-bundle
#   bash scripts/gpu-check.sh --cpu              the same steps on this CPU at small sizes: proves
#                                                the bundle (ABI, launcher, payload) and the script
#                                                here before any GPU time is spent
#
# Python: $RLHOST_PYTHON, else /opt/torch/.venv/bin/python3 when it exists (the GPU machines'
# PyTorch), else python3. Its torch is the one the bundle runs against, and its transformers is
# the peer. Everything else: scripts/gpu-check.py --help.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -x "$HERE/rlhost" ] && [ -f "$HERE/payload.tar.gz" ]; then
  BUNDLE=$HERE
else
  BUNDLE=${RLHOST_GPU_BUNDLE:-$HERE/../target/gpu-bundle}
fi
[ -x "$BUNDLE/rlhost" ] || { echo "gpu-check.sh: no bundle at $BUNDLE: run make gpu-bundle" >&2; exit 1; }
if [ -z "${RLHOST_PYTHON:-}" ]; then
  if [ -x /opt/torch/.venv/bin/python3 ]; then RLHOST_PYTHON=/opt/torch/.venv/bin/python3; else RLHOST_PYTHON=python3; fi
fi
export RLHOST_PYTHON
exec "$RLHOST_PYTHON" "$BUNDLE/gpu-check.py" --bundle "$BUNDLE" "$@"
