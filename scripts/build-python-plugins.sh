#!/usr/bin/env bash
# Builds the Python plugins with `host env build` (the rlhost_env SDK + componentize-py): the SDK's
# examples (sdk/python/examples/*) and the runtime's Python fixtures, and assembles their plugin
# folders under plugins/target/dist/ (prebuilt: the [python] table is dropped, the datasets the
# manifest declares are copied from the offline data folder). Also builds the wrong-ABI fixture:
# the hostile fixture compiled against a copy of the WIT world renumbered 9.0.0.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/rlhost"
HOST=${HOST:?set HOST to the host binary}
DIST="$ROOT/plugins/target/dist"

# shellcheck source=lib/componentize-py.sh
source "$ROOT/scripts/lib/componentize-py.sh"
ensure_componentize_py
export RLHOST_COMPONENTIZE_PY="$COMPONENTIZE_PY_BIN"

say() { printf '==> %s\n' "$*"; }

# assemble NAME SRC: builds SRC and writes plugin folder NAME (tmp + rename).
assemble() {
  local name=$1 src=$2
  local out="$DIST/$name" tmp="$DIST/.$name.tmp.$$"
  "$HOST" env build "$src" | sed 's/^/    /'
  rm -rf "$tmp" && mkdir -p "$tmp"
  # A prebuilt folder: no [python] table (nothing left to build), the component, the data.
  awk '/^\[python\]/ {skip = 1; next} /^\[/ {skip = 0} !skip' "$src/plugin.toml" >"$tmp/plugin.toml"
  cp "$src/plugin.wasm" "$tmp/plugin.wasm"
  if [ -f "$src/README.md" ]; then cp "$src/README.md" "$tmp/README.md"; fi
  if [ -d "$src/data" ]; then cp -r "$src/data" "$tmp/data"; fi
  python3 "$ROOT/scripts/pack-datasets.py" "$src/plugin.toml" "$tmp/data"
  rm -rf "$out" && mv "$tmp" "$out"
  echo "    $out ($(du -h "$out/plugin.wasm" | cut -f1))"
}

say "building the Python plugins (componentize-py $COMPONENTIZE_PY)"
mkdir -p "$DIST"
assemble arith-tools-python "$ROOT/sdk/python/examples/arith_tools"
assemble reverse-text "$ROOT/sdk/python/examples/reverse_text"
assemble exact-match-python "$ROOT/sdk/python/examples/exact_match"
assemble fixture-python-hostile "$ROOT/plugins/fixtures-python/hostile"

# The wrong-ABI fixture, cached by its inputs.
FIXTURE="$ROOT/plugins/fixtures-python/hostile"
KEY=$( (echo "$COMPONENTIZE_PY"; cat "$ROOT/sdk/wit/v0.1.0/env.wit" "$FIXTURE/hostile.py" \
  "$ROOT"/sdk/python/rlhost_env/*.py "$0") | sha256sum | cut -c1-16)
CACHED="$CACHE/python-fixtures/future-abi-$KEY.wasm"
if [ ! -f "$CACHED" ]; then
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/wit" "$stage/src" "$CACHE/python-fixtures"
  sed 's/^package rlhost:env@0\.1\.0;/package rlhost:env@9.0.0;/' "$ROOT/sdk/wit/v0.1.0/env.wit" >"$stage/wit/env.wit"
  grep -q '^package rlhost:env@9.0.0;' "$stage/wit/env.wit"
  cp "$FIXTURE/hostile.py" "$stage/src/"
  cp -r "$ROOT/sdk/python/rlhost_env" "$stage/src/"
  printf 'import hostile as _plugin\nfrom rlhost_env import _component\n\nEnv = _component.environment_export(_plugin.load_environment)\n' >"$stage/src/app.py"
  (cd "$stage" && "$COMPONENTIZE_PY_BIN" -d wit -w environment componentize app -p src -o "$CACHED.tmp.$$" >/dev/null)
  mv "$CACHED.tmp.$$" "$CACHED"
fi
out="$DIST/fixture-python-future-abi"
rm -rf "$out.tmp.$$" && mkdir -p "$out.tmp.$$"
sed -e 's/^name = "python-hostile"/name = "python-future-abi"/' "$FIXTURE/plugin.toml" \
  | awk '/^\[python\]/ {skip = 1; next} /^\[/ {skip = 0} !skip' >"$out.tmp.$$/plugin.toml"
cp "$CACHED" "$out.tmp.$$/plugin.wasm"
rm -rf "$out" && mv "$out.tmp.$$" "$out"
echo "    $out"
