#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# In-flight limits across hosts (ratelimit_inflight_zone store=redis://,
# docs/nginx.md): two nginx instances of 2 workers each, one private
# redis-server, a slow upstream (tests/lib/slow_upstream.py), one key
# under concurrency 3:
#   - 6 requests at once, 3 to each instance: exactly 3 reach the
#     upstream (each marks it), the 3 others are refused 503 at once; a
#     probe to either instance is refused while the 3 are held;
#   - the 3 clients disconnect while their requests wait on the upstream
#     (a 100 s wait): their leases come back at once (nginx logs 499),
#     and three new requests, split over both instances, pass;
#   - the leases are in Redis under the zone's prefix;
#   - Redis stopped: the zone's fail mode, closed (503) and open (200),
#     each answered, and logged with the store's error;
#   - a worker is not held up by a Redis that never answers: with one
#     worker and a server that takes the commands and never replies
#     (timeout=60s), a static file is served while a request waits for
#     its lease (the acquire waits in nginx's thread pool).
# No step waits on time alone: each waits for a mark, a line or a code,
# bounded by TEST_WAIT_S.
#   nginx_lease_redis_test.sh MODULE_SO
# Exit 77 (skipped) when nginx, the module or redis-server is absent;
# under CI=true that is a failure.
set -euo pipefail

MODULE=${1:-}
NGINX=${NGINX:-/usr/sbin/nginx}

# shellcheck source=nginx_lib.sh
. "$(dirname "$0")/nginx_lib.sh"
nginx_needs nginx_lease_redis_test redis python3

tmp=$(mktemp -d /tmp/nginx_lease_redis_test.XXXXXX)
upstream_pid=
rpid=
mute_pid=
clients=()
cleanup() {
  local c
  for c in "${clients[@]}"; do kill "$c" 2>/dev/null || true; done
  [ -n "$mute_pid" ] && kill "$mute_pid" 2>/dev/null || true
  stop_pidfile "$tmp/a/nginx.pid"
  stop_pidfile "$tmp/b/nginx.pid"
  stop_pidfile "$tmp/c/nginx.pid"
  [ -n "$upstream_pid" ] && kill "$upstream_pid" 2>/dev/null || true
  stop_pid "$rpid"
  rm -rf "$tmp"
}
trap cleanup EXIT
chmod 755 "$tmp"

fails=0

start_redis "$tmp/redis.log" || { cat "$tmp/redis.log"; echo "FAIL: redis-server did not start"; exit 1; }
redis="redis://127.0.0.1:$rport"

python3 "$(dirname "$0")/lib/slow_upstream.py" "$tmp/upstream.port" "$tmp" &
upstream_pid=$!
wait_until "$TEST_WAIT_S" test -s "$tmp/upstream.port" || { echo "FAIL: no upstream"; exit 1; }
uport=$(cat "$tmp/upstream.port")

conf() { # conf DIR: an instance's configuration, on $port
  cat >"$1/nginx.conf" <<EOF
load_module $MODULE;
error_log $1/logs/error.log info;
events { worker_connections 512; }
http {
  log_format rl '\$pid \$status \$request_uri';
  access_log $1/logs/access.log rl;
  ratelimit_inflight_zone slow "concurrency 3 ttl=2m" store=$redis timeout=500ms;
  server {
    listen 127.0.0.1:$port;
    root $1/html;
    location /slow {
      ratelimit_inflight slow all;
      proxy_pass http://127.0.0.1:$uport;
      proxy_read_timeout 120s;
    }
    location /open {
      ratelimit_inflight slow all;
      ratelimit_inflight_fail open;
      proxy_pass http://127.0.0.1:$uport;
    }
  }
}
EOF
}
for d in a b; do
  mkdir -p "$tmp/$d/logs" "$tmp/$d/html"
  chmod 755 "$tmp/$d" "$tmp/$d/html"
  echo hello >"$tmp/$d/html/index.html"
  launch_nginx "$tmp/$d" 2 conf "$tmp/$d" || { echo "FAIL: nginx $d did not start"; exit 1; }
  eval "port_$d=$port"
