#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# In-flight limits in nginx (ratelimit_inflight_zone, docs/nginx.md): an
# nginx of 2 workers in front of a slow upstream (a Python server that
# answers after ?s= seconds), one key, concurrency 3:
#   - 6 requests at once, each on its own connection: exactly 3 answered
#     200 and 3 refused 503, across the workers;
#   - a request that ends gives its lease back; one redirected internally
#     holds one lease;
#   - 3 clients that disconnect while their requests wait on the upstream
#     give their leases back at once (not after the 60 s TTL);
#   - a reserve for critical requests (critical=$http_x_critical);
#   - a zone of 64 keys (keys=64): a key held while 512 others come and
#     go is never evicted (a second request of it is still refused at
#     N=1, and its release finds its lease); a zone whose every key is
#     held refuses a new key as a store error, logged;
#   - configuration errors.
# The slow requests hold for 6 s so that 6 started together overlap on a
# loaded machine; every other wait is a bounded poll.
#   nginx_lease_test.sh MODULE_SO
# Exit 77 (skipped) when nginx or the module is absent; under CI=true that
# is a failure.
set -euo pipefail

MODULE=${1:-}
NGINX=${NGINX:-/usr/sbin/nginx}

# shellcheck source=nginx_lib.sh
. "$(dirname "$0")/nginx_lib.sh"
nginx_needs nginx_lease_test python3

tmp=$(mktemp -d /tmp/nginx_lease_test.XXXXXX)
upstream_pid=
cleanup() {
  stop_nginx || true
  [ -n "$upstream_pid" ] && kill "$upstream_pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
mkdir -p "$tmp/logs" "$tmp/html"
chmod 755 "$tmp" "$tmp/html"
echo hello >"$tmp/html/index.html"

fails=0
port=
pidfile="$tmp/nginx.pid"

# The slow upstream, on a free port it reports.
python3 "$(dirname "$0")/lib/slow_upstream.py" "$tmp/upstream.port" "$tmp" &
upstream_pid=$!
for _ in $(seq 100); do [ -s "$tmp/upstream.port" ] && break; sleep 0.05; done
uport=$(cat "$tmp/upstream.port")

# Polls URL (20 s at most, a third of the TTL) until it answers 200;
# prints the last code.
await_200() {
  local code=
  for _ in $(seq 400); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "$1")
    [ "$code" = 200 ] && break
    sleep 0.05
  done
  echo "$code"
}

# Waits (60 s at most) for a file to appear.
await_file() {
  for _ in $(seq 1200); do [ -e "$1" ] && return 0; sleep 0.05; done
  return 1
}

conf() {
  cat >"$tmp/nginx.conf" <<EOF
load_module $MODULE;
error_log $tmp/logs/error.log info;
events { worker_connections 512; }
http {
  log_format rl '\$pid \$status \$request_uri';
  access_log $tmp/logs/access.log rl;
  ratelimit_inflight_zone slow "concurrency 3 ttl=1m";
  ratelimit_inflight_zone pri "concurrency 3 ttl=1m reserve=1";
  ratelimit_inflight_zone tiny "concurrency 1 ttl=1m" keys=64;
  server {
    listen 127.0.0.1:$port;
    root $tmp/html;
    location /slow {
      ratelimit_inflight slow all;
      proxy_pass http://127.0.0.1:$uport;
      proxy_read_timeout 120s;
    }
    location /redir {
      ratelimit_inflight slow all;
      try_files /nonexistent @back;
    }
    location @back {
      ratelimit_inflight slow all;
      proxy_pass http://127.0.0.1:$uport;
    }
    location /tiny {
      ratelimit_inflight tiny \$arg_k;
      proxy_pass http://127.0.0.1:$uport;
    }
    location /tinyfile/ {
      ratelimit_inflight tiny \$arg_k;
      alias $tmp/html/;
    }
    location /pri {
      ratelimit_inflight pri all critical=\$http_x_critical;
      proxy_pass http://127.0.0.1:$uport;
    }
  }
}
EOF
}
launch_nginx "$tmp" 2 conf || { echo "FAIL: nginx did not start"; exit 1; }
stop_nginx() { stop_pidfile "$pidfile"; }
url="http://127.0.0.1:$port"

