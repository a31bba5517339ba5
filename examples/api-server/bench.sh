#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The limiter's cost in the example server: wrk against two servers side
# by side, one deciding every request under rules that allow them all
# (memory store), one started with --no-limit, in alternated rounds of the
# same run; prints requests/s of each round and the ratio of the sums, and
# the server's CPU time per request (user + system, from /proc), which the
# other processes of a shared machine disturb less than requests/s.
# KEYS=N: the requests' X-API-Key rotates over N keys (default 1: one hot
# key, the limiter's worst case for contention between the server's
# threads).
#   examples/api-server/bench.sh [API_SERVER] [ROUNDS] [SECONDS]
set -euo pipefail

SERVER=${1:-build/examples/api-server/api-server}
ROUNDS=${2:-5}
SECS=${3:-3}
THREADS=${WRK_THREADS:-1}
CONNS=${WRK_CONNECTIONS:-16}
KEYS=${KEYS:-1}
TCK=$(getconf CLK_TCK)
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

cat >"$tmp/keys.lua" <<EOF
-- SPDX-License-Identifier: MIT
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", nil, { ["X-API-Key"] = "bench-" .. (n % $KEYS) })
end
EOF

start() { # start NAME ARGS...: sets port_NAME and pid_NAME
  local name=$1
  shift
  # wrk's connections all come from 127.0.0.1: no per-address cap
  "$SERVER" --listen 127.0.0.1:0 --config "$tmp/bench.conf" --max-conns-per-ip 0 "$@" 2>"$tmp/$name.log" &
  pids+=($!)
  local port=
  for _ in $(seq 1 100); do
    port=$(sed -n 's/^api-server: listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$tmp/$name.log")
    [ -n "$port" ] && break
    sleep 0.05
  done
  [ -n "$port" ] || { cat "$tmp/$name.log"; exit 1; }
  eval "port_$name=$port pid_$name=${pids[-1]}"
}
start on
start off --no-limit

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# round NAME PATH: one wrk round; prints "REQ_PER_S CPU_US_PER_REQUEST"
round() {
  local port pid c0 c1 out
  eval "port=\$port_$1 pid=\$pid_$1"
  c0=$(cpu_ticks "$pid")
  out=$(wrk -t"$THREADS" -c"$CONNS" -d"${SECS}s" -s "$tmp/keys.lua" "http://127.0.0.1:$port$2")
  c1=$(cpu_ticks "$pid")
  awk -v c="$((c1 - c0))" -v tck="$TCK" '
    /^Requests\/sec:/ { rps = $2 }
    / requests in / { n = $1 }
    END { printf "%.2f %.3f\n", rps, c / tck * 1e6 / n }' <<<"$out"
}

for path in /items /search; do
  sum_on=0 sum_off=0 cpu_on=0 cpu_off=0
  echo "path $path: $ROUNDS rounds of ${SECS} s, wrk -t$THREADS -c$CONNS, $KEYS key(s)"
  for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) -eq 1 ]; then
      on=$(round on "$path"); off=$(round off "$path")
    else
      off=$(round off "$path"); on=$(round on "$path")
    fi
    set -- $on $off
    awk -v r="$r" -v on="$1" -v off="$3" -v con="$2" -v coff="$4" 'BEGIN {
      printf "  round %d: on %8.0f req/s %6.2f us cpu/req   off %8.0f req/s %6.2f us cpu/req   on/off %.3f\n", r, on, con, off, coff, on / off }'
    sum_on=$(awk -v a="$sum_on" -v b="$1" 'BEGIN { printf "%.2f", a + b }')
    sum_off=$(awk -v a="$sum_off" -v b="$3" 'BEGIN { printf "%.2f", a + b }')
    cpu_on=$(awk -v a="$cpu_on" -v b="$2" 'BEGIN { printf "%.3f", a + b }')
    cpu_off=$(awk -v a="$cpu_off" -v b="$4" 'BEGIN { printf "%.3f", a + b }')
  done
  awk -v on="$sum_on" -v off="$sum_off" -v con="$cpu_on" -v coff="$cpu_off" 'BEGIN {
    printf "  all rounds: requests/s on/off %.3f (%.1f%% fewer); cpu per request on/off %.3f (%.1f%% more)\n", on / off, 100 * (1 - on / off), con / coff, 100 * (con / coff - 1) }'
done
