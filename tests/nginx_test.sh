#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The nginx module in Debian's nginx: started with 4 workers on a free
# loopback port, its own prefix and pid file (stopped by pid), driven with
# curl (one connection a request, so that requests spread over the
# workers), every status, header and $ratelimit_result checked against the
# exact expectation: each algorithm, one limit across the workers, limits
# that repeat (nothing charged on a denial), composites, headers, shadow,
# empty keys, the fail modes, the log level, configuration errors, and
# reloads (same size: state kept; a changed size: refused, state kept),
# and HTTP/2 (an nginx of its own: streams multiplexed on one connection
# and on several, headers, two limits, wait=, a stream reset and a
# connection closed while they wait).
#   nginx_test.sh MODULE_SO
# Exit 77 (skipped) when nginx or the module is absent; under CI=true that
# is a failure.
set -euo pipefail

MODULE=${1:-}
NGINX=${NGINX:-/usr/sbin/nginx}

# shellcheck source=nginx_lib.sh
. "$(dirname "$0")/nginx_lib.sh"
nginx_needs nginx_test

tmp=$(mktemp -d /tmp/nginx_test.XXXXXX)
cleanup() {
  stop_nginx || true
  stop_pidfile "$tmp/p/nginx.pid" || true
  stop_pidfile "$tmp/h2/nginx.pid" || true
  rm -rf "$tmp"
}
trap cleanup EXIT
mkdir -p "$tmp/logs" "$tmp/html"
chmod 755 "$tmp" "$tmp/html" # the workers run as nobody when started by root
echo hello >"$tmp/html/index.html"


port=
pidfile="$tmp/nginx.pid"

# conf ZONE_KEYS: writes the configuration (the resize test changes the
# keys of one zone).
conf() {
  local keys=$1
  cat >"$tmp/nginx.conf" <<EOF
load_module $MODULE;
error_log $tmp/logs/error.log info;
events { worker_connections 512; }
http {
  log_format rl '\$pid \$status [\$ratelimit_result] \$request_uri \$http_x_key';
  access_log $tmp/logs/access.log rl;
  ratelimit_zone fw "fixed-window 5/3650d";
  ratelimit_zone sw "sliding-window 5/3650d";
  ratelimit_zone sl "sliding-log 5/3650d";
  ratelimit_zone tb "token-bucket 1/1h burst=5";
  ratelimit_zone lb "leaky-bucket 1/1h capacity=5";
  ratelimit_zone spread "fixed-window 20/3650d" keys=$keys;
  ratelimit_zone per_key "fixed-window 5/3650d";
  ratelimit_zone per_user "fixed-window 3/3650d";
  ratelimit_zone comp "fixed-window 4/3650d; sliding-window 2/3650d";
  ratelimit_zone hdr "name=gold token-bucket 1/1h burst=3";
  ratelimit_zone two "fixed-window 2/3650d";
  ratelimit_zone short "fixed-window 2/3650d" key_max=16;
  ratelimit_zone redir "fixed-window 4/3650d";
  ratelimit_zone lbw "leaky-bucket 2/s capacity=3";
  server {
    listen 127.0.0.1:$port;
    root $tmp/html;
    location = /index.html { }
    location /fw/ { ratelimit fw \$http_x_key; try_files /index.html =404; }
    location /sw/ { ratelimit sw \$http_x_key; try_files /index.html =404; }
    location /sl/ { ratelimit sl \$http_x_key; try_files /index.html =404; }
    location /tb/ { ratelimit tb \$http_x_key; try_files /index.html =404; }
    location /lb/ { ratelimit lb \$http_x_key; try_files /index.html =404; }
    location /spread/ { ratelimit spread \$http_x_key; try_files /index.html =404; }
    location /both/ {
      ratelimit per_key \$http_x_key;
      ratelimit per_user \$http_x_user;
      try_files /index.html =404;
    }
    location /comp/ { ratelimit comp \$http_x_key; ratelimit_headers on; try_files /index.html =404; }
    location /hdr/ { ratelimit hdr \$http_x_key; ratelimit_headers on; try_files /index.html =404; }
    location /nohdr/ { ratelimit hdr \$http_x_key; try_files /index.html =404; }
    location /shadow/ { ratelimit two \$http_x_key; ratelimit_shadow on; ratelimit_headers on; try_files /index.html =404; }
    location /enforced/ { ratelimit two \$http_x_key; ratelimit_status 503; ratelimit_log_level warn; try_files /index.html =404; }
    location /closed/ { ratelimit short \$http_x_key; try_files /index.html =404; }
    location /redir/ { ratelimit redir \$http_x_key; try_files /nonexistent @fallback; }
    location @fallback { ratelimit redir \$http_x_key; ratelimit_headers on; try_files /index.html =404; }
    location /wait/ { ratelimit lbw \$http_x_key wait=2s; try_files /index.html =404; }
    location /open/ { ratelimit short \$http_x_key; ratelimit_fail open; try_files /index.html =404; }
  }
}
EOF
}


