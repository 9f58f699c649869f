#!/usr/bin/env bash
# The test step of `make test` (after fmt, clippy and the builds): every test of the workspace, the
# plugins' own unit tests and the Python SDK's tests. Each run goes on when an earlier one failed
# (cargo's --no-fail-fast too), so one failure never hides the rest; then scripts/test-summary.py
# prints one line (passed, failed, skipped, ignored) and, under CI=true, fails for a skip or an
# ignored test that .ci/allowed-skips.toml does not list. Exits non-zero when anything failed.
#
# Tests that skip (a missing reference venv, say) write why to $RLHOST_SKIP_LOG, since cargo hides
# the output of passing tests. Expects the env file sourced (the Makefile does).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
TARGET_DIR=$(realpath -m "${CARGO_TARGET_DIR:-target}")
mkdir -p "$TARGET_DIR"
LOG="$TARGET_DIR/test-output.log"
export RLHOST_SKIP_LOG="$TARGET_DIR/skipped-tests.txt"
: >"$LOG"
: >"$RLHOST_SKIP_LOG"
status=0

cargo test --release --workspace --no-fail-fast 2>&1 | tee -a "$LOG" || status=1
# The plugins' own unit tests, on the host target (plugins/target, like scripts/build-plugins.sh).
# Without the workspace's lint wrapper (the Makefile's LINT_ENV): the plugins' own lints run by
# `make clippy`, for their target.
(cd plugins && unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS && CARGO_TARGET_DIR=target cargo test --release --workspace --no-fail-fast \
  --target "$(rustc -vV | sed -n 's/^host: //p')") 2>&1 | tee -a "$LOG" || status=1
# The Python SDK's own tests, with plain CPython (unittest prints "Ran N tests" and "OK"/"FAILED").
python3 -m unittest discover -s sdk/python/tests 2>&1 | tee -a "$LOG" || status=1

python3 scripts/test-summary.py "$LOG" "$RLHOST_SKIP_LOG" .ci/allowed-skips.toml || status=1
exit $status
