#!/bin/sh
# SPDX-License-Identifier: MIT
# Runs the Java peer (GuavaPeer.java: Guava's RateLimiter, one and two
# threads on one limiter) after compiling it once into a directory outside
# the sources: $GUAVA_PEER_DIR, by default build/guava-peer beside them
# (ignored by git; never made by make test).  Guava's jar: $GUAVA_JAR, by
# default Debian's (apt-get install libguava-java default-jdk-headless).
#   bench/guava-peer/run.sh [ROUNDS] [SPAN_MS]
# Used by: ratelimit bench --java-peer bench/guava-peer/run.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dir=${GUAVA_PEER_DIR:-$here/../../build/guava-peer}
jar=${GUAVA_JAR:-/usr/share/java/guava.jar}
command -v javac >/dev/null 2>&1 && [ -r "$jar" ] ||
  { echo "guava-peer: javac and $jar are needed" >&2; exit 1; }
mkdir -p "$dir"
if [ ! -f "$dir/GuavaPeer.class" ] || [ "$here/GuavaPeer.java" -nt "$dir/GuavaPeer.class" ]; then
  javac -d "$dir" -cp "$jar" "$here/GuavaPeer.java"
fi
exec java -cp "$jar:$dir" GuavaPeer "${1:-5}" "${2:-200}"