start_nginx() {
  launch_nginx "$tmp" 4 conf 1000 && return 0
  echo "FAIL: nginx did not start"
  exit 1
}

stop_nginx() { stop_pidfile "$pidfile"; }

# get [CURL ARGS] PATH: the status; headers (CR stripped) in $tmp/h.
get() {
  local path=${*: -1}
  curl -s -H 'Connection: close' -D "$tmp/h" -o /dev/null -w '%{http_code}' \
    "${@:1:$#-1}" "http://127.0.0.1:$port$path"
  sed -i 's/\r$//' "$tmp/h"
}
# statuses N [CURL ARGS] PATH: N requests in a row, their statuses joined.
statuses() {
  local n=$1 out=() i
  shift
  for i in $(seq 1 "$n"); do out+=("$(get "$@")"); done
  echo "${out[*]}"
}

start_nginx

# ---- each algorithm: exactly its quota, then 429, on one key; another
# key has its own.
for alg in fw sw sl tb; do
  expect "$alg: 7 requests" "$(statuses 7 -H 'X-Key: k1' /$alg/)" \
    "200 200 200 200 200 429 429"
  expect "$alg: another key" "$(statuses 1 -H 'X-Key: k2' /$alg/)" "200"
done
# the leaky bucket with no wait (docs/algorithms.md): one at a time, 1/h
expect "lb: 3 requests" "$(statuses 3 -H 'X-Key: k1' /lb/)" "200 429 429"
expect "lb: another key" "$(statuses 1 -H 'X-Key: k2' /lb/)" "200"

# ---- one limit across the workers: 200 requests, 8 at a time, each on
# its own connection; exactly 20 pass, served by more than one worker.
seq 1 200 | xargs -P 8 -I{} curl -s -o /dev/null -H 'Connection: close' \
  -H 'X-Key: spread' -w '%{http_code}\n' "http://127.0.0.1:$port/spread/{}" \
  >"$tmp/spread"
expect "across workers: 200s" "$(grep -c '^200$' "$tmp/spread")" 20
expect "across workers: 429s" "$(grep -c '^429$' "$tmp/spread")" 180
workers=$(grep ' /spread/' "$tmp/logs/access.log" | awk '{print $1}' | sort -u | wc -l)
[ "$workers" -ge 2 ] || fail "across workers: the 200 requests went to $workers worker(s)"
echo "across workers: 200 requests over $workers workers, 20 admitted"

# ---- two limits on a location: both must pass; a denial charges neither.
expect "both: per_user's 3" "$(statuses 6 -H 'X-Key: K1' -H 'X-User: U1' /both/)" \
  "200 200 200 429 429 429"
# per_key was charged 3, not 6: two more pass for another user
expect "both: per_key refunded" "$(statuses 3 -H 'X-Key: K1' -H 'X-User: U2' /both/)" \
  "200 200 429"
# an empty key is not limited: with no X-User, only per_key applies
expect "both: empty user" "$(statuses 1 -H 'X-Key: K9' /both/)" "200"

# ---- a composite policy: the tighter limit (2) decides; headers name it.
expect "composite" "$(statuses 3 -H 'X-Key: c1' /comp/)" "200 200 429"
expect "composite: RateLimit-Policy" "$(header RateLimit-Policy)" '"comp";q=2;w=315360000'
expect "composite: RateLimit r" "$(header RateLimit | sed 's/;t=.*//')" '"comp";r=0'

# ---- headers: token-bucket 1/1h burst=3, named gold by its text.
expect "headers: 1st" "$(get -H 'X-Key: h1' /hdr/)" 200
expect "headers: RateLimit-Policy" "$(header RateLimit-Policy)" '"gold";q=3;w=10800'
expect "headers: RateLimit" "$(header RateLimit)" '"gold";r=2;t=3600'
expect "headers: no Retry-After when allowed" "$(header Retry-After)" ""
statuses 2 -H 'X-Key: h1' /hdr/ >/dev/null
expect "headers: 4th" "$(get -H 'X-Key: h1' /hdr/)" 429
expect "headers: 429 RateLimit" "$(header RateLimit | sed 's/;t=.*//')" '"gold";r=0'
ra=$(header Retry-After)
if ! [[ "$ra" =~ ^[0-9]+$ ]] || [ "$ra" -lt 3500 ] || [ "$ra" -gt 3600 ]; then
  fail "headers: Retry-After '$ra', want 3500..3600 (a token in an hour)"
fi
expect "headers off" "$(get -H 'X-Key: h2' /nohdr/)" 200
expect "headers off: none" "$(grep -ci '^ratelimit' "$tmp/h" || true)" 0

