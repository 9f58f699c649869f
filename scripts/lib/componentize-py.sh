# Sourced by the build scripts: makes sure the pinned componentize-py (PyPI) is installed in
# $CACHE/componentize-py-$COMPONENTIZE_PY and sets COMPONENTIZE_PY_BIN. `host env build` finds
# the same tool through RLHOST_COMPONENTIZE_PY, so a machine installs it once.
COMPONENTIZE_PY=0.25.1
ensure_componentize_py() {
  local tools="$CACHE/componentize-py-$COMPONENTIZE_PY"
  if [ ! -x "$tools/bin/componentize-py" ]; then
    printf '==> installing componentize-py %s into %s\n' "$COMPONENTIZE_PY" "$tools"
    rm -rf "$tools.tmp.$$"
    "${PYTHON:-python3}" -m venv "$tools.tmp.$$"
    "$tools.tmp.$$/bin/python" -m pip install --quiet --disable-pip-version-check \
      "componentize-py==$COMPONENTIZE_PY"
    rm -rf "$tools" && mv "$tools.tmp.$$" "$tools"
    # The venv's scripts name their interpreter by path: point them at the final folder.
    grep -lIF "$tools.tmp.$$" "$tools"/bin/* "$tools/pyvenv.cfg" | xargs -r sed -i "s#$tools.tmp.$$#$tools#g"
  fi
  COMPONENTIZE_PY_BIN="$tools/bin/componentize-py"
}
