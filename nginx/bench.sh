#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# wrk against Debian's nginx serving a small static file: without the
# module, with it (one limit on $binary_remote_addr that always admits, on
# the shared-memory store), with it and the RateLimit fields, and (when
# redis-server is there: a private one on a free loopback port) the same
# limit on a store=redis:// zone, each request one asynchronous round trip
# to Redis; rounds alternated in one run, the best requests/s of each
# kept, and the CPU time the workers spent a request (user + system, from
# /proc: steadier than requests/s on a machine that others load).
#   nginx/bench.sh MODULE_SO [ROUNDS] [SECONDS]
# REDIS_MODULE=/path/ratelimit.so loads the Redis module into that
# redis-server (the zone's decisions then RATELIMIT.STEP, docs/redis-module.md).
# NO_REDIS=1 leaves the Redis row out; REFUND=1 adds one of two Redis
# limits whose second always denies (the first refunded without waiting,
# rate_limiter_refund_start on the worker's loop), each answered 429.
# BASE_MODULE=/path/other.so adds a row "base": the Redis row's nginx with
# that module (another build's, main's say) on the same Redis, in turn
# with the others: two builds side by side in one run.  REDIS_TIMEOUT=2s
# sets those zones' timeout= (default the zone's, 100 ms): on a machine
# loaded past its cores a round may otherwise see timeouts, and fails.
set -euo pipefail
MODULE=$(realpath "$1")
ROUNDS=${2:-5}
SECS=${3:-4}
NGINX=${NGINX:-/usr/sbin/nginx}
command -v wrk >/dev/null || { echo "bench: wrk is missing (apt-get install wrk)" >&2; exit 1; }

tmp=$(mktemp -d /tmp/nginx_bench.XXXXXX)
chmod 755 "$tmp"
pids=()
rpid=
cleanup() {
  for p in "${pids[@]}"; do kill -QUIT "$p" 2>/dev/null || true; done
  [ -n "$rpid" ] && kill "$rpid" 2>/dev/null
  sleep 0.3
  rm -rf "$tmp"
}
trap cleanup EXIT

# free_port: sets port to one nothing listens on and this run has not used
# (not in a subshell: each would draw the same $RANDOM).
used=" "
free_port() {
  while :; do
    # (below Linux's ephemeral ports, 32768 up, which the clients' and
    # the Redis stores' connections take)
    port=$((20000 + RANDOM % 12000))
    case "$used" in *" $port "*) continue ;; esac
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && continue
    used="$used$port "
    return
  done
}

# start NAME LOAD LOCATION_BODY [STORE]: an nginx of its own on a free
# port (STORE: the zone's store= and options, default the shared memory).
start() {
  local name=$1 load=$2 body=$3 dir="$tmp/$1" port zone=
  [ -n "$load" ] && zone="ratelimit_zone bench \"token-bucket 1000000000/s burst=1000000000\" ${4:-keys=100000};"
  free_port
  mkdir -p "$dir/logs" "$dir/html"
  chmod 755 "$dir" "$dir/html"
  printf 'hello, world\n' >"$dir/html/index.html"
  cat >"$dir/nginx.conf" <<CONF
$load
error_log $dir/logs/error.log ${5:-warn};
events { worker_connections 1024; }
http {
  access_log off;
  $zone
  server { listen 127.0.0.1:$port; root $dir/html; location / { $body } }
}
CONF
  "$NGINX" -p "$dir" -c "$dir/nginx.conf" -g "pid $dir/nginx.pid; daemon on; worker_processes 2;"
  for _ in $(seq 1 100); do [ -s "$dir/nginx.pid" ] && break; sleep 0.05; done
  pids+=("$(cat "$dir/nginx.pid")")
  eval "url_$name=http://127.0.0.1:$port/index.html"
  eval "master_$name=$(cat "$dir/nginx.pid")"
}