# Six at once: three held, three refused.
# (Each wait names its curls: a bare wait would wait for the upstream.)
cpids=()
for i in 1 2 3 4 5 6; do
  curl -s -o /dev/null -w '%{http_code}\n' "$url/slow?s=6&i=$i" >"$tmp/st.$i" &
  cpids+=($!)
done
wait "${cpids[@]}"
ok=$(cat "$tmp"/st.* | grep -c '^200$' || true)
refused=$(cat "$tmp"/st.* | grep -c '^503$' || true)
expect "6 at once: answered" "$ok" 3
expect "6 at once: refused" "$refused" 3
pids=$(awk '$3 ~ /^\/slow\?s=6/ {print $1}' "$tmp/logs/access.log" | sort -u | wc -l)
echo "(6 at once: served by $pids worker(s))"

# Each lease came back: three more pass at once.
cpids=()
for i in 1 2 3; do
  curl -s -o /dev/null -w '%{http_code}\n' "$url/slow?s=1&j=$i" >"$tmp/sj.$i" &
  cpids+=($!)
done
wait "${cpids[@]}"
expect "after they ended" "$(cat "$tmp"/sj.* | grep -c '^200$' || true)" 3

# An internal redirect (try_files to a named location limited by the same
# zone) holds one lease, not two: three at once all pass.
cpids=()
for i in 1 2 3; do
  curl -s -o /dev/null -w '%{http_code}\n' "$url/redir?s=3&r=$i" >"$tmp/sr.$i" &
  cpids+=($!)
done
wait "${cpids[@]}"
expect "redirected, one lease each" "$(cat "$tmp"/sr.* | grep -c '^200$' || true)" 3

# Clients that disconnect while waiting on the upstream release theirs.
# (No probe until the three are in, at the upstream: a probe among them
# could take a slot and leave one of them refused.)
for i in 1 2 3; do
  curl -s -o /dev/null --max-time 100 "$url/slow?s=100&mark=$i" &
  echo $! >"$tmp/client.$i"
done
for i in 1 2 3; do await_file "$tmp/in.$i" || fail "client $i not in"; done
code=$(curl -s -o /dev/null -w '%{http_code}' "$url/slow?s=0&probe=1")
expect "three held: a fourth" "$code" 503
for i in 1 2 3; do kill "$(cat "$tmp/client.$i")" 2>/dev/null || true; done
for i in 1 2 3; do wait "$(cat "$tmp/client.$i")" 2>/dev/null || true; done
expect "after the clients left" "$(await_200 "$url/slow?s=0&after=1")" 200
three=0
cpids=()
for i in 1 2 3; do
  curl -s -o /dev/null -w '%{http_code}\n' "$url/slow?s=1&l=$i" >"$tmp/sl.$i" &
  cpids+=($!)
done
wait "${cpids[@]}"
expect "all three back" "$(cat "$tmp"/sl.* | grep -c '^200$' || true)" 3
[ "$(grep -c ' 499 /slow?s=100' "$tmp/logs/access.log")" = 3 ] && three=1
expect "the disconnects logged as 499" "$three" 1

# A reserve of 1 for critical requests (critical=\$http_x_critical): two
# normal ones held, a third normal one is refused, a critical one passes.
cpids=()
for i in 1 2; do
  curl -s -o /dev/null "$url/pri?s=6&mark=p$i" & cpids+=($!)
done
for i in 1 2; do await_file "$tmp/in.p$i" || fail "request p$i not in"; done
expect "two normal held: a normal one" \
  "$(curl -s -o /dev/null -w '%{http_code}' "$url/pri?s=0")" 503
expect "two normal held: a critical one" \
  "$(curl -s -o /dev/null -w '%{http_code}' -H 'X-Critical: 1' "$url/pri?s=0")" 200
expect "critical: 0 is normal" \
  "$(curl -s -o /dev/null -w '%{http_code}' -H 'X-Critical: 0' "$url/pri?s=0")" 503
wait "${cpids[@]}"

