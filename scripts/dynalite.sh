#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Installs dynalite (an implementation of DynamoDB's API in Node, in
# memory), the npm package the DynamoDB store's tests run against, into
# build/npm under the source tree (never globally), when it is missing.
#   scripts/dynalite.sh          install it if missing; print its path
#   scripts/dynalite.sh check    install nothing; exit 1 if missing
# Needs node (scripts/deps.sh test installs Debian's nodejs) and curl.  It
# uses the npm on the PATH when there is one; otherwise it fetches npm's own
# release tarball (npm@NPM_VERSION, checked against its published sha512)
# from the npm registry into build/npm/npm and runs that: Debian's npm
# package would pull in about 365 more packages for this one tool (dynalite
# needs no compiler: its one native part, leveldown, is optional and ships
# prebuilt).  When the registry cannot be reached: under CI=true that fails
# (exit 1), else it says so and exits 0, and the DynamoDB tests are skipped.
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
command -v node >/dev/null 2>&1 || fail "no node (scripts/deps.sh test installs nodejs)"
mkdir -p "$prefix"
if command -v npm >/dev/null 2>&1; then
  npm=(npm)
else
  # npm's own tarball: npm 10 is the last to run on Debian 12's node 18.
  npm_version=10.9.2
  npm_sha512=iriPEPIkoMYUy3F6f3wwSZAU93E0Eg6cHwIR6jzzOXWSy+SD/rOODEs74cVONHKSx2obXtuUoyidVEhISrisgQ==
  npm_dir="$prefix/npm-$npm_version"
  if [ ! -f "$npm_dir/bin/npm-cli.js" ]; then
    command -v curl >/dev/null 2>&1 || fail "no npm and no curl to fetch it (scripts/deps.sh test installs curl)"
    tgz="$prefix/npm-$npm_version.tgz"
    echo "dynalite: no npm here: fetching npm $npm_version's tarball from the npm registry" >&2
    curl -fsSL --retry 2 --max-time 120 -o "$tgz" \
      "https://registry.npmjs.org/npm/-/npm-$npm_version.tgz" || fail "cannot fetch npm's tarball"
    got=$(openssl dgst -sha512 -binary "$tgz" | base64 -w0) || fail "cannot hash npm's tarball (openssl)"
    [ "$got" = "$npm_sha512" ] || { rm -f "$tgz"; fail "npm's tarball does not match its published sha512"; }
    rm -rf "$npm_dir" && mkdir -p "$npm_dir"
    tar -xzf "$tgz" -C "$npm_dir" --strip-components=1 || fail "cannot unpack npm's tarball"
    rm -f "$tgz"
  fi
  npm=(node "$npm_dir/bin/npm-cli.js")
fi
echo "dynalite: ${npm[*]} install --prefix $prefix dynalite@$version" >&2
"${npm[@]}" install --prefix "$prefix" --no-audit --no-fund --no-save --loglevel=error \
  --fetch-retries=2 --fetch-timeout=60000 \
  "dynalite@$version" >&2 || fail "npm install failed"
[ -x "$bin" ] || fail "npm installed no $bin"
echo "$bin"
