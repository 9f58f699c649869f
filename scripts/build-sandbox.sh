#!/usr/bin/env bash
# Builds the Python sandbox guest: CPython 3.14 for WASI (inside PyPI's componentize-py wheel) with
# sympy and mpmath pre-imported into the component's memory snapshot. Output:
# sandbox/target/python-sandbox.wasm. Everything comes from pinned PyPI packages; the result is
# cached in ~/.cache/rlhost/sandbox keyed by a hash of every input, so a rebuild is a copy.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/rlhost"
PYTHON=${PYTHON:-python3}

# shellcheck source=lib/componentize-py.sh
source "$ROOT/scripts/lib/componentize-py.sh"
SYMPY=1.14.0
MPMATH=1.3.0   # sympy 1.14 requires mpmath < 1.4

SRC="$ROOT/sandbox/python"
OUT="$ROOT/sandbox/target/python-sandbox.wasm"
KEY=$( (echo "$COMPONENTIZE_PY $SYMPY $MPMATH"; cat "$SRC/app.py" "$SRC/runner.py" "$SRC/wit/sandbox.wit" "$0") \
  | sha256sum | cut -c1-16)
CACHED="$CACHE/sandbox/python-sandbox-$KEY.wasm"

say() { printf '==> %s\n' "$*"; }

if [ -f "$CACHED" ]; then
  say "python sandbox component: cached ($CACHED)"
else
  ensure_componentize_py
  SITE="$CACHE/sandbox/site-sympy-$SYMPY-mpmath-$MPMATH"
  if [ ! -f "$SITE/.complete" ]; then
    say "installing sympy $SYMPY and mpmath $MPMATH (pure Python) into $SITE"
    rm -rf "$SITE.tmp.$$"
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps --target "$SITE.tmp.$$" \
      "sympy==$SYMPY" "mpmath==$MPMATH"
    touch "$SITE.tmp.$$/.complete"
    rm -rf "$SITE" && mv "$SITE.tmp.$$" "$SITE"
  fi
  say "building the python sandbox component (pre-imports all of sympy; about a minute)"
  mkdir -p "$CACHE/sandbox"
  tmp="$CACHED.tmp.$$"
  (cd "$SRC" && "$COMPONENTIZE_PY_BIN" -d wit -w sandbox componentize app \
    -p . -p "$SITE" -o "$tmp")
  mv "$tmp" "$CACHED"
fi

mkdir -p "$(dirname "$OUT")"
cp "$CACHED" "$OUT.tmp.$$" && mv "$OUT.tmp.$$" "$OUT"
say "python sandbox component: $OUT ($(du -h "$OUT" | cut -f1))"
