#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The nginx module's fair zones (ratelimit_zone ... fair; docs/nginx.md,
# docs/fair.md) in Debian's nginx with 4 workers, from outside with curl:
# one budget of 10 (it does not refill during the test) shared by every
# key.  A light key that asked once keeps its reserve while a heavy key
# sends 20 requests: the heavy key gets 8 and the light key its second
# request too, whichever workers answer; a plain zone with the key as
# one constant (first come, first served) gives the heavy key 9 and
# refuses the light one.  A weight from a variable (weight=$http_x_weight):
# two keys asking in turn on a fresh budget, weights 1 and 3.  Bad
# directives are refused by nginx -t with a message naming them.  Page
# loads of 20 requests beside wrk at full speed from another key.
#   fair_nginx_test.sh MODULE
set -euo pipefail

MODULE=${1:-}
NGINX=${NGINX:-/usr/sbin/nginx}
# shellcheck source=nginx_lib.sh
. "$(dirname "$0")/nginx_lib.sh"
nginx_needs fair_nginx_test

tmp=$(mktemp -d /tmp/fair_nginx_test.XXXXXX)
cleanup() {
  stop_pidfile "$tmp/nginx.pid" || true
  rm -rf "$tmp"
}
trap cleanup EXIT
mkdir -p "$tmp/logs" "$tmp/html"
chmod 755 "$tmp" "$tmp/html"
echo hello >"$tmp/html/index.html"
port=

conf() {
  cat >"$tmp/nginx.conf" <<EOT
load_module $MODULE;
error_log $tmp/logs/error.log info;
events { worker_connections 512; }
http {
  access_log off;
  ratelimit_zone up "token-bucket 10/1d burst=10" fair;
  ratelimit_zone wup "token-bucket 10/1d burst=10" fair;
  ratelimit_zone plain "token-bucket 10/1d burst=10";
  server {
    listen 127.0.0.1:$port;
    root $tmp/html;
    location = /index.html { }
    location /fair/ { ratelimit up \$http_x_key; try_files /index.html =404; }
    location /weighted/ { ratelimit wup \$http_x_key weight=\$http_x_weight; try_files /index.html =404; }
    location /plain/ { ratelimit plain shared; try_files /index.html =404; }
  }
}
EOT
}
launch_nginx "$tmp" 4 conf || { echo "FAIL: nginx did not start"; exit 1; }
get() { # get PATH KEY [WEIGHT]
  curl -s -o /dev/null -w '%{http_code}' -H "X-Key: $2" -H "X-Weight: ${3:-}" \
    "http://127.0.0.1:$port$1"
}
run() { # run PATH: "HEAVY_ADMITTED LIGHT_SECOND_STATUS"
  expect "$1: light, first" "$(get "$1" light)" 200
  local n=0
  for _ in $(seq 1 20); do
    [ "$(get "$1" heavy)" = 200 ] && n=$((n + 1))
  done
  echo "$n $(get "$1" light)"
}
# (7: the heavy key's first requests count as light until it asks past
# its share, and the zone keeps an eighth of the budget for light keys)
expect "fair zone" "$(run /fair/)" "7 200"
expect "plain zone" "$(run /plain/)" "9 429"

# weights from a variable: carol weighs 3, alice 1 (no header: 1), asking
# in turn; the 10 permits go 7:3 or 8:2 (the reserve grows with what each
# asked), where equal weights would split them 5:5
a=0 c=0
for _ in $(seq 1 10); do
  [ "$(get /weighted/ alice)" = 200 ] && a=$((a + 1))
  [ "$(get /weighted/ carol 3)" = 200 ] && c=$((c + 1))
done
if [ $((a + c)) = 10 ] && [ "$c" -ge 6 ]; then :; else fail "weights 1:3 gave $a:$c"; fi
stop_pidfile "$tmp/nginx.pid"

