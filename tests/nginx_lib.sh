# SPDX-License-Identifier: MIT
# What the nginx test scripts (nginx_test.sh, nginx_redis_test.sh) share:
# counting failures, comparing, a free port, stopping an nginx by the pid
# in its pid file, a response header.  Sourced; $tmp/h holds the headers.

fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
expect() { # expect WHAT GOT WANT
  if [ "$2" != "$3" ]; then fail "$1: got '$2', want '$3'"; fi
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# stop_pidfile PIDFILE: a graceful stop (QUIT), then KILL after 10 s.
stop_pidfile() {
  local pidfile=$1 pid
  [ -s "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  kill -QUIT "$pid" 2>/dev/null || true
  for _ in $(seq 1 200); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$pidfile"; return 0; }
    sleep 0.05
  done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$pidfile"
}

header() { sed -n "s/^$1: //Ip" "$tmp/h"; }
