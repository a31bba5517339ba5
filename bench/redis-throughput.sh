#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Issue 27's figures in one run (docs/performance.md, "Redis throughput"):
# a private redis-server on a free loopback port with ratelimit.so loaded,
# then `ratelimit bench --redis URL --workload` of each binary given, in
# turn for ROUNDS rounds, the first one with the Node peer beside it
# (bench/node-peer/run.sh, which installs its packages with npm once, into
# build/node-peer).  Compare a branch with main by giving both binaries.
#   bench/redis-throughput.sh MODULE_SO RATELIMIT_BIN [RATELIMIT_BIN...]
# DECISIONS (default 200000, the issue's), ROUNDS (1), NO_PEER=1 to leave
# the Node peer out, TASKSET="taskset -c 0" to pin the server.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
module=$(realpath "$1")
shift
[ $# -ge 1 ] || { echo "usage: $0 MODULE_SO RATELIMIT_BIN [RATELIMIT_BIN...]" >&2; exit 2; }
command -v redis-server >/dev/null || { echo "bench: redis-server is missing" >&2; exit 1; }
tmp=$(mktemp -d /tmp/redis_throughput.XXXXXX)
rpid=
cleanup() {
  [ -n "$rpid" ] && kill "$rpid" 2>/dev/null && wait "$rpid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
while :; do
  port=$((20000 + RANDOM % 12000))
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || break
done
${TASKSET:-} redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
  --loadmodule "$module" >"$tmp/redis.log" 2>&1 &
rpid=$!
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
echo "redis-server $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/') on port $port, ratelimit.so loaded; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
peer=()
[ -z "${NO_PEER:-}" ] && peer=(--node-peer "$here/node-peer/run.sh")
for r in $(seq 1 "${ROUNDS:-1}"); do
  first=1
  for bin in "$@"; do
    echo "== round $r: $bin"
    if [ -n "$first" ]; then
      "$bin" bench --redis "redis://127.0.0.1:$port" --workload \
        --decisions "${DECISIONS:-200000}" "${peer[@]}"
    else
      "$bin" bench --redis "redis://127.0.0.1:$port" --workload \
        --decisions "${DECISIONS:-200000}"
    fi
    first=
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
