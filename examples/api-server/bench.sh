#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The limiter's cost in the example server: wrk against two servers side
# by side, one deciding every request under rules that allow them all
# (memory store), one started with --no-limit, in alternated rounds of the
# same run; prints requests/s of each round and the ratio of the sums.
#   examples/api-server/bench.sh [API_SERVER] [ROUNDS] [SECONDS]
set -euo pipefail

SERVER=${1:-build/examples/api-server/api-server}
ROUNDS=${2:-5}
SECS=${3:-3}
THREADS=${WRK_THREADS:-1}
CONNS=${WRK_CONNECTIONS:-16}
command -v wrk >/dev/null || { echo "bench: wrk is missing (apt-get install wrk)"; exit 2; }

tmp=$(mktemp -d /tmp/api_bench.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# Every request allowed: a bucket no bench fills, for every key (the tier
# group's default) and a second one on the route, as the example has.
cat >"$tmp/bench.conf" <<'EOF'
[policies]
all = token-bucket 1000000000/s burst=1000000000
route = token-bucket 1000000000/s burst=1000000000
[rule all]
group = tier
policy = all
[rule route]
group = route
match = route=/search*
policy = route
key = shared
EOF

start() { # start NAME ARGS...: sets port_NAME
  local name=$1
  shift
  "$SERVER" --listen 127.0.0.1:0 --config "$tmp/bench.conf" "$@" 2>"$tmp/$name.log" &
  pids+=($!)
  local port=
  for _ in $(seq 1 100); do
    port=$(sed -n 's/^api-server: listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$tmp/$name.log")
    [ -n "$port" ] && break
    sleep 0.05
  done
  [ -n "$port" ] || { cat "$tmp/$name.log"; exit 1; }
  eval "port_$name=$port"
}
start on
start off --no-limit

rps() { # rps PORT PATH: requests/s of one wrk round
  wrk -t"$THREADS" -c"$CONNS" -d"${SECS}s" -H 'X-API-Key: bench' \
    "http://127.0.0.1:$1$2" | sed -n 's/^Requests\/sec: *//p'
}

for path in /items /search; do
  sum_on=0 sum_off=0
  echo "path $path: $ROUNDS rounds of ${SECS} s, wrk -t$THREADS -c$CONNS"
  for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) -eq 1 ]; then
      on=$(rps "$port_on" "$path"); off=$(rps "$port_off" "$path")
    else
      off=$(rps "$port_off" "$path"); on=$(rps "$port_on" "$path")
    fi
    awk -v r="$r" -v on="$on" -v off="$off" 'BEGIN {
      printf "  round %d: limiter on %10.0f req/s   off %10.0f req/s   on/off %.3f\n", r, on, off, on / off }'
    sum_on=$(awk -v a="$sum_on" -v b="$on" 'BEGIN { printf "%.2f", a + b }')
    sum_off=$(awk -v a="$sum_off" -v b="$off" 'BEGIN { printf "%.2f", a + b }')
  done
  awk -v on="$sum_on" -v off="$sum_off" 'BEGIN {
    printf "  all rounds: on/off %.3f (the limiter costs %.1f%% of requests/s)\n", on / off, 100 * (1 - on / off) }'
done
