#!/bin/sh
# SPDX-License-Identifier: MIT
# Writes sample traces for `ratelimit replay` and `ratelimit compare` into
# DIR (default: traces).  Deterministic: the same files every time.
#   steady.trace    one key, 20 requests per second for 60 s
#   bursts.trace    one key, 5 per second with a burst of 100 every 10 s
#   edges.trace     one key, 8 per second plus 20 just before and 20 just
#                   after every 5th second (aimed at fixed-window edges)
#   many-keys.trace 200000 requests over 60 s from 10000 keys, a few heavy
set -eu
dir=${1:-traces}
mkdir -p "$dir"

awk 'BEGIN {
  for (i = 0; i < 1200; i++) printf "%d.%09d user:1\n", i / 20, (i % 20) * 50000000
}' > "$dir/steady.trace"

awk 'BEGIN {
  for (ms = 0; ms < 60000; ms += 200) {
    printf "%d.%03d user:1\n", ms / 1000, ms % 1000
    if (ms % 10000 == 5000)
      for (i = 1; i <= 100; i++) printf "%d.%03d%06d user:1\n", ms / 1000, ms % 1000, i * 1000
  }
}' > "$dir/bursts.trace"

awk 'BEGIN {
  for (s = 0; s < 30; s++) {
    for (i = 0; i < 8; i++) printf "%d.%03d user:1\n", s, i * 125 + 60
    if (s % 5 == 4) {
      for (i = 0; i < 20; i++) printf "%d.%03d user:1\n", s, 980 + i
      for (i = 0; i < 20; i++) printf "%d.%03d user:1\n", s + 1, i
    }
  }
}' | sort -n -k1,1 -s > "$dir/edges.trace"

awk 'BEGIN {
  srand(42)
  for (i = 0; i < 200000; i++) {
    t = i * 300000          # 300 us apart: 60 s in all
    r = rand()
    if (r < 0.3) k = int(rand() * 5)          # five heavy keys: 30% of traffic
    else k = 5 + int(rand() * 9995)
    printf "%d.%09d ip:10.0.%d.%d\n", t / 1000000000, t % 1000000000, k / 256, k % 256
  }
}' > "$dir/many-keys.trace"