# ---- shadow: everything passes, the would-be denials are logged and
# marked; the enforced limit on the same zone keeps its own state.
expect "shadow" "$(statuses 5 -H 'X-Key: s1' /shadow/)" "200 200 200 200 200"
expect "shadow: no fields" "$(grep -ci '^ratelimit' "$tmp/h" || true)" 0
# an admitted request under shadow carries none either (a fresh key)
expect "shadow: admitted" "$(get -H 'X-Key: s2' /shadow/)" 200
expect "shadow: admitted, no fields" "$(grep -ci '^ratelimit\|^retry-after' "$tmp/h" || true)" 0
expect "shadow: results" \
  "$(grep ' /shadow/ s1$' "$tmp/logs/access.log" | awk '{print $3}' | tr '\n' ' ')" \
  "[allowed] [allowed] [shadow] [shadow] [shadow] "
grep -q 'ratelimit: would limit (shadow) requests by zone "two"' "$tmp/logs/error.log" ||
  fail "shadow: no log line"
# the library gives a shadow decision no wait: its line names none
grep -q 'would limit (shadow) requests by zone "two", retry' "$tmp/logs/error.log" &&
  fail "shadow: the log line names a wait"
# enforced (status 503, log level warn) on the same key: its own 2
expect "enforced after shadow" "$(statuses 3 -H 'X-Key: s1' /enforced/)" "200 200 503"
grep -q '\[warn\] .*ratelimit: limiting requests by zone "two"' "$tmp/logs/error.log" ||
  fail "log level warn: no [warn] line"
grep -q '\[error\] .*ratelimit: limiting requests by zone "fw"' "$tmp/logs/error.log" ||
  fail "log level: no [error] line by default"
# an enforced line names its wait in ms rounded up: never "0 ms"
grep -q 'limiting requests by zone "two", retry after [1-9][0-9]* ms' "$tmp/logs/error.log" ||
  fail "enforced: the log line names no wait"
grep -q 'retry after 0 ms' "$tmp/logs/error.log" && fail "a denial logged 'retry after 0 ms'"

# ---- an empty key is not limited, and has no result.
expect "empty key" "$(statuses 8 /enforced/)" "200 200 200 200 200 200 200 200"
expect "empty key: result" "$(grep ' /enforced/ -$' "$tmp/logs/access.log" | awk '{print $3}' | sort -u)" "[-]"

# ---- a key longer than the zone keeps (key_max=16) is limited under its
# SHA-1 digest: not a store error (with ratelimit_fail open, a client would
# go unlimited by sending a long key), and not cut (two long keys that
# share their first 16 bytes are two keys).
long=0123456789abcdefXYZ
expect "long key" "$(get -H "X-Key: $long" /closed/) $(get -H "X-Key: $long" /closed/)" "200 200"
expect "long key, fail open: limited" "$(get -H "X-Key: $long" /open/)" 429
expect "long key: another" "$(get -H 'X-Key: 0123456789abcdefUVW' /closed/)" 200
expect "long key: results" \
  "$(grep " $long\$" "$tmp/logs/access.log" | awk '{print $2 $3}' | tr '\n' ' ')" \
  "200[allowed] 200[allowed] 429[limited] "
grep -q 'zone "short": store error' "$tmp/logs/error.log" && fail "long key: a store error"

# ---- an internal redirect (try_files to a named location that applies
# the same zone) is decided once: 4 pass, not 2
expect "internal redirect" "$(statuses 5 -H 'X-Key: r1' /redir/)" "200 200 200 200 429"

# ---- wait= (a reservation): 4 requests at once on a leaky bucket of
# capacity 3 draining 2/s: 3 pass, spaced 500 ms apart (the bucket drains
# at its rate from the first: the last leaves 1 s after it), 1 is denied
# (the queue is full: the 4 arrivals spread over less than 500 ms; at
# 10/s, 100 ms, a late 4th on a loaded machine would be let in).
t0=$(date +%s%N)
seq 1 4 | xargs -P 4 -I{} curl -s -o /dev/null -H 'Connection: close' \
  -H 'X-Key: w1' -w '%{http_code}\n' "http://127.0.0.1:$port/wait/{}" >"$tmp/wait"
ms=$((($(date +%s%N) - t0) / 1000000))
expect "wait: 200s" "$(grep -c '^200$' "$tmp/wait")" 3
expect "wait: 429s" "$(grep -c '^429$' "$tmp/wait")" 1
[ "$ms" -ge 900 ] || fail "wait: the 3 admitted took $ms ms, want at least 900"
echo "wait: 4 requests at once took $ms ms"

