#!/usr/bin/env bash
# Builds the first-party plugins and the runtime's test fixtures (plugins/, a workspace of its
# own) as WebAssembly components, plus native builds of the crates that need one, and assembles
# loadable plugin folders (plugin.toml + artifact + data/) under plugins/target/dist/.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT/plugins"
# The host's tests look for the built plugins here, whatever CARGO_TARGET_DIR the caller uses.
export CARGO_TARGET_DIR="$ROOT/plugins/target"

HOST_TRIPLE=$(rustc -vV | sed -n 's/^host: //p')
echo "==> building plugins for wasm32-wasip2"
cargo build --release
echo "==> building native plugins for $HOST_TRIPLE"
cargo build --release --target "$HOST_TRIPLE" -p arith -p exact-match -p math-verify -p fixture-native-bad-abi

WASM=target/wasm32-wasip2/release
NATIVE=target/$HOST_TRIPLE/release
DIST=target/dist

# assemble NAME ARTIFACT RUNTIME: one plugin folder, written atomically (tmp + rename).
assemble() {
  local name=$1 artifact=$2 runtime=$3 src=${4:-$1}
  local out="$DIST/$name" tmp="$DIST/.$name.tmp.$$"
  rm -rf "$tmp" && mkdir -p "$tmp"
  if [ "$runtime" = wasm ]; then
    cp "$src/plugin.toml" "$tmp/plugin.toml"
    cp "$artifact" "$tmp/plugin.wasm"
  else
    sed 's/^runtime = "wasm"/runtime = "native"/' "$src/plugin.toml" >"$tmp/plugin.toml"
    cp "$artifact" "$tmp/plugin.so"
  fi
  if [ -d "$src/data" ]; then cp -r "$src/data" "$tmp/data"; fi
  # The README the registry's page shows (`host env pack` packs it).
  if [ -f "$src/README.md" ]; then cp "$src/README.md" "$tmp/README.md"; fi
  python3 "$ROOT/scripts/pack-datasets.py" "$src/plugin.toml" "$tmp/data"
  rm -rf "$out" && mv "$tmp" "$out"
  echo "    $out"
}

echo "==> assembling plugin folders in plugins/$DIST"
mkdir -p "$DIST"
assemble arith "$WASM/arith.wasm" wasm
assemble arith-native "$NATIVE/libarith.so" native arith
assemble arith-tools "$WASM/arith_tools.wasm" wasm
assemble exact-match "$WASM/exact_match.wasm" wasm
assemble exact-match-native "$NATIVE/libexact_match.so" native exact-match
assemble math-verify "$WASM/math_verify.wasm" wasm
assemble math-verify-native "$NATIVE/libmath_verify.so" native math-verify
assemble math-python "$WASM/math_python.wasm" wasm
assemble math500 "$WASM/math500.wasm" wasm
assemble aime2024 "$WASM/aime2024.wasm" wasm
assemble aime2025 "$WASM/aime2025.wasm" wasm
assemble deepscaler "$WASM/deepscaler.wasm" wasm
# Test fixture: an environment scored by the reward plugin it declares (not published).
assemble fixture-judged "$WASM/fixture_judged.wasm" wasm fixtures/judged

# Extism plugins (AssemblyScript, from npm) and Python plugins (the rlhost_env SDK).
bash "$ROOT/scripts/build-extism-plugins.sh"
bash "$ROOT/scripts/build-python-plugins.sh"
