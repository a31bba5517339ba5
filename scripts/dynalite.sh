#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Installs dynalite (an implementation of DynamoDB's API in Node, in
# memory), the npm package the DynamoDB store's tests run against, into
# build/npm under the source tree (never globally), when it is missing.
#   scripts/dynalite.sh          install it if missing; print its path
#   scripts/dynalite.sh check    install nothing; exit 1 if missing
# Needs node and npm (scripts/deps.sh test installs them).  When the npm
# registry cannot be reached: under CI=true that fails (exit 1), else it
# says so and exits 0, and the DynamoDB tests are skipped.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
prefix="$root/build/npm"
bin="$prefix/node_modules/.bin/dynalite"
version="3.2.2"

if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
if [ "${1:-}" = check ]; then
  echo "dynalite: not installed in $prefix (run scripts/dynalite.sh)" >&2
  exit 1
fi
fail() {
  if [ "${CI:-}" = true ]; then
    echo "dynalite: $* (CI=true: the DynamoDB tests cannot be skipped)" >&2
    exit 1
  fi
  echo "dynalite: $*; the DynamoDB tests will be skipped" >&2
  exit 0
}
command -v npm >/dev/null 2>&1 || fail "no npm (scripts/deps.sh test installs nodejs and npm)"
mkdir -p "$prefix"
echo "dynalite: npm install --prefix $prefix dynalite@$version" >&2
npm install --prefix "$prefix" --no-audit --no-fund --no-save --loglevel=error \
  --fetch-retries=2 --fetch-timeout=60000 \
  "dynalite@$version" >&2 || fail "npm install failed"
[ -x "$bin" ] || fail "npm installed no $bin"
echo "$bin"
