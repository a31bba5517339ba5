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
# directives are refused by nginx -t with a message naming them.
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
expect "fair zone" "$(run /fair/)" "8 200"
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
bad 'is for the shared-memory store' 'ratelimit_zone r "fixed-window 5/s" store=redis://127.0.0.1:1 fair;' 'ratelimit r $remote_addr;'

[ "$fails" = 0 ] && echo "fair_nginx: ok"
[ "$fails" = 0 ]
