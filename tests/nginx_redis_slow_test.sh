#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# A store=redis:// zone before a Redis that reads slowly: the worker's
# writes to it do not finish (EAGAIN), and every request must still be
# answered.  The worker's loop sends a turn's commands from a posted event
# and waits for the socket to be writable only when a write does not
# finish (nginx/ngx_http_ratelimit_loop.c); a loop that left the rest of
# a write unsent until the next command would leave the last requests of
# a burst to time out (503 under ratelimit_fail closed).
#
# Between nginx (one worker, so one connection carries the burst) and a
# private redis-server sits a Python proxy whose listening socket has a
# small receive buffer and segment size and which reads 256 bytes at a
# time with a pause between reads.  A burst of 300 requests with a
# 480-byte key (about 170 KB of commands) fills the buffers; the test
# checks that the worker logged waiting for writability (its debug line:
# the path ran) and that all 300 were answered 200 before the zone's
# timeout (30 s: nothing here may time out).
#   nginx_redis_slow_test.sh MODULE_SO
# Exit 77 (skipped) when nginx, the module, redis-server or python3 is
# absent; under CI=true that is a failure.
set -euo pipefail

MODULE=${1:-}
NGINX=${NGINX:-/usr/sbin/nginx}
BURST=300

# shellcheck source=nginx_lib.sh
. "$(dirname "$0")/nginx_lib.sh"
nginx_needs nginx_redis_slow_test redis python3
grep -q -- --with-debug <("$NGINX" -V 2>&1) ||
  skip "$NGINX is built without --with-debug (its debug log shows the path)"

tmp=$(mktemp -d /tmp/nginx_redis_slow_test.XXXXXX)
rpid=
ppid=
cleanup() {
  stop_pidfile "$tmp/n/nginx.pid" || true
  if [ -n "$ppid" ]; then
    kill "$ppid" 2>/dev/null || true
    wait "$ppid" 2>/dev/null || true
  fi
  if [ -n "$rpid" ]; then
    kill "$rpid" 2>/dev/null || true
    wait "$rpid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
chmod 755 "$tmp" # the workers run as nobody when started by root

start_redis "$tmp/redis.log" || { cat "$tmp/redis.log"; echo "FAIL: redis-server did not start"; exit 1; }

# The slow proxy: its port written to $tmp/proxy.port once it listens.
cat >"$tmp/proxy.py" <<'PY'
import os, socket, sys, threading, time

redis_port, port_file = int(sys.argv[1]), sys.argv[2]
ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
# Small before listen(): the accepted sockets inherit them, so the
# client's window and segments are small and its send buffer fills.
ls.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
ls.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
ls.bind(("127.0.0.1", 0))
ls.listen(16)
with open(port_file + ".tmp", "w") as f:
    f.write(str(ls.getsockname()[1]))
os.rename(port_file + ".tmp", port_file)

def pump(src, dst, slow):
    try:
        while True:
            data = src.recv(256 if slow else 65536)
            if not data:
                break
            dst.sendall(data)
            if slow:
                time.sleep(0.005)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

while True:
    c, _ = ls.accept()
    r = socket.create_connection(("127.0.0.1", redis_port))
    threading.Thread(target=pump, args=(c, r, True), daemon=True).start()
    threading.Thread(target=pump, args=(r, c, False), daemon=True).start()
PY
python3 "$tmp/proxy.py" "$rport" "$tmp/proxy.port" &
ppid=$!
wait_until "$TEST_WAIT_S" test -s "$tmp/proxy.port" || { echo "FAIL: the proxy did not start"; exit 1; }
pport=$(cat "$tmp/proxy.port")

mkdir -p "$tmp/n/logs" "$tmp/n/html"
chmod 755 "$tmp/n" "$tmp/n/html"
printf 'hello\n' >"$tmp/n/html/index.html"
conf() {
  cat >"$tmp/n/nginx.conf" <<EOF
load_module $MODULE;
error_log $tmp/n/logs/error.log debug_event;
events { worker_connections 1024; }
http {
  access_log off;
  ratelimit_zone slow "token-bucket 1000000/s burst=1000000" store=redis://127.0.0.1:$pport timeout=30s;
  server {
    listen 127.0.0.1:$port;
    root $tmp/n/html;
    location / { ratelimit slow \$http_x_key; ratelimit_fail closed; }
  }
}
EOF
}
launch_nginx "$tmp/n" 1 conf || { echo "FAIL: nginx did not start"; exit 1; }
url="http://127.0.0.1:$port/index.html"
key=$(printf 'k%.0s' $(seq 480))
# One decision first: the store connected (its connect's write interest
# is the kernel's, not this path's).
expect "a first request" "$(curl -s -o /dev/null -w '%{http_code}' -H "X-Key: $key" "$url")" 200

# The burst: every request answered, none by the timeout (30 s; curl gives
# up at 60).
codes=$(curl -s --no-progress-meter --parallel --parallel-max "$BURST" --max-time 60 -H "X-Key: $key" \
  -o /dev/null -w '%{http_code}\n' "$url?i=[1-$BURST]" || true)
ok=$(grep -c '^200$' <<<"$codes" || true)
expect "requests of the burst answered 200" "$ok" "$BURST"
[ "$ok" = "$BURST" ] || echo "  statuses: $(sort <<<"$codes" | uniq -c | tr '\n' ' ')"
waits=$(grep -c 'a write to Redis did not finish' "$tmp/n/logs/error.log" || true)
[ "$waits" -gt 0 ] ||
  fail "no write to Redis was left unfinished: the burst did not fill the buffers (the test proves nothing)"
echo "writes left unfinished and waited for: $waits"
expect "store errors logged" "$(grep -c 'store error' "$tmp/n/logs/error.log" || true)" 0

[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "nginx_redis_slow: all passed"
exit 0
