#!/usr/bin/env bash
# Builds the Extism plugins written in AssemblyScript (plugins/extism/): the arith-tools and
# exact-match examples and the runtime's hostile fixtures, with the AssemblyScript compiler and the Extism PDK from npm
# (pinned in plugins/extism/package-lock.json; installed once into ~/.cache/rlhost/npm), and
# assembles their plugin folders under plugins/target/dist/.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/rlhost"
SRC="$ROOT/plugins/extism"
DIST="$ROOT/plugins/target/dist"

say() { printf '==> %s\n' "$*"; }

command -v npm >/dev/null || { echo "error: npm (Node.js) is needed to build the AssemblyScript plugins; run scripts/setup.sh" >&2; exit 1; }

KEY=$(cat "$SRC/package.json" "$SRC/package-lock.json" | sha256sum | cut -c1-16)
MODULES="$CACHE/npm/extism-$KEY"
if [ ! -f "$MODULES/.complete" ]; then
  say "installing the AssemblyScript compiler and the Extism PDK into $MODULES"
  tmp="$MODULES.tmp.$$"
  rm -rf "$tmp" && mkdir -p "$tmp"
  cp "$SRC/package.json" "$SRC/package-lock.json" "$tmp/"
  (cd "$tmp" && npm ci --no-audit --no-fund --loglevel=error)
  touch "$tmp/.complete"
  rm -rf "$MODULES" && mv "$tmp" "$MODULES"
fi
# asc resolves imports through the node_modules folder beside the sources (git-ignored).
ln -sfn "$MODULES/node_modules" "$SRC/node_modules"

# build NAME DIR: compiles DIR/index.ts and assembles plugin folder NAME (tmp + rename).
build() {
  local name=$1 dir=$2
  local out="$DIST/$name" tmp="$DIST/.$name.tmp.$$"
  rm -rf "$tmp" && mkdir -p "$tmp"
  (cd "$SRC" && node_modules/.bin/asc "$dir/index.ts" --outFile "$tmp/plugin.wasm" \
    --optimize --runtime incremental --use "abort=$dir/index/abort")
  cp "$SRC/$dir/plugin.toml" "$tmp/plugin.toml"
  if [ -f "$SRC/$dir/README.md" ]; then cp "$SRC/$dir/README.md" "$tmp/README.md"; fi
  if [ -d "$SRC/$dir/data" ]; then cp -r "$SRC/$dir/data" "$tmp/data"; fi
  rm -rf "$out" && mv "$tmp" "$out"
  echo "    $out ($(du -h "$out/plugin.wasm" | cut -f1))"
}

say "building the Extism plugins (AssemblyScript)"
mkdir -p "$DIST"
build arith-tools-extism arith-tools
build exact-match-extism exact-match
build fixture-extism-hostile fixtures/hostile
build fixture-extism-future-abi fixtures/future-abi
