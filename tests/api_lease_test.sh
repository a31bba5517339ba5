#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# examples/api-server with an in-flight rule (docs/leases.md, "The rules
# file"): /slow under concurrency 3 (key = shared).  Three slow requests
# are held (counted by /metrics, a condition waited on, never a sleep);
# three more are refused at once with 429, Retry-After and the RateLimit
# fields, and the count stays 3; clients that hang up give their leases
# back while the work would still run; a finished request gives its back;
# two servers on one Redis (--store redis://) hold one limit between them;
# the example's own file holds 20.
#   api_lease_test.sh API_SERVER EXAMPLE_CONF
set -euo pipefail

SERVER=$1
EXAMPLE=$2
. "$(dirname "$0")/lib/servers.sh"
command -v curl >/dev/null || { echo "api_lease_test: curl is missing (scripts/deps.sh test)"; exit 1; }
tmp=$(mktemp -d /tmp/api_lease_test.XXXXXX)
pid=
pid_a=
pid_b=
rpid=
holders=()
cleanup() {
  local h
  for h in "${holders[@]}"; do kill "$h" 2>/dev/null || true; done
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  for h in $pid_a $pid_b; do kill "$h" 2>/dev/null || true; wait "$h" 2>/dev/null || true; done
  stop_pid "$rpid" || true
  rm -rf "$tmp"
}
trap cleanup EXIT
# shellcheck source=api_lib.sh
. "$(dirname "$0")/api_lib.sh"
metric() { # metric NAME_AND_LABELS: its value on /metrics
  curl -s "$base/metrics" | awk -v m="$1" '$1 == m { print $2 }'
}
held_is() { [ "$(metric ratelimit_leases_held)" = "$1" ]; }

cat >"$tmp/rules.conf" <<EOT
[policies]
three = concurrency 3 ttl=2m
open = unlimited

[rule slow]
group = route
match = route=/slow*
policy = three
key = shared

[rule any]
group = route
policy = open
EOT
start "$tmp/rules.conf"

# Three holders, each asking for a minute of work (curl killed below).
for i in 1 2 3; do
  curl -s -o "$tmp/held$i" -H "X-API-Key: u$i" "$base/slow?ms=60000" &
  holders+=($!)
done
wait_until "$TEST_WAIT_S" held_is 3 || fail "three requests never held (held: $(metric ratelimit_leases_held))"

# Three more, from other users: refused at once, the count stays 3.
for i in 4 5 6; do
  code=$(curl -s -D "$tmp/h$i" -o "$tmp/b$i" -w '%{http_code}' -H "X-API-Key: u$i" "$base/slow?ms=10")
  expect "request $i while 3 are held" "$code" 429
done
expect "Retry-After" "$(sed -n 's/^Retry-After: \([0-9]*\).*/\1/p' "$tmp/h4")" 120
grep -q '^RateLimit-Policy: "three";q=3' "$tmp/h4" || fail "no RateLimit-Policy q=3: $(cat "$tmp/h4")"
grep -q '^RateLimit: "three";r=0;t=' "$tmp/h4" || fail "no RateLimit r=0: $(cat "$tmp/h4")"
grep -q "has its 3 requests in flight" "$tmp/b4" || fail "problem body: $(cat "$tmp/b4")"
expect "held after the refusals" "$(metric ratelimit_leases_held)" 3
expect "denied" "$(metric 'ratelimit_leases_total{result="denied"}')" 3
# Other routes hold nothing and pass.
expect "another route" "$(curl -s -o /dev/null -w '%{http_code}' "$base/items")" 200

# The holders hang up, a minute before their work would end: their
# leases come back now.
for h in "${holders[@]}"; do kill "$h" 2>/dev/null || true; wait "$h" 2>/dev/null || true; done
holders=()
wait_until "$TEST_WAIT_S" held_is 0 || fail "leases of clients gone still held: $(metric ratelimit_leases_held)"
expect "releases after hang-ups" "$(metric 'ratelimit_lease_releases_total{result="ok"}')" 3

