#!/usr/bin/env bash
# Publishes the first-party plugins (built by scripts/build-plugins.sh) to the default local
# registry, $RLHOST_HOME/registry (default ~/.rlhost/registry), signed with a local publisher key
# kept in $RLHOST_HOME/keys/local-publisher.key; both are created on first use. Afterwards
# `host env install rlhost/arith` works on this machine with no flags.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HOST=${HOST:-$ROOT/target/release/host}
HOME_DIR=${RLHOST_HOME:-$HOME/.rlhost}
REGISTRY="$HOME_DIR/registry"
KEY="$HOME_DIR/keys/local-publisher.key"
DIST="$ROOT/plugins/target/dist"
PACKAGES="$ROOT/plugins/target/packages"

say() { printf '==> %s\n' "$*"; }

[ -f "$REGISTRY/config.json" ] || "$HOST" registry init --root "$REGISTRY" >/dev/null
if [ ! -f "$KEY" ]; then
  say "creating the local publisher key $KEY"
  "$HOST" registry keygen --out "$KEY" >/dev/null
fi
for owner in rlhost will; do
  "$HOST" registry add-key --root "$REGISTRY" --owner "$owner" --key-file "$KEY" >/dev/null
done
mkdir -p "$PACKAGES"
for plugin in arith arith-tools exact-match math-verify math-python math500 aime2024 aime2025 deepscaler \
  arith-tools-extism exact-match-extism arith-tools-python exact-match-python reverse-text; do
  pkg="$PACKAGES/$plugin.rlpkg"
  "$HOST" env pack "$DIST/$plugin" -o "$pkg" >/dev/null
  if out=$("$HOST" env publish "$pkg" --key "$KEY" --registry "file://$REGISTRY" 2>&1); then
    say "$out"
  elif grep -q "already published with different bytes" <<<"$out"; then
    # A rebuild of an unchanged version: the registry keeps the first bytes (versions are
    # immutable). Bump the plugin's version to publish the new build.
    say "kept the published $plugin: this build differs but has the same version"
  else
    echo "$out" >&2
    exit 1
  fi
done