# ---- configuration errors: nginx -t names them.
bad() { # bad WHAT DIRECTIVE EXPECTED
  printf 'load_module %s;\nevents {}\nhttp {\n%s\n}\n' "$MODULE" "$2" >"$tmp/bad.conf"
  if "$NGINX" -t -p "$tmp" -c "$tmp/bad.conf" -g "pid $tmp/bad.pid;" >"$tmp/bad.out" 2>&1; then
    fail "$1: accepted"
  elif ! grep -qF "$3" "$tmp/bad.out"; then
    fail "$1: '$(cat "$tmp/bad.out")' does not say '$3'"
  fi
}
# limit_req's spelling of a rate: the error says how to write it here
bad nginxrate 'ratelimit_zone r "token-bucket 10r/s burst=20";' \
  "(write 10/s: no 'r' before the '/', as nginx's limit_req has)"
bad redisport 'ratelimit_zone r "fixed-window 5/1h" store=redis://127.0.0.1:99999;' \
  'port is not a number from 1 to 65535'
# a password in a URL is never logged: masked as ***
bad redispw 'ratelimit_zone r "fixed-window 5/1h" store=redis://me:s3cret@127.0.0.1:99999;' \
  'store=redis://me:***@127.0.0.1:99999: '
grep -q s3cret "$tmp/bad.out" && fail "redispw: the password is logged: $(cat "$tmp/bad.out")"
bad redispw2 'ratelimit_zone r "fixed-window 5/1h" store=redis+tls://:s3cret@127.0.0.1:1;' \
  'unknown store "redis+tls://:***@127.0.0.1:1"'
grep -q s3cret "$tmp/bad.out" && fail "redispw2: the password is logged: $(cat "$tmp/bad.out")"
bad rediss 'ratelimit_zone r "fixed-window 5/1h" store=rediss://127.0.0.1:6379;' \
  'TLS (rediss://) is not supported'
bad redistimeout 'ratelimit_zone r "fixed-window 5/1h" store=redis://127.0.0.1:1 timeout=0ms;' \
  '"timeout=0ms": takes a duration from 1ms to 60s'
bad redisdur 'ratelimit_zone r "fixed-window 5/1h" store=redis://127.0.0.1:1 timeout=soon;' \
  'ratelimit_zone "r": "timeout=soon":'
bad rediskeys 'ratelimit_zone r "fixed-window 5/1h" store=redis://127.0.0.1:1 keys=5;' \
  '"keys=5" is for the shared-memory store'
bad shmtimeout 'ratelimit_zone r "fixed-window 5/1h" timeout=50ms;' \
  'timeout= and prefix= are for a Redis store'
bad store 'ratelimit_zone r "fixed-window 5/1h" store=disk;' 'unknown store "disk"'
bad policy 'ratelimit_zone r "fixed-window 5/fortnight";' 'ratelimit_zone "r": bad policy'
bad keys 'ratelimit_zone r "fixed-window 5/1h" keys=0;' 'keys= takes a positive whole number'
# a key_max below a policy record's 4 bytes: said so, not "the store refuses"
bad keymax 'ratelimit_zone r "fixed-window 5/1h" key_max=3;' 'key_max= takes a whole number from 4 to 512'
bad param 'ratelimit_zone r "fixed-window 5/1h" size=10m;' 'unknown parameter "size=10m"'
bad dup 'ratelimit_zone r "fixed-window 5/1h"; ratelimit_zone r "fixed-window 5/1h";' \
  'duplicate ratelimit_zone "r"'
# a parameter given twice is refused (the last one would silently win:
# a Redis zone turned into this host's own), the URL's password masked
bad twice 'ratelimit_zone r "fixed-window 5/1h" store=redis://me:s3cret@127.0.0.1:1 store=shm;' \
  '"store=shm": store= is given twice (first as "store=redis://me:***@127.0.0.1:1")'
grep -q s3cret "$tmp/bad.out" && fail "twice: the password is logged: $(cat "$tmp/bad.out")"
bad twicekeys 'ratelimit_zone r "fixed-window 5/1h" keys=5 keys=10;' \
  '"keys=10": keys= is given twice (first as "keys=5")'
bad twicetimeout 'ratelimit_zone r "fixed-window 5/1h" store=redis://127.0.0.1:1 timeout=1s prefix=a: timeout=2s;' \
  '"timeout=2s": timeout= is given twice (first as "timeout=1s")'
bad zone 'server { listen 127.0.0.1:1; location / { ratelimit nope $uri; } }' \
  'no ratelimit_zone "nope"'
bad emptykey 'ratelimit_zone r "fixed-window 5/1h"; ratelimit r "";' \
  'ratelimit: zone "r": the key is "", which limits no request'