done
url_a="http://127.0.0.1:$port_a"
url_b="http://127.0.0.1:$port_b"

# Six at once, three to each instance, each asking for 100 s of work.
for i in 1 2 3 4 5 6; do
  u=$url_a; [ $((i % 2)) = 0 ] && u=$url_b
  curl -s -o /dev/null -w '%{http_code}\n' --max-time 110 "$u/slow?s=100&mark=$i" >"$tmp/st.$i" &
  clients+=($!)
done
marks() { find "$tmp" -maxdepth 1 -name 'in.*' | wc -l; }
refused() { cat "$tmp"/st.* 2>/dev/null | grep -c '^503$' || true; }
three_in() { [ "$(marks)" = 3 ] && [ "$(refused)" = 3 ]; }
wait_until "$TEST_WAIT_S" three_in || fail "6 at once: $(marks) reached the upstream, $(refused) refused"
expect "6 at once: reached the upstream" "$(marks)" 3
expect "6 at once: refused" "$(refused)" 3
for u in "$url_a" "$url_b"; do
  expect "three held: a probe to $u" "$(curl -s -o /dev/null -w '%{http_code}' "$u/slow?s=0&probe=1")" 503
done
expect "the leases in Redis" "$(redis-cli -p "$rport" --scan --pattern 'ratelimit:slow:*' | wc -l)" 1
expect "the refusals logged (3, and the 2 probes)" \
  "$(grep -c 'limiting requests by zone "slow"' "$tmp/a/logs/error.log" "$tmp/b/logs/error.log" | awk -F: '{s += $2} END {print s}')" 5

# The three held clients hang up: their leases come back at once.
for c in "${clients[@]}"; do kill "$c" 2>/dev/null || true; done
for c in "${clients[@]}"; do wait "$c" 2>/dev/null || true; done
clients=()
disconnected() {
  [ "$(cat "$tmp/a/logs/access.log" "$tmp/b/logs/access.log" | grep -c ' 499 /slow?s=100')" = 3 ]
}
wait_until "$TEST_WAIT_S" disconnected || fail "the disconnects were not logged as 499"
rm -f "$tmp"/in.*
for i in 1 2 3; do
  u=$url_a; [ "$i" = 2 ] && u=$url_b
  curl -s -o /dev/null -w '%{http_code}\n' --max-time 110 "$u/slow?s=100&mark=n$i" >"$tmp/sn.$i" &
  clients+=($!)
done
three_again() { [ "$(marks)" = 3 ]; }
wait_until "$TEST_WAIT_S" three_again || fail "after the hang-ups: $(marks) of 3 new requests in; codes $(cat "$tmp"/sn.* 2>/dev/null | tr '\n' ' ')"
expect "three new held: a probe" "$(curl -s -o /dev/null -w '%{http_code}' "$url_b/slow?s=0")" 503
for c in "${clients[@]}"; do kill "$c" 2>/dev/null || true; done
for c in "${clients[@]}"; do wait "$c" 2>/dev/null || true; done
clients=()
released() { [ "$(curl -s -o /dev/null -w '%{http_code}' "$url_a/slow?s=0")" = 200 ]; }
wait_until "$TEST_WAIT_S" released || fail "the new requests' leases did not come back"

# Redis stopped: fail closed refuses, fail open serves; both logged.
stop_pid "$rpid" || true
rpid=
expect "Redis stopped, fail closed" "$(curl -s -o /dev/null -w '%{http_code}' --max-time 30 "$url_a/slow?s=0")" 503
expect "Redis stopped, fail open" "$(curl -s -o /dev/null -w '%{http_code}' --max-time 30 "$url_b/open?s=0")" 200
grep -q 'ratelimit_inflight: zone "slow": store error .*denied (ratelimit_inflight_fail closed)' "$tmp/a/logs/error.log" ||
  fail "no store-error line (closed): $(grep ratelimit_inflight "$tmp/a/logs/error.log" | tail -3)"
grep -q 'ratelimit_inflight: zone "slow": store error .*let through (ratelimit_inflight_fail open)' "$tmp/b/logs/error.log" ||
  fail "no store-error line (open): $(grep ratelimit_inflight "$tmp/b/logs/error.log" | tail -3)"