# a page load beside a scraper: wrk asks as fast as it can (far past 50
# times the limit) from one key while a browser-like client loads pages
# of 20 requests at once (curl, in parallel) every second from its own.
# The fair zone keeps the room a page needs once it has seen one: from
# the second page on, every request of every page is admitted, and the
# scraper still gets most of the limit.  A plain zone keyed the same way
# (one shared key) gives the pages almost nothing.
if command -v wrk >/dev/null; then
  pconf() {
    cat >"$tmp/nginx.conf" <<EOT
load_module $MODULE;
error_log $tmp/logs/error.log info;
events { worker_connections 512; }
http {
  access_log off;
  ratelimit_zone pages "token-bucket 50/s burst=50" fair;
  ratelimit_zone one "token-bucket 50/s burst=50";
  server {
    listen 127.0.0.1:$port;
    root $tmp/html;
    location /fair/ { ratelimit pages \$http_x_key; try_files /index.html =404; }
    location /plain/ { ratelimit one shared; try_files /index.html =404; }
  }
}
EOT
  }
  page() { # page PATH: the number of the page's 20 requests admitted
    local urls=() i
    for i in $(seq 1 20); do urls+=(-o /dev/null "http://127.0.0.1:$port$1?asset=$i"); done
    curl -s -S -Z --no-progress-meter --parallel-max 20 -H "X-Key: browser" \
      -w '%{http_code}\n' \
      "${urls[@]}" | grep -c '^200$' || true
  }
  pages() { # pages PATH: "FIRST LATER" admitted of 20 and of 4 x 20
    wrk -t1 -c2 -d7s -H "X-Key: scraper" "http://127.0.0.1:$port$1" \
      >"$tmp/wrk.out" 2>&1 &
    local wpid=$! first later=0
    sleep 1
    first=$(page "$1")
    for _ in 1 2 3 4; do sleep 1; later=$((later + $(page "$1"))); done
    wait "$wpid"
    echo "$first $later"
  }
  launch_nginx "$tmp" 4 pconf || { echo "FAIL: nginx did not start"; exit 1; }
  read -r first later <<<"$(pages /fair/)"
  grep -q "Requests/sec" "$tmp/wrk.out" || fail "wrk did not run: $(cat "$tmp/wrk.out")"
  if [ "$later" -eq 80 ]; then :; else fail "fair zone: pages got $later of 80 (the first $first of 20) beside wrk"; fi
  read -r _ plain <<<"$(pages /plain/)"
  if [ "$plain" -lt 40 ]; then :; else fail "plain zone: pages got $plain of 80 beside wrk"; fi
  stop_pidfile "$tmp/nginx.pid"
fi

# bad directives: nginx -t names them
bad() { # bad WHAT DIRECTIVES...
  local what=$1; shift
  cat >"$tmp/bad.conf" <<EOT
load_module $MODULE;
events { }
http {
  $1
  server { listen 127.0.0.1:1; location / { $2 } }
}
EOT
  if "$NGINX" -t -p "$tmp" -c "$tmp/bad.conf" >"$tmp/out" 2>&1; then
    fail "nginx -t took: $1 $2"
  elif ! grep -qF -- "$what" "$tmp/out"; then
    fail "nginx -t: want '$what', got: $(grep emerg "$tmp/out")"
  fi
}
bad 'zone "p" is not fair (ratelimit_zone ... fair)' 'ratelimit_zone p "fixed-window 5/s";' 'ratelimit p $remote_addr weight=2;'
bad 'zone "f" is fair: its decisions do not wait' 'ratelimit_zone f "token-bucket 5/s" fair;' 'ratelimit f $remote_addr wait=1s;'
bad '"weight=3": weight= is given twice (first as "weight=2")' 'ratelimit_zone f "token-bucket 5/s" fair;' 'ratelimit f $remote_addr weight=2 weight=3;'
bad '"weight=" needs a value' 'ratelimit_zone f "token-bucket 5/s" fair;' 'ratelimit f $remote_addr weight=;'
bad '"fair" is for the shared-memory store (store=shm): fair shares across nginx instances are not built' 'ratelimit_zone r "fixed-window 5/s" store=redis://127.0.0.1:1 fair;' 'ratelimit r $remote_addr;'

[ "$fails" = 0 ] && echo "fair_nginx: ok"
[ "$fails" = 0 ]
