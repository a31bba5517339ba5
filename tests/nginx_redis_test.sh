#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The nginx module's store=redis:// zones: a private redis-server on a
# free loopback port and TWO nginx instances (3 workers each, their own
# prefix, port and pid file, stopped by pid) sharing its limits.  Requests
# alternate between the instances, one connection each (so that they also
# spread over the workers), and every status is checked against the exact
# expectation: each algorithm tested (fixed window, token bucket, a
# composite, a window the scripts decline so that the C step decides),
# two limits on a location (nothing charged on a denial), headers, shadow,
# and Redis stopped (SIGSTOP) then killed mid-run under each fail mode:
# every request answered within the zone's timeout plus a slack, no worker
# hung (curl --max-time), a client that goes away while its decision is
# in flight, a reload while Redis is stopped (the new workers make their
# zones without waiting for it and answer at once under the fail mode),
# and the limits exact again once Redis is back; and HTTP/2 (a third
# nginx on the same zones: multiplexed streams, headers, two limits, Redis
# stopped, a stream reset and a connection closed while their decisions
# wait, a reload with streams in flight).
#   nginx_redis_test.sh MODULE_SO
# Exit 77 (skipped) when nginx, the module or redis-server is absent;
# under CI=true that is a failure.
set -euo pipefail

MODULE=${1:-}
NGINX=${NGINX:-/usr/sbin/nginx}

# shellcheck source=nginx_lib.sh
. "$(dirname "$0")/nginx_lib.sh"
nginx_needs nginx_redis_test redis