# rticks: the CPU clock ticks (user + system) of the private redis-server
# so far (0 without one).
rticks() {
  local rest
  [ -n "$rpid" ] || { echo 0; return; }
  rest=$(cat "/proc/$rpid/stat")
  rest=${rest##*) }
  set -- $rest
  echo $((${12} + ${13}))
}

# ticks MASTER: the CPU clock ticks (user + system) its workers used so far.
ticks() {
  local f t=0 rest
  for f in /proc/[0-9]*/stat; do
    rest=$(cat "$f" 2>/dev/null) || continue
    rest=${rest##*) }        # the fields after the command's name
    set -- $rest
    [ "$2" = "$1" ] && continue
    [ "$2" = "$MASTER" ] || continue
    t=$((t + ${12} + ${13}))
  done
  echo "$t"
}

start off "" ""
start module "load_module $MODULE;" 'ratelimit bench $binary_remote_addr;'
start headers "load_module $MODULE;" 'ratelimit bench $binary_remote_addr; ratelimit_headers on;'
curl -sf -o /dev/null "$url_module" && grep -qi '^RateLimit:' <(curl -sfI "$url_headers") ||
  { echo "bench: the module's nginx does not answer as expected" >&2; exit 1; }
names="off module headers"
if [ -z "${NO_REDIS:-}" ] && command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
  free_port
  rport=$port
  rtimeout=${REDIS_TIMEOUT:+ timeout=$REDIS_TIMEOUT}
  rmod=()
  [ -n "${REDIS_MODULE:-}" ] && rmod=(--loadmodule "$(realpath "$REDIS_MODULE")")
  redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no "${rmod[@]}" >"$tmp/redis.log" 2>&1 &
  rpid=$!
  for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
  start redis "load_module $MODULE;" 'ratelimit bench $binary_remote_addr; ratelimit_fail closed;' \
    "store=redis://127.0.0.1:$rport$rtimeout"
  curl -sf -o /dev/null "$url_redis" ||
    { echo "bench: the store=redis nginx does not answer 200" >&2; exit 1; }
  names="$names redis"
  if [ -n "${BASE_MODULE:-}" ]; then
    start base "load_module $(realpath "$BASE_MODULE");" \
      'ratelimit bench $binary_remote_addr; ratelimit_fail closed;' \
      "store=redis://127.0.0.1:$rport$rtimeout"
    curl -sf -o /dev/null "$url_base" ||
      { echo "bench: the BASE_MODULE nginx does not answer 200" >&2; exit 1; }
    names="$names base"
  fi
  [ -n "${REDIS_MODULE:-}" ] &&
    echo "redis-server with $(redis-cli -p "$rport" MODULE LIST | sed -n 2p) loaded"
  if [ -n "${REFUND:-}" ]; then
    # Two Redis limits, the second always denying (one key, spent by the
    # check below): each request two asynchronous decisions and the
    # first one's refund (sent without waiting, docs/nginx.md).
    start refund "load_module $MODULE;" \
      'ratelimit bench $binary_remote_addr; ratelimit deny "x"; ratelimit_status 429;' \
      "store=redis://127.0.0.1:$rport;
  ratelimit_zone deny \"fixed-window 1/3650d\" store=redis://127.0.0.1:$rport" notice
    curl -s -o /dev/null "$url_refund"
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$url_refund")" = 429 ] ||
      { echo "bench: the refund nginx does not deny" >&2; exit 1; }
    names="$names refund"
  fi
else
  echo "bench: no redis-server (or NO_REDIS): the store=redis row is left out"
fi

declare -A best=([off]=0 [module]=0 [headers]=0 [redis]=0 [refund]=0 [base]=0)
declare -A cpu=([off]=0 [module]=0 [headers]=0 [redis]=0 [refund]=0 [base]=0)
declare -A reqs=([off]=0 [module]=0 [headers]=0 [redis]=0 [refund]=0 [base]=0)
declare -A rcpu=([off]=0 [module]=0 [headers]=0 [redis]=0 [refund]=0 [base]=0)
for r in $(seq 1 "$ROUNDS"); do
  for name in $names; do
    url_var="url_$name"
    master_var="master_$name"
    MASTER=${!master_var}
    t0=$(ticks)
    r0=$(rticks)
    out=$(wrk -t2 -c32 -d"${SECS}s" "${!url_var}")
    t1=$(ticks)
    r1=$(rticks)
    rps=$(awk '/^Requests\/sec/ {printf "%d", $2}' <<<"$out")
    n=$(awk '/requests in/ {print $1}' <<<"$out")
    cpu[$name]=$((cpu[$name] + t1 - t0))
    rcpu[$name]=$((rcpu[$name] + r1 - r0))
    reqs[$name]=$((reqs[$name] + n))
    echo "round $r $name: $rps requests/s, $((t1 - t0)) ticks for $n requests"
    if [ "$name" != refund ] && grep -q 'Non-2xx' <<<"$out"; then
      # (fail closed: a Redis error is a fast 503, which would flatter it)
      echo "bench: $name answered other than 200: $(grep 'Non-2xx' <<<"$out")" >&2
      exit 1
    fi
    [ "$rps" -gt "${best[$name]}" ] && best[$name]=$rps
  done
done
hz=$(getconf CLK_TCK)
awk -v hz="$hz" -v co="${cpu[off]}" -v no="${reqs[off]}" -v cm="${cpu[module]}" \
    -v nm="${reqs[module]}" -v ch="${cpu[headers]}" -v nh="${reqs[headers]}" 'BEGIN {
  o = co / hz / no * 1e6; m = cm / hz / nm * 1e6; h = ch / hz / nh * 1e6
  printf "worker CPU a request: off %.2f us, module %.2f us (%.3f), module+headers %.2f us (%.3f)\n",
         o, m, m / o, h, h / o }'