# A Redis that takes commands and never answers: the one worker serves a
# static file while a request waits for its lease.
python3 - "$tmp/mute.port" "$tmp/mute.asked" <<'EOF' &
import socket, sys, threading
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(16)
open(sys.argv[1], "w").write(str(srv.getsockname()[1]))
def hold(conn):
    while conn.recv(4096):
        open(sys.argv[2], "w").close()  # asked, never answered
while True:
    conn, _ = srv.accept()
    threading.Thread(target=hold, args=(conn,), daemon=True).start()
EOF
mute_pid=$!
wait_until "$TEST_WAIT_S" test -s "$tmp/mute.port" || fail "no mute server"
redis="redis://127.0.0.1:$(cat "$tmp/mute.port")"
conf_mute() {
  cat >"$1/nginx.conf" <<EOF
load_module $MODULE;
error_log $1/logs/error.log info;
events { worker_connections 512; }
http {
  ratelimit_inflight_zone mute "concurrency 3 ttl=2m" store=$redis timeout=60s;
  server {
    listen 127.0.0.1:$port;
    root $1/html;
    location /slow {
      ratelimit_inflight mute all;
      proxy_pass http://127.0.0.1:$uport;
    }
  }
}
EOF
}
mkdir -p "$tmp/c/logs" "$tmp/c/html"
chmod 755 "$tmp/c" "$tmp/c/html"
echo hello >"$tmp/c/html/index.html"
# Its worker serves at once (each probe bounded: a worker waiting on the
# mute server, 2 x 60 s, would not answer within the 60 s of the wait).
ready_args=(--max-time 20)
launch_nginx "$tmp/c" 1 conf_mute "$tmp/c" || fail "nginx c did not start"
ready_args=()
curl -s -o /dev/null --max-time 100 "http://127.0.0.1:$port/slow?s=0" &
clients+=($!)
wait_until "$TEST_WAIT_S" test -e "$tmp/mute.asked" || fail "the lease's call never reached the mute server"
# 20 s for a static file: a generous bound, a third of the Redis timeout.
expect "a static file while the worker's lease call waits" \
  "$(curl -s -o /dev/null -w '%{http_code}' --max-time 20 "http://127.0.0.1:$port/index.html")" 200
kill "$mute_pid" 2>/dev/null || true # the call fails now; the request ends
wait "$mute_pid" 2>/dev/null || true
mute_pid=
for c in "${clients[@]}"; do wait "$c" 2>/dev/null || true; done
clients=()

# Configuration errors of a Redis zone.
bad() { # bad WHAT DIRECTIVE : nginx -t refuses, naming WHAT
  cat >"$tmp/bad.conf" <<EOF
load_module $MODULE;
error_log $tmp/bad.log;
events { }
http { $2 server { listen 127.0.0.1:1; location / { } } }
EOF
  if "$NGINX" -t -p "$tmp" -c "$tmp/bad.conf" >"$tmp/bad.out" 2>&1; then
    fail "$1: accepted"
  elif ! grep -q "$1" "$tmp/bad.out"; then
    fail "$1: $(cat "$tmp/bad.out")"
  fi
}
bad 'keys=10" is for the shared-memory store' "ratelimit_inflight_zone z \"concurrency 3 ttl=1s\" store=$redis keys=10;"
bad 'timeout= and prefix= are for a Redis store' 'ratelimit_inflight_zone z "concurrency 3 ttl=1s" timeout=1s;'
bad 'store= is given twice' "ratelimit_inflight_zone z \"concurrency 3 ttl=1s\" store=$redis store=shm;"
bad 'unknown store "memcached://x"' 'ratelimit_inflight_zone z "concurrency 3 ttl=1s" store=memcached://x;'
bad 'store=redis://127.0.0.1:99999: ' 'ratelimit_inflight_zone z "concurrency 3 ttl=1s" store=redis://127.0.0.1:99999;'

if [ "$fails" -ne 0 ]; then echo "nginx_lease_redis: $fails failed"; exit 1; fi
echo "nginx_lease_redis: all passed"
