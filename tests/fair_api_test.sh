#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# examples/api-server with a fair rule (key = fair, docs/fair.md): one
# upstream budget of 10 (it does not refill during the test) shared by
# every caller.  A light caller that asked once keeps its reserve while a
# heavy one sends 20 requests: the heavy one gets 7 (its first requests
# count as light until it asks past its share, and an eighth of the
# budget is kept for light callers), the light one its second request
# too; with key = shared (first come, first served) the heavy one takes
# 9 and the light one's second request is refused.
#   fair_api_test.sh API_SERVER
set -euo pipefail

SERVER=$1
command -v curl >/dev/null || { echo "fair_api_test: curl is missing (scripts/deps.sh test)"; exit 1; }
tmp=$(mktemp -d /tmp/fair_api_test.XXXXXX)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
# shellcheck source=api_lib.sh
. "$(dirname "$0")/api_lib.sh"
get() { curl -s -o /dev/null -w '%{http_code}' -H "X-API-Key: $1" "$base/upstream"; }

conf() { # conf KEYKIND
  cat >"$tmp/rules.conf" <<EOT
[policies]
off = unlimited
upstream = token-bucket 10/1d burst=10

[rule gold]
group = tier
match = api_key=gold-*
weight = 4
policy = off

[rule any]
group = tier
policy = off

[rule upstream]
group = route
match = route=/upstream*
policy = upstream
key = $1
EOT
}

run() { # run KEYKIND: prints "HEAVY_ADMITTED LIGHT_SECOND_STATUS"
  conf "$1"
  start "$tmp/rules.conf"
  expect "$1: light, first" "$(get light)" 200
  local n=0
  for _ in $(seq 1 20); do
    [ "$(get heavy)" = 200 ] && n=$((n + 1))
  done
  echo "$n $(get light)"
  stop
}

expect "key = fair" "$(run fair)" "7 200"
expect "key = shared" "$(run shared)" "9 429"
# the example's own file takes the fair rule and the tier weights too
grep -q '^key = fair' "$(dirname "$0")/../examples/api-server/example.conf" ||
  fail "example.conf has no fair rule"
start "$(dirname "$0")/../examples/api-server/example.conf"
expect "example.conf: /upstream" "$(get pro-key-1)" 200
stop

[ "$fails" = 0 ] && echo "fair_api: ok"
[ "$fails" = 0 ]