# A zone of 64 keys: one key held (N=1) while 512 other keys come and go,
# each request holding its key's lease for its own short life.
curl -s -o /dev/null "$url/tiny?k=held&s=30&mark=t0" &
held_pid=$!
await_file "$tmp/in.t0" || fail "the held request is not in"
urls=()
for i in $(seq 512); do urls+=(-o /dev/null "$url/tinyfile/index.html?k=churn$i"); done
churn_ok=$(curl -s -w '%{http_code}\n' "${urls[@]}" | grep -c '^200$' || true)
expect "tiny zone: the other keys served" "$churn_ok" 512
expect "tiny zone: the held key still held, a second refused" \
  "$(curl -s -o /dev/null -w '%{http_code}' "$url/tinyfile/index.html?k=held")" 503
kill "$held_pid" 2>/dev/null || true
wait "$held_pid" 2>/dev/null || true
expect "tiny zone: the held key given back" \
  "$(await_200 "$url/tinyfile/index.html?k=held")" 200
expect "tiny zone: no release failed" \
  "$(grep -c 'releasing a lease' "$tmp/logs/error.log" || true)" 0

# Every key of the zone held: a new key is refused (a store error, the
# fail mode closed), never a held key dropped.
cpids=()
for i in $(seq 64); do
  curl -s -o /dev/null "$url/tiny?k=full$i&s=30&mark=f$i" & cpids+=($!)
done
for i in $(seq 64); do await_file "$tmp/in.f$i" || fail "request f$i not in"; done
expect "tiny zone full: a new key refused" \
  "$(curl -s -o /dev/null -w '%{http_code}' "$url/tinyfile/index.html?k=new")" 503
expect "tiny zone full: a held key still held" \
  "$(curl -s -o /dev/null -w '%{http_code}' "$url/tinyfile/index.html?k=full1")" 503
full_logged=0
grep -q 'zone "tiny": store error RATE_EFULL' "$tmp/logs/error.log" && full_logged=1
expect "tiny zone full: the store error logged" "$full_logged" 1
kill "${cpids[@]}" 2>/dev/null || true
wait "${cpids[@]}" 2>/dev/null || true
expect "tiny zone: no release failed at all" \
  "$(grep -c 'releasing a lease' "$tmp/logs/error.log" || true)" 0
stop_nginx

# Configuration errors.
bad() { # bad WHAT DIRECTIVES... : nginx -t refuses, naming WHAT
  cat >"$tmp/bad.conf" <<EOF
load_module $MODULE;
error_log $tmp/logs/bad.log;
events { }
http { $2 server { listen 127.0.0.1:1; location / { $3 } } }
EOF
  if "$NGINX" -t -p "$tmp" -c "$tmp/bad.conf" >"$tmp/bad.out" 2>&1; then
    fail "$1: accepted"
  elif ! grep -q "$1" "$tmp/bad.out"; then
    fail "$1: $(cat "$tmp/bad.out")"
  fi
}
bad 'missing ttl=DURATION' 'ratelimit_inflight_zone z "concurrency 3";' ''
bad 'rate limits go on a ratelimit_zone' 'ratelimit_inflight_zone z "concurrency 3 ttl=1s; gcra 1/s";' ''
bad 'no ratelimit_inflight_zone "y"' 'ratelimit_inflight_zone z "concurrency 3 ttl=1s";' 'ratelimit_inflight y $uri;'
bad 'unknown parameter "crit=1"' 'ratelimit_inflight_zone z "concurrency 3 ttl=1s";' 'ratelimit_inflight z $uri crit=1;'
bad 'unknown parameter "size=1"' 'ratelimit_inflight_zone z "concurrency 3 ttl=1s" size=1;' ''
bad 'ratelimit_inflight_status: "600" is not a status from 400 to 599' '' 'ratelimit_inflight_status 600;'
bad 'ratelimit_inflight_zone "z": "keys=0": keys= takes a positive whole number' 'ratelimit_inflight_zone z "concurrency 3 ttl=1s" keys=0;' ''
bad 'ratelimit_inflight: "critical=" needs a value' 'ratelimit_inflight_zone z "concurrency 3 ttl=1s";' 'ratelimit_inflight z $uri critical=;'
bad 'ratelimit_inflight_fail: "maybe" is none of closed, open' '' 'ratelimit_inflight_fail maybe;'

if [ "$fails" -ne 0 ]; then echo "nginx_lease: $fails failed"; exit 1; fi
echo "nginx_lease: all passed"