echo "best: off ${best[off]}, module ${best[module]}, module+headers ${best[headers]} requests/s"
awk -v o="${best[off]}" -v m="${best[module]}" -v h="${best[headers]}" 'BEGIN {
  printf "module/off %.3f (cost %.1f%%), module+headers/off %.3f (cost %.1f%%)\n",
         m / o, 100 * (1 - m / o), h / o, 100 * (1 - h / o) }'
if [ "${best[redis]}" -gt 0 ]; then
  awk -v o="${best[off]}" -v r="${best[redis]}" -v co="${cpu[off]}" -v no="${reqs[off]}" \
      -v cr="${cpu[redis]}" -v nr="${reqs[redis]}" -v hz="$hz" 'BEGIN {
    printf "store=redis: best %d requests/s, redis/off %.3f (cost %.1f%%); worker CPU a request %.2f us (%.3f of off)\n",
           r, r / o, 100 * (1 - r / o), cr / hz / nr * 1e6, (cr / nr) / (co / no) }'
fi
if [ "${best[base]}" -gt 0 ]; then
  awk -v o="${best[off]}" -v r="${best[redis]}" -v b="${best[base]}" -v co="${cpu[off]}" \
      -v no="${reqs[off]}" -v cr="${cpu[redis]}" -v nr="${reqs[redis]}" -v cb="${cpu[base]}" \
      -v nb="${reqs[base]}" -v hz="$hz" 'BEGIN {
    printf "store=redis, BASE_MODULE: best %d requests/s, base/off %.3f; worker CPU a request %.2f us (%.3f of off); this/base: requests/s %.3f, CPU a request %.3f\n",
           b, b / o, cb / hz / nb * 1e6, (cb / nb) / (co / no), r / b, (cr / nr) / (cb / nb) }'
  awk -v rr="${rcpu[redis]}" -v nr="${reqs[redis]}" -v rb="${rcpu[base]}" -v nb="${reqs[base]}" \
      -v hz="$hz" 'BEGIN {
    printf "redis-server CPU a request: this %.2f us, base %.2f us (this/base %.3f)\n",
           rr / hz / nr * 1e6, rb / hz / nb * 1e6, (rr / nr) / (rb / nb) }'
fi
if [ "${best[refund]}" -gt 0 ]; then
  awk -v o="${best[off]}" -v r="${best[redis]}" -v f="${best[refund]}" 'BEGIN {
    printf "two Redis limits, a denial and a refund: best %d requests/s, refund/off %.3f, refund/redis %.3f\n",
           f, f / o, f / r }'
  # the refunds the workers made and dropped (logged at their exit)
  kill -QUIT "$master_refund"
  for _ in $(seq 1 100); do kill -0 "$master_refund" 2>/dev/null || break; sleep 0.05; done
  sed -n 's/.*refunds on Redis zones: \([0-9]*\) made, \([0-9]*\) failed, \([0-9]*\) dropped.*/\1 \2 \3/p' \
    "$tmp/refund/logs/error.log" | awk '{ m += $1; f += $2; d += $3 } END {
    pct = 100; if (m + f + d) pct = 100 * m / (m + f + d)
    printf "  refunds: %d made, %d failed, %d dropped (%.0f%% made)\n",
           m, f, d, pct }'
fi
