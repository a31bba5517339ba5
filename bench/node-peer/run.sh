#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs the Node peer (peer.js) after installing its two packages with npm
# into a directory outside the sources, once: $NODE_PEER_DIR, by default
# build/node-peer beside them (ignored by git; never made by make test).
#   bench/node-peer/run.sh HOST PORT N KEYS DEPTH
# Used by: ratelimit bench --redis URL --workload --node-peer bench/node-peer/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${NODE_PEER_DIR:-$here/../../build/node-peer}
command -v node >/dev/null && command -v npm >/dev/null ||
  { echo "node-peer: node and npm are needed (apt-get install nodejs npm)" >&2; exit 1; }
mkdir -p "$dir"
if ! cmp -s "$here/package.json" "$dir/package.json" || [ ! -d "$dir/node_modules" ]; then
  cp "$here/package.json" "$dir/package.json"
  (cd "$dir" && npm install --no-audit --no-fund --loglevel=error >&2)
fi
cp "$here/peer.js" "$dir/peer.js"
exec node "$dir/peer.js" "$@"