tmp=$(mktemp -d /tmp/nginx_redis_test.XXXXXX)
rpid=
cleanup() {
  stop_nginx a || true
  stop_nginx b || true
  stop_pidfile "$tmp/h2/nginx.pid" || true
  if [ -n "$rpid" ]; then
    kill -CONT "$rpid" 2>/dev/null || true
    kill "$rpid" 2>/dev/null || true
    wait "$rpid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
chmod 755 "$tmp" # the workers run as nobody when started by root


# shellcheck source=lib/servers.sh
. "$(dirname "$0")/lib/servers.sh"
start_redis "$tmp/redis.log" || { cat "$tmp/redis.log"; echo "FAIL: redis-server did not start"; exit 1; }
redis="redis://127.0.0.1:$rport"

# The Redis timeout of the failure zones, and the slack a request may take
# past it on a loaded 2-core machine (a loop turn, the timer's rounding,
# curl's own start).
TIMEOUT_MS=100
SLACK_MS=1500
# The zones whose counts are checked exactly: a timeout a loaded machine's
# round trip does not reach (100 ms did: 3 of a burst's 60 first decisions
# timed out in one loaded run, 503s instead of 429s).
COUNT_TIMEOUT_MS=2000

# conf NAME PORT: the instance's configuration (the same zones in both).
conf() {
  local dir="$tmp/$1"
  cat >"$dir/nginx.conf" <<EOF
load_module $MODULE;
error_log $dir/logs/error.log info;
events { worker_connections 512; }
http {
  log_format rl '\$pid \$status [\$ratelimit_result] \$request_uri \$http_x_key';
  access_log $dir/logs/access.log rl;
  ratelimit_zone fw "fixed-window 10/30d" store=$redis timeout=${COUNT_TIMEOUT_MS}ms;
  ratelimit_zone tb "token-bucket 1/1h burst=10" store=$redis timeout=${COUNT_TIMEOUT_MS}ms;
  ratelimit_zone comp "fixed-window 6/30d; token-bucket 1/1h burst=4" store=$redis timeout=${COUNT_TIMEOUT_MS}ms;
  ratelimit_zone cstep "fixed-window 5/3650d" store=$redis timeout=${COUNT_TIMEOUT_MS}ms;
  ratelimit_zone per_key "fixed-window 5/30d" store=$redis timeout=${COUNT_TIMEOUT_MS}ms;
  ratelimit_zone per_user "fixed-window 3/30d" store=$redis timeout=${COUNT_TIMEOUT_MS}ms;
  ratelimit_zone local "fixed-window 4/30d";
  ratelimit_zone hdr "name=gold token-bucket 1/1h burst=3" store=$redis timeout=${COUNT_TIMEOUT_MS}ms;
  ratelimit_zone two "fixed-window 2/30d" store=$redis timeout=${COUNT_TIMEOUT_MS}ms;
  ratelimit_zone fo "fixed-window 1000/30d" store=$redis timeout=${TIMEOUT_MS}ms;
  ratelimit_zone fc "fixed-window 1000/30d" store=$redis timeout=${TIMEOUT_MS}ms;
  ratelimit_zone slow "fixed-window 1000/30d" store=$redis timeout=1500ms;
  ratelimit_zone lbw "leaky-bucket 2/s capacity=3" store=$redis timeout=${COUNT_TIMEOUT_MS}ms;
  ratelimit_zone back "fixed-window 3/30d" store=$redis timeout=${TIMEOUT_MS}ms prefix=rl:back:;
  ratelimit_zone late "fixed-window 3/30d" store=$redis timeout=${TIMEOUT_MS}ms;
  server {
    listen 127.0.0.1:$2;
    root $dir/html;
    location = /index.html { }
    location /fw/ { ratelimit fw \$http_x_key; try_files /index.html =404; }
    location /tb/ { ratelimit tb \$http_x_key; try_files /index.html =404; }
    location /comp/ { ratelimit comp \$http_x_key; ratelimit_headers on; try_files /index.html =404; }
    location /cstep/ { ratelimit cstep \$http_x_key; try_files /index.html =404; }
    location /both/ {
      ratelimit per_key \$http_x_key;
      ratelimit per_user \$http_x_user;
      try_files /index.html =404;
    }
    location /mixed/ {
      ratelimit per_key \$http_x_key;
      ratelimit local \$http_x_user;
      try_files /index.html =404;
    }
    location /hdr/ { ratelimit hdr \$http_x_key; ratelimit_headers on; try_files /index.html =404; }
    location /shadow/ { ratelimit two \$http_x_key; ratelimit_shadow on; ratelimit_headers on; try_files /index.html =404; }
    location /open/ { ratelimit fo \$http_x_key; ratelimit_fail open; try_files /index.html =404; }
    location /longopen/ { ratelimit two \$http_x_key; ratelimit_fail open; try_files /index.html =404; }
    location /closed/ { ratelimit fc \$http_x_key; ratelimit_fail closed; try_files /index.html =404; }
    location /slow/ { ratelimit slow \$http_x_key; try_files /index.html =404; }
    location /wait/ { ratelimit lbw \$http_x_key wait=2s; try_files /index.html =404; }
    location /late/ { ratelimit late \$http_x_key; ratelimit_fail open; try_files /index.html =404; }
    location /back/ { ratelimit back \$http_x_key; ratelimit_status 503; try_files /index.html =404; }
    location = /status { stub_status; }
  }
}
EOF
}


# start_nginx NAME: sets port_NAME.
start_nginx() {
  local name=$1 dir="$tmp/$1" port
  mkdir -p "$dir/logs" "$dir/html"
  chmod 755 "$dir" "$dir/html"
  echo hello >"$dir/html/index.html"
  if launch_nginx "$dir" 3 conf_here "$name"; then
    eval "port_$name=$port"
    return 0
  fi
  echo "FAIL: nginx $name did not start"
  exit 1
}
conf_here() { conf "$1" "$port"; } # at launch_nginx's port

stop_nginx() { stop_pidfile "$tmp/$1/nginx.pid"; }

# get NAME [CURL ARGS] PATH: the status from instance NAME; headers (CR
# stripped) in $tmp/h.
get() {
  local name=$1 path=${*: -1} pv
  shift
  pv="port_$name"
  curl -s --max-time 10 -H 'Connection: close' -D "$tmp/h" -o /dev/null -w '%{http_code}' \
    "${@:1:$#-1}" "http://127.0.0.1:${!pv}$path"
  sed -i 's/\r$//' "$tmp/h"
}
# alt N [CURL ARGS] PATH: N requests in a row, alternating a, b, a, ...;
# their statuses joined.
alt() {
  local n=$1 out=() i
  shift
  for i in $(seq 1 "$n"); do
    if [ $((i % 2)) -eq 1 ]; then out+=("$(get a "$@")"); else out+=("$(get b "$@")"); fi
  done
  echo "${out[*]}"
}
# burst N KEY PATH: N requests at once (8 at a time), half to each
# instance; the statuses, one a line, in $tmp/burst.
burst() {
  local n=$1 key=$2 path=$3
  seq 1 "$n" | awk -v a="$port_a" -v b="$port_b" -v p="$path" \
    '{ print "http://127.0.0.1:" ($1 % 2 ? a : b) p $1 }' |
    xargs -P 8 -I{} curl -s --max-time 10 -o /dev/null -H 'Connection: close' \
      -H "X-Key: $key" -w '%{http_code}\n' {} >"$tmp/burst"
}
count() { grep -c "^$1\$" "$tmp/burst" || true; }
# fw_count ZONE KEY: the count admitted on a fixed-window zone's key, as
# Redis holds it (the state's 14-byte header, then the count, a u64 little-
# endian: src/step.c, src/algo/fixed_window.c); nothing when there is none.
fw_count() {
  od -An -tu8 -j14 -N8 < <(redis-cli -p "$rport" hget "ratelimit:$1:{$2}" s) | tr -d ' '
}
# wait_count ZONE KEY N: until that count is N (a refund on a Redis zone is
# sent without waiting, the denial answered meanwhile: it lands a round
# trip later), TEST_WAIT_S at most: 0; else the count is printed and 1.
count_is() { [ "$(fw_count "$1" "$2")" = "$3" ]; }
wait_count() {
  wait_until "$TEST_WAIT_S" count_is "$1" "$2" "$3" && return 0
  echo "zone $1, key $2: count '$(fw_count "$1" "$2")', want $3"
  return 1
}
logs() { cat "$tmp/a/logs/access.log" "$tmp/b/logs/access.log"; }

port_a=
port_b=
start_nginx a
start_nginx b
t_start=$(date +%s)

# ---- one limit across both instances and their workers: 60 requests at
# once, half to each; exactly the quota passes.
burst 60 s1 /fw/
expect "shared fw: 200s" "$(count 200)" 10
expect "shared fw: 429s" "$(count 429)" 50
workers=$(logs | grep ' /fw/[0-9]* s1$' | awk '{print $1}' | sort -u | wc -l)
[ "$workers" -ge 3 ] || fail "shared fw: the requests went to $workers worker(s) of 6"
echo "shared fw: 60 requests over $workers workers of two instances, 10 admitted"
burst 40 s2 /tb/
expect "shared tb: 200s" "$(count 200)" 10
expect "shared tb: 429s" "$(count 429)" 30
burst 20 s3 /comp/
expect "shared composite: 200s" "$(count 200)" 4
expect "shared composite: 429s" "$(count 429)" 16
burst 20 s4 /cstep/
expect "shared C step: 200s" "$(count 200)" 5
expect "shared C step: 429s" "$(count 429)" 15

# ---- in sequence, alternating: exactly the quota, then denials; another
# key has its own.
expect "fw in turn" "$(alt 12 -H 'X-Key: q1' /fw/)" \
  "200 200 200 200 200 200 200 200 200 200 429 429"
expect "fw: another key" "$(alt 1 -H 'X-Key: q2' /fw/)" "200"
for i in a b; do
  grep -q '\[error\] .*ratelimit: limiting requests by zone "fw", retry after' "$tmp/$i/logs/error.log" ||
    fail "instance $i: no denial line for zone fw"
done
expect "results" "$(logs | grep ' /fw/ q1$' | awk '{print $3}' | sort | uniq -c | awk '{print $2 $1}' | tr '\n' ' ')" \
  "[allowed]10 [limited]2 "
expect "tb in turn" "$(alt 11 -H 'X-Key: q1' /tb/)" \
  "200 200 200 200 200 200 200 200 200 200 429"

# ---- two Redis limits on a location: both must pass; a denial charges
# neither (the admitted one is refunded).
expect "both: per_user's 3" "$(alt 6 -H 'X-Key: K1' -H 'X-User: U1' /both/)" \
  "200 200 200 429 429 429"
# (a refund on a Redis zone is sent without waiting, the denial answered
# meanwhile: until the three landed, per_key's count 3; the refunds'
# count is checked at the end)
wait_count per_key K1 3 || fail "both: per_key's refunds did not land within 5 s"
expect "both: per_key refunded" "$(alt 3 -H 'X-Key: K1' -H 'X-User: U2' /both/)" \
  "200 200 429"
expect "both: empty user" "$(alt 1 -H 'X-Key: K9' /both/)" "200"
# a Redis limit then a shared-memory one (each instance its own: 4 each),
# the local one decided first: its denial asks Redis nothing (no refund:
# the count at the end has none from here)
expect "mixed: local's 4 on a" "$(for _ in 1 2 3 4 5; do get a -H 'X-Key: M1' -H 'X-User: V1' /mixed/; echo -n ' '; done)" \
  "200 200 200 200 429 "
# per_key (5) was charged 4 by a, not 5: one more passes on b
expect "mixed: Redis not charged" "$(get b -H 'X-Key: M1' -H 'X-User: V2' /mixed/) $(get b -H 'X-Key: M1' -H 'X-User: V3' /mixed/)" \
  "200 429"

# ---- headers: token-bucket 1/1h burst=3, one bucket for both instances.
expect "headers: a" "$(get a -H 'X-Key: h1' /hdr/)" 200
expect "headers: RateLimit-Policy" "$(header RateLimit-Policy)" '"gold";q=3;w=10800'
expect "headers: RateLimit" "$(header RateLimit)" '"gold";r=2;t=3600'
expect "headers: b" "$(get b -H 'X-Key: h1' /hdr/)" 200
expect "headers: b's RateLimit" "$(header RateLimit | sed 's/;t=.*//')" '"gold";r=1'
get a -H 'X-Key: h1' /hdr/ >/dev/null
expect "headers: 4th" "$(get b -H 'X-Key: h1' /hdr/)" 429
expect "headers: 429 RateLimit" "$(header RateLimit | sed 's/;t=.*//')" '"gold";r=0'
ra=$(header Retry-After)
if ! [[ "$ra" =~ ^[0-9]+$ ]] || [ "$ra" -lt 3500 ] || [ "$ra" -gt 3600 ]; then
  fail "headers: Retry-After '$ra', want 3500..3600 (a token in an hour)"
fi
expect "composite headers" "$(get a -H 'X-Key: c9' /comp/)" 200
expect "composite: RateLimit-Policy" "$(header RateLimit-Policy)" '"comp";q=4;w=14400'

# ---- shadow: all pass; the would-be denials are marked and logged.
expect "shadow" "$(alt 5 -H 'X-Key: sh1' /shadow/)" "200 200 200 200 200"
expect "shadow: results" \
  "$(logs | grep ' /shadow/ sh1$' | awk '{print $3}' | sort | uniq -c | awk '{print $2 $1}' | tr '\n' ' ')" \
  "[allowed]2 [shadow]3 "
# (grep reads the files itself: under pipefail, "cat | grep -q" fails when
# grep's early exit kills cat with SIGPIPE)
grep -q 'ratelimit: would limit (shadow) requests by zone "two"' "$tmp/a/logs/error.log" "$tmp/b/logs/error.log" ||
  fail "shadow: no log line"

# ---- a key past RATE_KEY_MAX (512 bytes) is limited under its digest,
# also under ratelimit_fail open (no store error to let it through)
longk=$(printf 'L%.0s' $(seq 1 600))
expect "long key" "$(get a -H "X-Key: $longk" /longopen/) $(get b -H "X-Key: $longk" /longopen/) $(get a -H "X-Key: $longk" /longopen/)" \
  "200 200 429"
grep -q 'zone "two": store error' "$tmp/a/logs/error.log" "$tmp/b/logs/error.log" && fail "long key: a store error"

# ---- wait= on a Redis leaky bucket (capacity 3, 2/s): 4 requests at
# once over both instances: 3 pass, spaced 500 ms apart (the bucket drains
# at its rate from the first: the last leaves 1 s after it), 1 denied (a
# spread of the 4 arrivals under 500 ms: at 10/s, 100 ms, a loaded run
# let the 4th in).
t0=$(date +%s%N)
burst 4 w1 /wait/
ms=$((($(date +%s%N) - t0) / 1000000))
expect "wait: 200s" "$(count 200)" 3
expect "wait: 429s" "$(count 429)" 1
[ "$ms" -ge 900 ] || fail "wait: the 3 admitted took $ms ms, want at least 900"

# ---- prefix=: the zone's keys under its own prefix.
expect "prefix" "$(alt 1 -H 'X-Key: p1' /back/)" 200
[ "$(redis-cli -p "$rport" exists 'rl:back:{p1}')" = 1 ] || fail "prefix=: no key rl:back:{p1}"
[ "$(redis-cli -p "$rport" exists 'ratelimit:fw:{s1}')" = 1 ] || fail "default prefix: no key ratelimit:fw:{s1}"

# ---- HTTP/2 on Redis zones (docs/nginx.md, "HTTP/2"): a third nginx, h
# (2 workers), with zones of the same names as a's and b's (the same keys
# in Redis): plaintext HTTP/2 with prior knowledge on its port (one stream
# a connection) and HTTP/2 over TLS on $tport, where curl multiplexes
# (h2_mux).
hd=$tmp/h2
why=$(h2_missing)
if [ -n "$why" ]; then
  echo "SKIP (HTTP/2 part only): $why"
else
  t_h2=$(date +%s%N)
  h2_prefix "$hd" || fail "h2: openssl made no certificate"
  tport=
  hconf() {
    tport=$(free_port_but "$port")
    cat >"$hd/nginx.conf" <<EOF
load_module $MODULE;
error_log $hd/logs/error.log info;
events { worker_connections 512; }
http {
  log_format rl '\$pid \$server_protocol \$status [\$ratelimit_result] \$request_uri \$http_x_key';
  access_log $hd/logs/access.log rl;
  ratelimit_zone fw "fixed-window 10/30d" store=$redis timeout=${COUNT_TIMEOUT_MS}ms;
  ratelimit_zone per_key "fixed-window 5/30d" store=$redis timeout=${COUNT_TIMEOUT_MS}ms;
  ratelimit_zone per_user "fixed-window 3/30d" store=$redis timeout=${COUNT_TIMEOUT_MS}ms;
  ratelimit_zone hdr "name=gold token-bucket 1/1h burst=3" store=$redis timeout=${COUNT_TIMEOUT_MS}ms;
  ratelimit_zone fo "fixed-window 1000/30d" store=$redis timeout=${TIMEOUT_MS}ms;
  ratelimit_zone fc "fixed-window 1000/30d" store=$redis timeout=${TIMEOUT_MS}ms;
  ratelimit_zone hold "fixed-window 1000/30d" store=$redis timeout=20s;
  ratelimit_zone hsec "leaky-bucket 1/s capacity=5";
  server {
    listen 127.0.0.1:$port http2;
    listen 127.0.0.1:$tport ssl http2;
    ssl_certificate $hd/h2.crt;
    ssl_certificate_key $hd/h2.key;
    root $hd/html;
    location = /index.html { }
    location /fw/ { ratelimit fw \$http_x_key; try_files /index.html =404; }
    location /both/ {
      ratelimit per_key \$http_x_key;
      ratelimit per_user \$http_x_user;
      try_files /index.html =404;
    }
    location /hdr/ { ratelimit hdr \$http_x_key; ratelimit_headers on; try_files /index.html =404; }
    location /open/ { ratelimit fo \$http_x_key; ratelimit_fail open; try_files /index.html =404; }
    location /closed/ { ratelimit fc \$http_x_key; ratelimit_fail closed; try_files /index.html =404; }
    location /hold/ { ratelimit hold \$http_x_key; try_files /index.html =404; }
    location /sec/ { ratelimit hsec \$http_x_key wait=5s; try_files /index.html =404; }
    location = /status { stub_status; }
  }
}
EOF
  }
  ready_args=(--http2-prior-knowledge)
  launch_nginx "$hd" 2 hconf || fail "h2: nginx h did not start"
  ready_args=()
  port_h=$port
  turl="https://127.0.0.1:$tport"
  hlog=$hd/logs/access.log
  # hget [CURL ARGS] PATH: "STATUS HTTP_VERSION" of one request on h's
  # plaintext port; headers (CR stripped) in $tmp/h.
  hget() {
    local path=${*: -1}
    curl -s --http2-prior-knowledge --max-time 10 -D "$tmp/h" -o /dev/null \
      -w '%{http_code} %{http_version}' "${@:1:$#-1}" "http://127.0.0.1:$port_h$path" || true
    sed -i 's/\r$//' "$tmp/h"
  }
  h_workers() { sed -n 's/.*start worker process \([0-9]*\).*/\1/p' "$hd/logs/error.log"; }
  # 30 streams on one connection, a key of their own: exactly fw's 10 pass
  h2_mux "$tmp/hm1" 30 "$turl/fw/" -H 'X-Key: hm1'
  expect "h2 redis: 30 streams, connections" "$(h2_conns "$tmp/hm1")" 1
  expect "h2 redis: 30 streams, 200s" "$(h2_count "$tmp/hm1" 200)" 10
  expect "h2 redis: 30 streams, 429s" "$(h2_count "$tmp/hm1" 429)" 20
  expect "h2 redis: results" \
    "$(grep ' hm1$' "$hlog" | awk '{print $2 $4}' | sort | uniq -c | awk '{print $2 $1}' | tr '\n' ' ')" \
    "HTTP/2.0[allowed]10 HTTP/2.0[limited]20 "
  # one key at once from three HTTP/2 connections to h and 20 HTTP/1.1
  # requests to a and b: 10 pass in all
  hpids=()
  for c in 1 2 3; do
    h2_mux "$tmp/hm2.$c" 20 "$turl/fw/c$c-" -H 'X-Key: hm2' &
    hpids+=($!)
  done
  burst 20 hm2 /fw/
  wait "${hpids[@]}"
  cat "$tmp/hm2.1" "$tmp/hm2.2" "$tmp/hm2.3" >"$tmp/hm2"
  expect "h2 redis: 3x20 streams, connections" "$(h2_conns "$tmp/hm2")" 3
  expect "h2 redis: h2 and HTTP/1.1 on one key, 200s" "$(($(h2_count "$tmp/hm2" 200) + $(count 200)))" 10
  expect "h2 redis: h2 and HTTP/1.1 on one key, 429s" "$(($(h2_count "$tmp/hm2" 429) + $(count 429)))" 70
  # the fields from the Redis token bucket, as an HTTP/2 client gets them
  expect "h2 redis headers: 1st" "$(hget -H 'X-Key: hh1' /hdr/)" "200 2"
  expect "h2 redis headers: RateLimit-Policy" "$(header RateLimit-Policy)" '"gold";q=3;w=10800'
  expect "h2 redis headers: RateLimit" "$(header RateLimit)" '"gold";r=2;t=3600'
  hget -H 'X-Key: hh1' /hdr/ >/dev/null
  hget -H 'X-Key: hh1' /hdr/ >/dev/null
  expect "h2 redis headers: 4th" "$(hget -H 'X-Key: hh1' /hdr/)" "429 2"
  expect "h2 redis headers: 429 RateLimit" "$(header RateLimit | sed 's/;t=.*//')" '"gold";r=0'
  ra=$(header Retry-After)
  if ! [[ "$ra" =~ ^[0-9]+$ ]] || [ "$ra" -lt 3500 ] || [ "$ra" -gt 3600 ]; then
    fail "h2 redis headers: Retry-After '$ra', want 3500..3600"
  fi
  # two Redis limits, multiplexed: per_user's 3 pass, the denials refunded
  h2_mux "$tmp/hm3" 6 "$turl/both/" -H 'X-Key: hK1' -H 'X-User: hU1'
  expect "h2 redis both: 200s" "$(h2_count "$tmp/hm3" 200)" 3
  expect "h2 redis both: 429s" "$(h2_count "$tmp/hm3" 429)" 3
  # (the refunds land a round trip after the denials: until per_key's
  # count is 3)
  wait_count per_key hK1 3 || fail "h2 redis both: per_key's refunds did not land within 5 s"
  h2_mux "$tmp/hm4" 3 "$turl/both/" -H 'X-Key: hK1' -H 'X-User: hU2'
  expect "h2 redis both: per_key refunded, 200s" "$(h2_count "$tmp/hm4" 200)" 2
  expect "h2 redis both: per_key refunded, 429s" "$(h2_count "$tmp/hm4" 429)" 1
  # -- Redis stopped: 20 streams at once on one connection under each fail
  # mode, all answered, each within the timeout + the slack from its being
  # sent (h2_slowest: curl's start and the TLS handshake, which a loaded
  # machine may stretch past the slack, left out; a worker that waited on
  # the stopped Redis past the zone's timeout would show here, and one that
  # hung, at curl's --max-time, 20 s)
  kill -STOP "$rpid"
  for path in /closed/ /open/; do
    h2_mux "$tmp/hm5" 20 "$turl$path" -H "X-Key: hs$path"
    ms=$(h2_slowest "$tmp/hm5")
    if [ "$path" = /open/ ]; then st=200; else st=503; fi
    expect "h2 redis stopped $path: ${st}s" "$(h2_count "$tmp/hm5" $st)" 20
    [ "$ms" -le $((TIMEOUT_MS + SLACK_MS)) ] ||
      fail "h2 redis stopped $path: a stream took $ms ms once sent (timeout ${TIMEOUT_MS} ms + slack ${SLACK_MS} ms)"
    echo "h2 redis stopped $path: 20 streams, the slowest $ms ms once sent"
  done
  # a stream reset (RST_STREAM) and a connection closed while their
  # decisions wait on the stopped Redis (the hold zone's timeout, 20 s, is
  # not reached): nginx must let go of them at once (a 499 within
  # wait_line's 10 s); their late callbacks, once Redis answers, must touch
  # nothing.  /hold/2 waits too and is answered then.  curl resets /hold/1
  # at its --max-time, 2 s, which holds curl's start and the TLS handshake
  # (a loaded machine may take most of a second before the stream is
  # sent).  (curl 7.88 sends the RST_STREAM with its next frames on the
  # connection: the /sec/ streams, on a local leaky bucket of 1/s capacity
  # 5 with wait=, answered at 0, 1, 2, 3 and 4 s, make those, the last two
  # after the reset.)
  rargs=(-s -k --http2 -Z -H 'X-Key: hA' --max-time 2 -o /dev/null -w '%{url} %{http_code}\n' "$turl/hold/1"
    --next -s -k --http2 -H 'X-Key: hB' --max-time 30 -o /dev/null -w '%{url} %{http_code}\n' "$turl/hold/2")
  for i in 0 1 2 3 4; do
    rargs+=(--next -s -k --http2 -H 'X-Key: hS' --max-time 30 -o /dev/null -w '%{url} %{http_code}\n' "$turl/sec/$i")
  done
  curl "${rargs[@]}" >"$tmp/hreset" 2>/dev/null &
  cpid=$!
  wait_line "$hlog" ' 499 \[-\] /hold/1 hA$' ||
    fail "h2 redis reset: the reset stream's request was not let go (no 499 within 10 s)"
  grep -qE 'client (terminated|canceled) stream' "$hd/logs/error.log" ||
    fail "h2 redis reset: nginx saw no RST_STREAM"
  curl -s --http2-prior-knowledge --max-time 2 -H 'X-Key: hC' -o /dev/null \
    "http://127.0.0.1:$port_h/hold/3" || true
  wait_line "$hlog" ' 499 \[-\] /hold/3 hC$' ||
    fail "h2 redis closed: the request was not let go when its connection closed"
  kill -CONT "$rpid"
  wait "$cpid" || true
  expect "h2 redis reset: the other stream, after SIGCONT" "$(sed -n 's|.*/hold/2 ||p' "$tmp/hreset")" 200
  h2_mux "$tmp/hm6" 12 "$turl/fw/" -H 'X-Key: hm6'
  expect "h2 redis after the resets: 200s" "$(h2_count "$tmp/hm6" 200)" 10
  expect "h2 redis after the resets: 429s" "$(h2_count "$tmp/hm6" 429)" 2
  # -- a reload with 10 streams in flight, their decisions waiting on the
  # stopped Redis: the old worker keeps their connection and answers them
  # (200) once Redis is back, then exits.  The /index.html stream, answered
  # at once (its line in the access log), tells that the connection is up;
  # nginx's stub_status, that the 10 streams are in (a stream not yet sent
  # when the old worker's GOAWAY comes would go to a new worker): its
  # requests being processed ("Writing") are the 10 and its own.
  kill -STOP "$rpid"
  old_h=$(h_workers)
  rargs=(-s -k --http2 -Z --max-time 30 -o /dev/null -w '%{url} %{http_code} %{http_version}\n' "$turl/index.html?reload")
  for i in $(seq 1 10); do
    rargs+=(--next -s -k --http2 -H 'X-Key: hR' --max-time 30 -o /dev/null -w '%{url} %{http_code} %{http_version}\n' "$turl/hold/r$i")
  done
  curl "${rargs[@]}" >"$tmp/hreload" 2>/dev/null &
  cpid=$!
  wait_line "$hlog" ' 200 \[-\] /index.html\?reload -$' || fail "h2 reload: the connection did not start"
  h_writing() {
    writing=$(curl -s --http2-prior-knowledge --max-time 10 "http://127.0.0.1:$port_h/status" |
      sed -n 's/.* Writing: \([0-9]*\) .*/\1/p') || true
    [ "${writing:-0}" -ge "$1" ]
  }
  wait_until "$TEST_WAIT_S" h_writing 11 ||
    fail "h2 reload: $((${writing:-1} - 1)) of the 10 streams in nginx within $TEST_WAIT_S s"
  kill -HUP "$(cat "$hd/nginx.pid")"
  h_new_workers() { [ "$(h_workers | wc -l)" -ge $(($(wc -l <<<"$old_h") + 2)) ]; }
  wait_until "$TEST_WAIT_S" h_new_workers
  expect "h2 reload: new workers" "$(($(h_workers | wc -l) - $(wc -l <<<"$old_h")))" 2
  kill -CONT "$rpid"
  wait "$cpid" || true
  expect "h2 reload: the streams in flight answered" "$(grep -c '/hold/r[0-9]* 200 2$' "$tmp/hreload" || true)" 10
  for p in $(grep ' /hold/r[0-9]* hR$' "$hlog" | awk '{print $1}' | sort -u); do
    grep -qx "$p" <<<"$old_h" || fail "h2 reload: a stream in flight was answered by $p, not an old worker"
  done
  old_gone() { gone=1; for p in $old_h; do alive "$p" && gone=0; done; [ "$gone" = 1 ]; }
  gone=0
  wait_until "$TEST_WAIT_S" old_gone
  expect "h2 reload: the old workers exited" "$gone" 1
  if grep -E 'exited on signal|\[alert\]|\[crit\]' "$hd/logs/error.log"; then
    fail "h2 redis: a worker died or nginx alerted"
  fi
  stop_gracefully "$hd/nginx.pid" ||
    fail "h2 redis: nginx h did not stop within 10 s of QUIT (a request left waiting?)"
  echo "HTTP/2 on Redis zones: took $((($(date +%s%N) - t_h2) / 1000000)) ms"
fi

# ---- Redis fails mid-run.  timed NAME PATH KEY: "STATUS MS" of one request.
timed() {
  local name=$1 pv="port_$1" out
  out=$(curl -s --max-time 10 -o /dev/null -H 'Connection: close' -H "X-Key: $3" \
    -w '%{http_code} %{time_total}' "http://127.0.0.1:${!pv}$2") || true
  awk '{ printf "%s %d\n", $1, $2 * 1000 }' <<<"$out"
}
# failing WHAT: 8 requests on each fail mode, alternating the instances;
# each answered (fail open 200, closed 503) within the timeout + slack.
max_ms=0
failing() {
  local what=$1 i name got st ms
  for path in /open/ /closed/; do
    got=()
    for i in 1 2 3 4 5 6 7 8; do
      if [ $((i % 2)) -eq 1 ]; then name=a; else name=b; fi
      read -r st ms <<<"$(timed "$name" "$path" "f$i")"
      got+=("$st")
      [ "$ms" -le "$max_ms" ] || max_ms=$ms
      [ "$ms" -le $((TIMEOUT_MS + SLACK_MS)) ] ||
        fail "$what $path: request $i took $ms ms (timeout ${TIMEOUT_MS} ms + slack ${SLACK_MS} ms)"
    done
    if [ "$path" = /open/ ]; then want="200 200 200 200 200 200 200 200"; else want="503 503 503 503 503 503 503 503"; fi
    expect "$what $path" "${got[*]}" "$want"
  done
}
# recovers WHAT: the limits decide again (a fresh key on /back/: exactly
# 3 pass, then 503 the zone's status), within TEST_WAIT_S.  (ri: a fresh
# key each try.)
both_pass() {
  ri=$((ri + 1))
  [ "$(get a -H "X-Key: $1$ri" "$2")" = 200 ] && [ "$(get b -H "X-Key: $1$ri" "$2")" = 200 ]
}
recovers() {
  local what=$1 key="r$RANDOM" i
  ri=0
  wait_until "$TEST_WAIT_S" both_pass "$key-" /closed/ ||
    fail "$what: Redis back, still no decisions after $TEST_WAIT_S s"
  ri=0
  wait_until "$TEST_WAIT_S" both_pass "$key-b" /back/
  i=$ri
  expect "$what: exact again" "$(alt 4 -H "X-Key: $key-b$i" /back/)" "200 503 503 503"
  burst 20 "$key-fw" /fw/
  expect "$what: shared fw 200s" "$(count 200)" 10
}
# no_hang WHAT: while Redis does not answer, a request on no limit is
# served at once by every worker (8 of them, one a connection).
no_hang() {
  local i name st ms
  for i in 1 2 3 4 5 6 7 8; do
    if [ $((i % 2)) -eq 1 ]; then name=a; else name=b; fi
    read -r st ms <<<"$(timed "$name" /index.html x)"
    expect "$1: no limit" "$st" 200
    [ "$ms" -le "$SLACK_MS" ] || fail "$1: a request on no limit took $ms ms"
  done
}

# -- stopped (SIGSTOP): connections hang; decisions time out, then the
# breaker answers at once.  First a client that gives up while its
# decision is in flight (the slow zone's 1.5 s timeout): its request goes,
# the late callback must touch nothing of it.
kill -STOP "$rpid"
curl -s --max-time 0.3 -o /dev/null -H 'Connection: close' -H 'X-Key: gone' \
  "http://127.0.0.1:$port_a/slow/" || true
curl -s --max-time 0.3 -o /dev/null -H 'Connection: close' -H 'X-Key: gone' \
  "http://127.0.0.1:$port_b/slow/" || true
no_hang "stopped"
failing "stopped"
# store-error lines under load: at most one a second for each zone in a
# worker (6 workers here), whatever the requests: 200 on /open/ (fo)
fo_lines() { cat "$tmp/a/logs/error.log" "$tmp/b/logs/error.log" | grep -c 'zone "fo": store error' || true; }
fo_before=$(fo_lines)
t0=$(date +%s)
burst 200 flood /open/
t1=$(date +%s)
expect "stopped, 200 at once: all let through" "$(count 200)" 200
fo_n=$(($(fo_lines) - fo_before))
# (6 workers, one line a second each over the burst's seconds, +1 each for
# a second boundary crossed; and fewer than one for every other request,
# which a line per request would pass.  The burst's seconds are measured,
# not assumed: on a loaded machine it lasts longer, and a fixed cap of 50
# failed a fresh-root run with 56 lines.)
[ "$fo_n" -le $((6 * (t1 - t0 + 2))) ] && [ "$fo_n" -lt 100 ] ||
  fail "stopped, 200 at once: $fo_n store-error lines for 200 requests"
echo "stopped, 200 requests at once: $fo_n store-error lines in $((t1 - t0 + 1)) s or less"
sleep 1.5 # the slow zone's decisions time out: their callbacks run now
no_hang "stopped, after the abandoned decisions"
results=$(logs | grep -E ' /(open|closed)/ f[0-9]$' | awk '{print $2 $3}' | sort | uniq -c | awk '{print $2 $1}' | tr '\n' ' ')
expect "stopped: results" "$results" "200[error]8 503[error]8 "
# a reload of b while Redis does not answer: its master does not wait for
# Redis (nginx -t, the zones' URLs checked without connecting), and its new
# workers make their Redis zones at once, waiting for nothing: they are up
# and the old ones gone within the slack, and it is the new workers that
# answer every request below, their first decisions store errors under
# each fail mode within the timeout + slack; once Redis answers, their
# counts are exact (the late zone, whose first decision anywhere, and so
# its policy's record, is one of theirs made while Redis was stopped).
worker_pids_b() { sed -n 's/.*start worker process \([0-9]*\).*/\1/p' "$tmp/b/logs/error.log"; }
old_pids=$(worker_pids_b)
before=$(wc -l <<<"$old_pids")
t0=$(date +%s%N)
kill -HUP "$(cat "$tmp/b/nginx.pid")"
b_reloaded() {
  new_pids=$(worker_pids_b | tail -n +$((before + 1)))
  gone=1
  for p in $old_pids; do kill -0 "$p" 2>/dev/null && gone=0; done
  [ "$(grep -c . <<<"$new_pids")" -ge 3 ] && [ "$gone" = 1 ]
}
wait_until "$TEST_WAIT_S" b_reloaded
ms=$((($(date +%s%N) - t0) / 1000000))
expect "reload while stopped: new workers" "$(grep -c . <<<"$new_pids")" 3
expect "reload while stopped: old workers gone" "$gone" 1
[ "$ms" -le "$SLACK_MS" ] || fail "reload while stopped: the new workers took $ms ms (slack ${SLACK_MS} ms)"
echo "reload while Redis is stopped: new workers up, old ones gone, in $ms ms"
nb=$(wc -l <"$tmp/b/logs/access.log")
no_hang "stopped, b reloaded"
failing "stopped, b reloaded"
for i in 1 2 3 4 5 6; do
  read -r st ms <<<"$(timed b /late/ "lz$i")"
  expect "stopped, b reloaded: /late/ (fail open)" "$st" 200
  [ "$ms" -le "$max_ms" ] || max_ms=$ms
  [ "$ms" -le $((TIMEOUT_MS + SLACK_MS)) ] ||
    fail "stopped, b reloaded /late/: request $i took $ms ms (timeout ${TIMEOUT_MS} ms + slack ${SLACK_MS} ms)"
done
served=$(tail -n +$((nb + 1)) "$tmp/b/logs/access.log" | awk '{print $1}' | sort -u)
for p in $served; do
  grep -qx "$p" <<<"$new_pids" || fail "reload while stopped: request answered by $p, not a new worker"
done
expect "stopped, b reloaded: results" \
  "$(tail -n +$((nb + 1)) "$tmp/b/logs/access.log" | grep -E ' /(open|closed|late)/ ' | awk '{print $2 $3}' | sort | uniq -c | awk '{print $2 $1}' | tr '\n' ' ')" \
  "200[error]10 503[error]4 "
echo "reload while stopped: answered by $(grep -c . <<<"$served") new worker(s) of 3"
kill -CONT "$rpid"
recovers "after SIGCONT"
# b's new workers, whose late zone met Redis stopped first: exact now
# (fixed-window 3/30d: a fresh key, 3 pass, then 429)
expect "after SIGCONT: b's new workers exact" \
  "$(for _ in 1 2 3 4 5 6; do get b -H 'X-Key: late1' /late/; echo -n ' '; done)" \
  "200 200 200 429 429 429 "

# -- killed: connections refused at once; then a new redis-server on the
# same port (no scripts, no keys: NOSCRIPT answered with EVAL).
kill -KILL "$rpid"
wait "$rpid" 2>/dev/null || true
rpid=
no_hang "killed"
failing "killed"
# the store-error lines say why (the connection's failure, by address)
grep -q "store error RATE_[A-Z]* (127.0.0.1:$rport: " "$tmp/a/logs/error.log" "$tmp/b/logs/error.log" ||
  fail "killed: no store-error line says why"
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no >>"$tmp/redis.log" 2>&1 &
rpid=$!
wait_until "$TEST_WAIT_S" redis_up_or_gone "$rport" "$rpid"
recovers "after a restart"

# ---- no worker died on the way (a signal would show in the error log).
if grep -h 'exited on signal' "$tmp/a/logs/error.log" "$tmp/b/logs/error.log"; then
  fail "a worker died"
fi

# ---- a graceful stop while a decision is in flight: the request is
# answered (fail closed: 503) before the worker exits.
kill -STOP "$rpid"
curl -s --max-time 10 -o "$tmp/late" -H 'Connection: close' -H 'X-Key: late' \
  -w '%{http_code}' "http://127.0.0.1:$port_a/slow/" >"$tmp/late.status" &
cpid=$!
# until the request is in nginx (stub_status: Writing 2, it and the
# status request's own), not a fixed sleep: a request not yet in when the
# QUIT closes the listening socket would be refused
a_writing() {
  writing=$(curl -s --max-time 10 -H 'Connection: close' "http://127.0.0.1:$port_a/status" |
    sed -n 's/.* Writing: \([0-9]*\) .*/\1/p') || true
  [ "${writing:-0}" -ge 2 ]
}
wait_until "$TEST_WAIT_S" a_writing ||
  fail "graceful stop: the pending request not in nginx within $TEST_WAIT_S s"
stop_nginx a
wait "$cpid" || true
expect "graceful stop: the pending request" "$(cat "$tmp/late.status")" 503
kill -CONT "$rpid"

stop_nginx b
# the refunds on Redis zones, as the workers counted them at their exit:
# 3 on /both/ (none on /mixed/: its local limit is decided first), none
# failed or dropped
refunds=$(cat "$tmp/a/logs/error.log" "$tmp/b/logs/error.log" |
  sed -n 's/.*ratelimit: refunds on Redis zones: \([0-9]*\) made, \([0-9]*\) failed, \([0-9]*\) dropped.*/\1 \2 \3/p' |
  awk '{ m += $1; f += $2; d += $3 } END { printf "%d made, %d failed, %d dropped", m, f, d }')
expect "refunds" "$refunds" "3 made, 0 failed, 0 dropped"
# the line only from a worker that refunded: 6 workers of each instance
# at least (a reload's too) exited, and 3 refunds were made by 3 or fewer
expect "refunds: no line without a refund" \
  "$(cat "$tmp/a/logs/error.log" "$tmp/b/logs/error.log" | grep -c 'refunds on Redis zones: 0 made, 0 failed, 0 dropped' || true)" 0
lines=$(cat "$tmp/a/logs/error.log" "$tmp/b/logs/error.log" | grep -c 'refunds on Redis zones:' || true)
[ "$lines" -ge 1 ] && [ "$lines" -le 3 ] || fail "refunds: $lines exit lines for 3 refunds"
echo "Redis stopped or killed: the slowest answer took $max_ms ms (timeout $TIMEOUT_MS ms)"
echo "nginx_redis_test: took $(($(date +%s) - t_start)) s"
if [ "$fails" -ne 0 ]; then
  echo "nginx_redis_test: $fails failure(s)"
  tail -n 20 "$tmp/a/logs/error.log" "$tmp/b/logs/error.log"
  exit 1
fi
echo "nginx_redis_test: all passed"
