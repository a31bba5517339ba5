#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `ratelimit replay --store redis://` gives the memory store's output byte
# for byte on a private redis-server with ratelimit.so loaded (and the
# decisions were the module's: INFO commandstats counts RATELIMIT.STEP
# calls), and after MODULE UNLOAD (the scripts'), for every vector.
# Usage: module_cli_test.sh RATELIMIT_BINARY VECTOR_DIR RATELIMIT_SO
set -u
R=$1 V=$2 SO=$3
T=$(mktemp -d)
rpid=""
cleanup() {
  if [ -n "$rpid" ]; then kill "$rpid" 2>/dev/null; wait "$rpid" 2>/dev/null; fi
  rm -rf "$T"
}
trap cleanup EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

command -v redis-server >/dev/null || { echo "no redis-server"; exit 1; }
# shellcheck source=lib/servers.sh
. "$(dirname "$0")/lib/servers.sh"
start_redis "$T/redis.log" --loadmodule "$SO" --enable-module-command yes
[ -n "$rpid" ] || { echo "could not start redis-server with $SO"; cat "$T/redis.log"; exit 1; }

calls() { # RATELIMIT.STEP calls so far
  redis-cli -p "$rport" info commandstats |
    sed -n 's/^cmdstat_ratelimit\.step:calls=\([0-9]*\),.*/\1/p' | tr -d '\r'
}
for pass_name in module scripts; do
  for args in "$V"/*.args; do
    n=$(basename "$args" .args)
    before=$(calls); before=${before:-0}
    # shellcheck disable=SC2046
    "$R" replay $(cat "$args") --store memory "$V/$n.trace" >"$T/mem" 2>/dev/null
    # shellcheck disable=SC2046
    if "$R" replay $(cat "$args") --store "redis://127.0.0.1:$rport/0" \
         "$V/$n.trace" >"$T/out" 2>"$T/err" && cmp -s "$T/out" "$T/mem" &&
       cmp -s "$T/out" "$V/$n.out"
    then ok; else bad "replay --store redis:// ($pass_name) vector $n"; head -3 "$T/err"; fi
    after=$(calls); after=${after:-0}
    if [ "$pass_name" = module ]; then
      if [ "$after" -gt "$before" ]; then ok
      else bad "vector $n: no RATELIMIT.STEP call with the module loaded"; fi
    fi
  done
  redis-cli -p "$rport" module unload ratelimit >/dev/null
done
if [ "$(redis-cli -p "$rport" dbsize)" = 0 ]; then ok
else bad "keys left behind: $(redis-cli -p "$rport" dbsize)"; fi
echo "module_cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