bad fail 'ratelimit_fail maybe;' '"maybe" is neither open nor closed'
# nginx's own slots would say only 'value must be between 400 and 599'
# or 'invalid value "debug"': each error names its directive
bad status 'ratelimit_status 200;' 'ratelimit_status: "200" is not a status from 400 to 599'
bad statusword 'ratelimit_status many;' 'ratelimit_status: "many" is not a status from 400 to 599'
bad loglevel 'ratelimit_log_level debug;' 'ratelimit_log_level: "debug" is none of info, notice, warn, error'
bad wait 'ratelimit_zone r "fixed-window 5/1h"; ratelimit r $uri wait=soon;' 'ratelimit: "wait=soon":'
bad waitparam 'ratelimit_zone r "fixed-window 5/1h"; ratelimit r $uri delay=1s;' 'unknown parameter "delay=1s"'
# wait= twice is refused as such (it was an "unknown parameter", and
# after wait=0 the second one silently won)
bad waittwice 'ratelimit_zone r "fixed-window 5/1h"; ratelimit r $uri wait=1s wait=2s;' \
  'ratelimit "r": "wait=2s": wait= is given twice (first as "wait=1s")'
bad waitzero 'ratelimit_zone r "fixed-window 5/1h"; ratelimit r $uri wait=0 wait=2s;' \
  'ratelimit "r": "wait=2s": wait= is given twice (first as "wait=0")'

# ---- each shared-memory zone's size, logged at notice by nginx -t; a
# sliding log's grows with its limit
printf 'load_module %s;\nevents {}\nhttp {\nratelimit_zone m "token-bucket 10/s burst=20";\nratelimit_zone l "sliding-log 100/1m";\n}\n' \
  "$MODULE" >"$tmp/size.conf"
"$NGINX" -t -p "$tmp" -c "$tmp/size.conf" -g "pid $tmp/bad.pid;" >"$tmp/size.out" 2>&1 || fail "size: nginx -t: $(cat "$tmp/size.out")"
size_m=$(sed -n 's/.*ratelimit_zone "m": \([0-9]*\) bytes of shared memory for keys=10000 key_max=128 (\([0-9]*\) bytes a key).*/\1 \2/p' "$tmp/size.out")
size_l=$(sed -n 's/.*ratelimit_zone "l": \([0-9]*\) bytes of shared memory.*/\1/p' "$tmp/size.out")
read -r m_bytes m_per <<<"$size_m"
[ -n "$m_bytes" ] && [ "$m_per" -eq $((m_bytes / 10000)) ] && [ "$m_per" -gt 100 ] ||
  fail "size: no zone size line for m: $(cat "$tmp/size.out")"
[ -n "$size_l" ] && [ "$size_l" -gt $((5 * m_bytes)) ] ||
  fail "size: the sliding log's zone ($size_l) is not larger than 5x the bucket's ($m_bytes)"
echo "zone sizes: token bucket $m_bytes bytes ($m_per a key), sliding-log 100/1m $size_l bytes"

# ---- a worker killed (SIGKILL) mid-run: the master starts another, which
# attaches to the zone; the keys are as they were.
started() { grep -c 'start worker process' "$tmp/logs/error.log" || true; }
started_over() { [ "$(started)" -gt "$1" ]; }
before=$(started)
victim=$(awk '{print $1}' "$tmp/logs/access.log" | sort -u | sed -n 1p) # a worker's $pid
kill -KILL "$victim"
wait_until "$TEST_WAIT_S" started_over "$before"
[ "$(started)" -gt "$before" ] || fail "killed worker: not restarted"
expect "killed worker: keys kept" "$(statuses 4 -H 'X-Key: spread' /spread/)" "429 429 429 429"
expect "killed worker: fw kept" "$(statuses 4 -H 'X-Key: k2' /fw/)" "200 200 200 200"
expect "killed worker: fw limited" "$(statuses 1 -H 'X-Key: k2' /fw/)" "429"

# ---- reloads (started: the number of workers started so far).
before=$(started)
# same configuration (same sizes): the zones are kept, with their keys
kill -HUP "$(cat "$pidfile")"
wait_until "$TEST_WAIT_S" started_over $((before + 3))
[ "$(started)" -ge $((before + 4)) ] || fail "reload: no new workers"
expect "reload kept the keys" "$(statuses 2 -H 'X-Key: k1' /fw/)" "429 429"
expect "reload kept across workers" "$(statuses 1 -H 'X-Key: spread' /spread/)" "429"
expect "reload: new key" "$(statuses 1 -H 'X-Key: k3' /fw/)" "200"
# a changed size (keys=): refused with a message; the old configuration
# and its state go on
conf 5000
before=$(started)
kill -HUP "$(cat "$pidfile")"
wait_line "$tmp/logs/error.log" 'a reload cannot resize'
grep -q 'ratelimit_zone "spread": its size would change from' "$tmp/logs/error.log" ||
  fail "resize: no message"
sleep 0.3 # (a grace for a wrong outcome, new workers, to show: none may come)
expect "resize: no new workers" "$(started)" "$before"
expect "resize: state kept" "$(statuses 1 -H 'X-Key: spread' /spread/)" "429"
expect "resize: still serving" "$(statuses 1 -H 'X-Key: fresh' /spread/)" "200"