# A request that finishes: 200 with the fields, its lease back.
code=$(curl -s -D "$tmp/hf" -o /dev/null -w '%{http_code}' "$base/slow?ms=20")
expect "a short slow request" "$code" 200
grep -q '^RateLimit: "three";r=2;t=' "$tmp/hf" || fail "allowed fields: $(cat "$tmp/hf")"
wait_until "$TEST_WAIT_S" held_is 0 || fail "a finished request's lease still held"
expect "a bad ms" "$(curl -s -o /dev/null -w '%{http_code}' "$base/slow?ms=x")" 400
wait_until "$TEST_WAIT_S" held_is 0 || fail "a refused ms's lease still held"
expect "granted in all" "$(metric 'ratelimit_leases_total{result="granted"}')" 5
stop

# --- --store redis://: two servers (two processes, as on two hosts) on
# one Redis hold one limit between them.
if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
  start_redis "$tmp/redis.log" || { cat "$tmp/redis.log"; echo "FAIL: redis-server did not start"; exit 1; }
  start_on() { # start_on NAME: a server on Redis; pid_NAME, base_NAME
    : >"$tmp/log.$1"
    "$SERVER" --listen 127.0.0.1:0 --config "$tmp/rules.conf" \
      --store "redis://127.0.0.1:$rport/0" 2>>"$tmp/log.$1" &
    eval "pid_$1=$!"
    local port=
    for _ in $(seq 1 400); do
      port=$(sed -n 's/^api-server: listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$tmp/log.$1")
      [ -n "$port" ] && break
      sleep 0.05
    done
    [ -n "$port" ] || { cat "$tmp/log.$1"; echo "FAIL: server $1 did not start"; exit 1; }
    eval "base_$1=http://127.0.0.1:$port"
  }
  start_on a
  start_on b
  held_on() { # held_on BASE N
    [ "$(curl -s "$1/metrics" | awk '$1 == "ratelimit_leases_held" { print $2 }')" = "$2" ]
  }
  for i in 1 2 3; do
    b=$base_a; [ "$i" = 3 ] && b=$base_b
    curl -s -o /dev/null -H "X-API-Key: r$i" "$b/slow?ms=60000" &
    holders+=($!)
  done
  wait_until "$TEST_WAIT_S" held_on "$base_a" 2 || fail "redis: server a never held 2"
  wait_until "$TEST_WAIT_S" held_on "$base_b" 1 || fail "redis: server b never held 1"
  expect "redis: a fourth, on b" "$(curl -s -o /dev/null -w '%{http_code}' "$base_b/slow?ms=10")" 429
  expect "redis: a fourth, on a" "$(curl -s -o /dev/null -w '%{http_code}' "$base_a/slow?ms=10")" 429
  for h in "${holders[@]}"; do kill "$h" 2>/dev/null || true; wait "$h" 2>/dev/null || true; done
  holders=()
  wait_until "$TEST_WAIT_S" held_on "$base_a" 0 || fail "redis: server a still holds"
  wait_until "$TEST_WAIT_S" held_on "$base_b" 0 || fail "redis: server b still holds"
  expect "redis: after the hang-ups" "$(curl -s -o /dev/null -w '%{http_code}' "$base_b/slow?ms=10")" 200
  kill -TERM "$pid_a" "$pid_b"
  wait "$pid_a" "$pid_b" || true
  pid_a= pid_b=
else
  echo "api_lease_test: redis-server not installed; the Redis part is skipped"
fi

# The example's own file: /slow under concurrency 20.
start "$EXAMPLE"
curl -s -D "$tmp/he" -o /dev/null "$base/slow?ms=1"
grep -q '"slow";q=20' "$tmp/he" || fail "example.conf: no in-flight /slow: $(cat "$tmp/he")"
stop

[ "$fails" = 0 ] && echo "api_lease: ok"
[ "$fails" = 0 ]
