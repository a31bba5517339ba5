#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A policy change through the command never resets a key: `ratelimit check`
# on one key of a private redis-server, 20 calls at 1/m alternating
# --burst 3 and --burst 4, admits at most the more generous bound (4, plus
# one per minute the run takes); the same 20 calls with one policy admit 3.
# Usage: carry_cli_test.sh RATELIMIT_BINARY
set -u
R=$1
T=$(mktemp -d)
rpid=""
cleanup() {
  if [ -n "$rpid" ]; then kill "$rpid" 2>/dev/null; wait "$rpid" 2>/dev/null; fi
  rm -rf "$T"
}
trap cleanup EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  echo "FAIL: redis-server is not installed (scripts/deps.sh installs it)"
  exit 1
fi

# A private server on a free port (a few tries), stopped by its PID.
. "$(dirname "$0")/lib/servers.sh"
start_redis "$T/redis.log"
if [ -z "$rpid" ]; then
  echo "FAIL: could not start a private redis-server"
  exit 1
fi
S="redis://127.0.0.1:$rport/0"

# check KEY BURST: one call; prints allow, deny or error
check() {
  local out rc
  out=$("$R" check --store "$S" --key "$1" --algorithm token-bucket \
        --rate 1/m --burst "$2" 2>"$T/err")
  rc=$?
  case "$rc:$(printf '%s\n' "$out" | head -1)" in
    "0:decision allow") echo allow ;;
    "1:decision deny") echo deny ;;
    *) echo "error rc=$rc $(cat "$T/err")" ;;
  esac
}

# run KEY BURST...: 20 calls cycling through the bursts; prints the number
# admitted, and the run's seconds on the second line
run() {
  local key=$1; shift
  local bursts=("$@") n=0 i v start
  start=$(date +%s)
  for i in $(seq 0 19); do
    v=$(check "$key" "${bursts[$((i % ${#bursts[@]}))]}")
    case "$v" in
      allow) n=$((n + 1)) ;;
      deny) ;;
      *) bad "call $i on $key: $v" ;;
    esac
  done
  echo "$n"
  echo $(($(date +%s) - start + 1))
}

# one policy: 3 of 20
{ read -r one; read -r _; } < <(run one 3)
if [ "$one" = 3 ]; then ok; else bad "one policy (--burst 3) admitted $one of 20, want 3"; fi

# alternating --burst 3 and --burst 4: the state carries (3 -> 2, min(2,4)
# = 2 -> 1, 1 -> 0: 3 admitted), never more than burst 4 + 1/m over the run
{ read -r alt; read -r secs; } < <(run alt 3 4)
bound=$((4 + secs / 60))
if [ "$alt" -le "$bound" ]; then ok
else bad "alternating --burst 3 and --burst 4 admitted $alt of 20, bound $bound"; fi
if [ "$alt" = 3 ]; then ok; else bad "alternating --burst 3 and --burst 4 admitted $alt of 20, the rule says 3"; fi

# starting with the larger burst: 4 -> 3, min(3,3) -> 2, 1, 0: 4 admitted
{ read -r alt4; read -r secs; } < <(run alt4 4 3)
bound=$((4 + secs / 60))
if [ "$alt4" -le "$bound" ] && [ "$alt4" = 4 ]; then ok
else bad "alternating --burst 4 and --burst 3 admitted $alt4 of 20, want 4 (bound $bound)"; fi

# the records the calls left: one per policy, under the command's prefix
n=$(redis-cli -p "$rport" --scan --pattern 'ratelimit:p{*}' | wc -l)
if [ "$n" = 2 ]; then ok; else bad "$n policy records in Redis, want 2"; fi

echo "carry-cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