stop_nginx

# ---- a zone's policy records (docs/nginx.md, "Reloads"): each policy text
# a zone had since nginx started takes one of its 64; 64 reloads that each
# change the policy work, the next one's decisions are store errors
# (RATE_EFULL), whose line says why.  Its own nginx, one worker.
mkdir -p "$tmp/p/logs" "$tmp/p/html"
chmod 755 "$tmp/p" "$tmp/p/html"
echo hello >"$tmp/p/html/index.html"
pconf() { # pconf LIMIT: the zone's policy, fixed-window LIMIT/1h
  cat >"$tmp/p/nginx.conf" <<EOF
load_module $MODULE;
error_log $tmp/p/logs/error.log info;
events { worker_connections 64; }
http {
  access_log off;
  ratelimit_zone pr "fixed-window $1/1h";
  server {
    listen 127.0.0.1:$port;
    root $tmp/p/html;
    location = /index.html { }
    location /pr/ { ratelimit pr \$http_x_key; add_header X-Conf $1 always; try_files /index.html =404; }
    location /po/ { ratelimit pr \$http_x_key; ratelimit_fail open; add_header X-Conf $1 always; try_files /index.html =404; }
  }
}
EOF
}
launch_nginx "$tmp/p" 1 pconf 1 || fail "policy records: nginx did not start"
# pget KEY [PATH]: "STATUS CONF" of a request on PATH (default /pr/; CONF:
# the LIMIT of the configuration of the worker that answered)
pget() {
  curl -s -o /dev/null -D - -H 'Connection: close' -H "X-Key: $1" \
    "http://127.0.0.1:$port${2:-/pr/}" | tr -d '\r' |
    sed -n 's/^HTTP\/1.1 \([0-9]*\).*/\1/p; s/^X-Conf: //p' | tr '\n' ' '
}
# conf_answers KEY N [PATH]: a worker of configuration N answered (in got)
conf_answers() { got=$(pget "$1" "${3:-/pr/}"); [ "${got#* }" = "$2 " ]; }
got=$(pget p1)
expect "policy records: the first policy" "${got%% *}" 200
for i in $(seq 2 65); do
  pconf "$i"
  kill -HUP "$(cat "$tmp/p/nginx.pid")"
  # until a worker of this configuration answers (the old ones' requests
  # write nothing new: their policies have their records)
  wait_until "$TEST_WAIT_S" conf_answers "p$i" "$i"
  if [ "${got#* }" != "$i " ]; then
    fail "policy records: no worker of configuration $i answered: '$got'"
    break
  fi
  if [ "$i" -le 64 ] && [ "${got%% *}" != 200 ]; then
    fail "policy records: policy $i: '$got', want 200"
    break
  fi
done
expect "policy records: the 65th policy" "${got%% *}" 503
# the same store error under ratelimit_fail open: let through (by a worker
# of configuration 65: one of 64 may still answer while it stops)
wait_until "$TEST_WAIT_S" conf_answers p65 65 /po/
expect "policy records: fail open" "$got" "200 65 "
grep -q 'ratelimit: zone "pr": store error RATE_EFULL (the zone.s 64 policy records are used: each policy text it had since nginx started takes one; restart nginx), denied' "$tmp/p/logs/error.log" ||
  fail "policy records: no line that says why: $(grep 'store error' "$tmp/p/logs/error.log" | head -1)"
stop_pidfile "$tmp/p/nginx.pid"

# ---- HTTP/2 (docs/nginx.md, "HTTP/2"): an nginx of its own, 2 workers,
# plaintext HTTP/2 with prior knowledge on $port (one stream a connection)
# and HTTP/2 over TLS on $tport, where curl multiplexes (h2_mux).
h2=$tmp/h2
why=$(h2_missing)
if [ -n "$why" ]; then
  echo "SKIP (HTTP/2 part only): $why"
