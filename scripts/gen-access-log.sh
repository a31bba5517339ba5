#!/bin/sh
# SPDX-License-Identifier: MIT
# Writes a realistic nginx access log for trying `ratelimit replay` and
# `ratelimit compare` on real-looking traffic: SECONDS (default 60) of
# requests from 48 clients at random (Poisson) times: 36 browsing at well
# under a request a second, 8 API clients at 2 to 6 a second, a crawler at
# 14 a second, a client that now and then retries in a burst of 40, and
# two scripts at 9 to 12 a second.  Each line is nginx's combined format
# with $msec (the time to the millisecond) after it, as written by
#   log_format timed '$remote_addr - $remote_user [$time_local] "$request" '
#                    '$status $body_bytes_sent "$http_referer" '
#                    '"$http_user_agent" $msec';
# so `--input clf --time-field 10` reads the finer time.  Deterministic (a
# fixed seed): the same file every time.
#   usage: scripts/gen-access-log.sh [SECONDS] > access.log
set -eu
secs=${1:-60}
case $secs in
  ''|*[!0-9]*) echo "gen-access-log.sh: SECONDS '$secs' is not a whole number" >&2; exit 2 ;;
esac
awk -v secs="$secs" 'BEGIN {
  srand(20261202)
  for (c = 1; c <= 48; c++) {
    if (c <= 36) rate = 0.05 + rand() * 0.6          # browsers
    else if (c <= 44) rate = 2 + rand() * 4          # API clients
    else if (c == 45) rate = 14                      # a crawler
    else rate = 9 + rand() * 3                       # a retrier, scripts
    t = rand() * 5
    while (t < secs) {
      if (c == 46 && rand() < 0.02) {                # a retry storm
        for (k = 0; k < 40; k++) printf "%d %d\n", int((t + k * 0.004) * 1000), c
        t += 2
      }
      printf "%d %d\n", int(t * 1000), c
      t += -log(1 - rand()) / rate
    }
  }
}' | sort -n -s -k1,1 | awk '{
  ms = $1; c = $2; s = 1764644400 + int(ms / 1000)   # from 2025-12-02 03:00:00 UTC
  split("/ /search /api/items /api/items/42 /static/app.js /login", path, " ")
  printf "203.0.113.%d - - [02/Dec/2025:%02d:%02d:%02d +0000] \"GET %s HTTP/1.1\" 200 %d \"-\" \"client/1.0\" %d.%03d\n",
    c, int((s % 86400) / 3600), int((s % 3600) / 60), s % 60, path[1 + NR % 6], 100 + NR % 900, s, ms % 1000
}'