else
  t_h2=$(date +%s%N)
  h2_prefix "$h2" || fail "h2: openssl made no certificate"
  tport=
  h2conf() {
    tport=$(free_port_but "$port")
    cat >"$h2/nginx.conf" <<EOF
load_module $MODULE;
error_log $h2/logs/error.log info;
events { worker_connections 512; }
http {
  log_format rl '\$pid \$server_protocol \$status [\$ratelimit_result] \$request_uri \$http_x_key';
  access_log $h2/logs/access.log rl;
  ratelimit_zone h2fw "fixed-window 10/3650d";
  ratelimit_zone h2hdr "name=gold token-bucket 1/1h burst=3";
  ratelimit_zone h2key "fixed-window 5/3650d";
  ratelimit_zone h2user "fixed-window 3/3650d";
  ratelimit_zone h2lbw "leaky-bucket 2/s capacity=3";
  ratelimit_zone h2hold "leaky-bucket 1/1m capacity=5";
  ratelimit_zone h2sec "leaky-bucket 1/s capacity=5";
  server {
    listen 127.0.0.1:$port http2;
    listen 127.0.0.1:$tport ssl http2;
    ssl_certificate $h2/h2.crt;
    ssl_certificate_key $h2/h2.key;
    root $h2/html;
    location = /index.html { }
    location /fw/ { ratelimit h2fw \$http_x_key; try_files /index.html =404; }
    location /hdr/ { ratelimit h2hdr \$http_x_key; ratelimit_headers on; try_files /index.html =404; }
    location /both/ {
      ratelimit h2key \$http_x_key;
      ratelimit h2user \$http_x_user;
      try_files /index.html =404;
    }
    location /wait/ { ratelimit h2lbw \$http_x_key wait=2s; try_files /index.html =404; }
    location /hold/ { ratelimit h2hold \$http_x_key wait=10m; try_files /index.html =404; }
    location /sec/ { ratelimit h2sec \$http_x_key wait=5s; try_files /index.html =404; }
  }
}
EOF
  }
  ready_args=(--http2-prior-knowledge)
  launch_nginx "$h2" 2 h2conf || fail "h2: nginx did not start"
  ready_args=()
  turl="https://127.0.0.1:$tport"
  # h2get [CURL ARGS] PATH: "STATUS HTTP_VERSION" of one request on the
  # plaintext port; headers (CR stripped) in $tmp/h.
  h2get() {
    local path=${*: -1}
    curl -s --http2-prior-knowledge --max-time 10 -D "$tmp/h" -o /dev/null \
      -w '%{http_code} %{http_version}' "${@:1:$#-1}" "http://127.0.0.1:$port$path" || true
    sed -i 's/\r$//' "$tmp/h"
  }
  h2log=$h2/logs/access.log
  # 30 streams on one connection, one key: exactly the limit's 10 pass
  h2_mux "$tmp/m1" 30 "$turl/fw/" -H 'X-Key: m1'
  expect "h2: 30 streams, connections" "$(h2_conns "$tmp/m1")" 1
  expect "h2: 30 streams, 200s" "$(h2_count "$tmp/m1" 200)" 10
  expect "h2: 30 streams, 429s" "$(h2_count "$tmp/m1" 429)" 20
  expect "h2: results" \
    "$(grep ' m1$' "$h2log" | awk '{print $2 $4}' | sort | uniq -c | awk '{print $2 $1}' | tr '\n' ' ')" \
    "HTTP/2.0[allowed]10 HTTP/2.0[limited]20 "
  # 3 connections at once, 20 streams each, one key: 10 pass in all
  m2pids=()
  for c in 1 2 3; do
    h2_mux "$tmp/m2.$c" 20 "$turl/fw/c$c-" -H 'X-Key: m2' &
    m2pids+=($!)
  done
  wait "${m2pids[@]}"
  cat "$tmp/m2.1" "$tmp/m2.2" "$tmp/m2.3" >"$tmp/m2"
  expect "h2: 3x20 streams, connections" "$(h2_conns "$tmp/m2")" 3
  expect "h2: 3x20 streams, 200s" "$(h2_count "$tmp/m2" 200)" 10
  expect "h2: 3x20 streams, 429s" "$(h2_count "$tmp/m2" 429)" 50
  # the fields, as an HTTP/2 client gets them (names in lower case)
  expect "h2 headers: 1st" "$(h2get -H 'X-Key: h1' /hdr/)" "200 2"
  expect "h2 headers: RateLimit-Policy" "$(header RateLimit-Policy)" '"gold";q=3;w=10800'
  expect "h2 headers: RateLimit" "$(header RateLimit)" '"gold";r=2;t=3600'
  grep -q '^ratelimit-policy: ' "$tmp/h" || fail "h2 headers: no lower-case ratelimit-policy field"
  h2get -H 'X-Key: h1' /hdr/ >/dev/null
  h2get -H 'X-Key: h1' /hdr/ >/dev/null
  expect "h2 headers: 4th" "$(h2get -H 'X-Key: h1' /hdr/)" "429 2"
  expect "h2 headers: 429 RateLimit" "$(header RateLimit | sed 's/;t=.*//')" '"gold";r=0'
  ra=$(header Retry-After)
  if ! [[ "$ra" =~ ^[0-9]+$ ]] || [ "$ra" -lt 3500 ] || [ "$ra" -gt 3600 ]; then
    fail "h2 headers: Retry-After '$ra', want 3500..3600"
  fi
  # two limits, multiplexed: per-user's 3 pass; the denials charge nothing
  h2_mux "$tmp/m3" 6 "$turl/both/" -H 'X-Key: K1' -H 'X-User: U1'
  expect "h2 both: 200s" "$(h2_count "$tmp/m3" 200)" 3
  expect "h2 both: 429s" "$(h2_count "$tmp/m3" 429)" 3
  h2_mux "$tmp/m4" 3 "$turl/both/" -H 'X-Key: K1' -H 'X-User: U2'
  expect "h2 both: per-key refunded, 200s" "$(h2_count "$tmp/m4" 200)" 2
  expect "h2 both: per-key refunded, 429s" "$(h2_count "$tmp/m4" 429)" 1
  # wait=: 4 streams at once on a leaky bucket of 3 draining 2/s: 3 pass,
  # the last 1 s after the first (so at least 900 ms); 1 denied (the 4
  # within 500 ms, as above)
  t0=$(date +%s%N)
  h2_mux "$tmp/m5" 4 "$turl/wait/" -H 'X-Key: w1'
  ms=$((($(date +%s%N) - t0) / 1000000))
  expect "h2 wait: connections" "$(h2_conns "$tmp/m5")" 1
  expect "h2 wait: 200s" "$(h2_count "$tmp/m5" 200)" 3
  expect "h2 wait: 429s" "$(h2_count "$tmp/m5" 429)" 1
  [ "$ms" -ge 900 ] || fail "h2 wait: the 3 admitted took $ms ms, want at least 900"
  # A stream reset while it waits (wait=): the hold bucket admits one at
  # once, then one a minute.  /hold/1 waits and curl resets it (RST_STREAM)
  # at its --max-time, 2 s (curl's start and the TLS handshake inside it:
  # a loaded machine may take most of a second before the stream is sent),
  # while /hold/2, waiting too, keeps the connection open: nginx must let
  # go of the request at once (a 499 logged within wait_line's 10 s, not
  # after its minute).  (curl 7.88 sends the RST_STREAM with its next
  # frames on the connection: the /sec/ streams, answered at 0, 1, 2, 3
  # and 4 s by a leaky bucket of 1/s capacity 5 with wait=, make those,
  # the last two after the reset.)  Then curl is killed, which closes the
  # connection with /hold/2 waiting: let go too.
  expect "h2 reset: the first" "$(h2get -H 'X-Key: r1' /hold/0)" "200 2"
  rargs=(-s -k --http2 -Z -H 'X-Key: r1' --max-time 2 -o /dev/null "$turl/hold/1"
    --next -s -k --http2 -H 'X-Key: r1' --max-time 30 -o /dev/null "$turl/hold/2")
  for i in 0 1 2 3 4; do
    rargs+=(--next -s -k --http2 -H 'X-Key: r1' --max-time 30 -o /dev/null "$turl/sec/$i")
  done
  curl "${rargs[@]}" >/dev/null 2>&1 &
  cpid=$!
  wait_line "$h2log" ' 499 \[allowed\] /hold/1 r1$' ||
    fail "h2 reset: the reset stream's request was not let go (no 499 within 10 s)"
  grep -qE 'client (terminated|canceled) stream' "$h2/logs/error.log" ||
    fail "h2 reset: nginx saw no RST_STREAM"
  kill "$cpid" 2>/dev/null || true
  wait "$cpid" 2>/dev/null || true
  wait_line "$h2log" ' 499 \[allowed\] /hold/2 r1$' ||
    fail "h2 closed: a waiting stream's request was not let go when its connection closed"
  # plaintext, one stream, the connection closed while it waits
  curl -s --http2-prior-knowledge --max-time 2 -H 'X-Key: r1' -o /dev/null \
    "http://127.0.0.1:$port/hold/3" || true
  wait_line "$h2log" ' 499 \[allowed\] /hold/3 r1$' ||
    fail "h2 closed (prior knowledge): the waiting request was not let go"
  # still serving, and exact
  expect "h2 after the resets: a fresh key" "$(h2get -H 'X-Key: r2' /hold/0)" "200 2"
  h2_mux "$tmp/m6" 12 "$turl/fw/" -H 'X-Key: m6'
  expect "h2 after the resets: 200s" "$(h2_count "$tmp/m6" 200)" 10
  expect "h2 after the resets: 429s" "$(h2_count "$tmp/m6" 429)" 2
  if grep -E 'exited on signal|\[alert\]|\[crit\]' "$h2/logs/error.log"; then
    fail "h2: a worker died or nginx alerted"
  fi
  stop_gracefully "$h2/nginx.pid" ||
    fail "h2: nginx did not stop within 10 s of QUIT (a request left waiting?)"
  echo "HTTP/2: took $((($(date +%s%N) - t_h2) / 1000000)) ms"
fi

if [ "$fails" -ne 0 ]; then
  echo "nginx_test: $fails failure(s)"
  tail -n 20 "$tmp/logs/error.log"
  exit 1
fi
echo "nginx_test: all passed"
