# SPDX-License-Identifier: MIT
# What the nginx test scripts (nginx_test.sh, nginx_redis_test.sh) share:
# counting failures, comparing, a free port, starting an nginx on one and
# stopping it by the pid in its pid file, a response header.  Sourced;
# $tmp/h holds the headers.

fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
expect() { # expect WHAT GOT WANT
  if [ "$2" != "$3" ]; then fail "$1: got '$2', want '$3'"; fi
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# launch_nginx DIR WORKERS CONF...: picks a free port into $port, runs the
# command CONF... to write DIR/nginx.conf for it, starts nginx in DIR (pid
# file DIR/nginx.pid) and waits until it serves /index.html: 0; else 1,
# its errors printed (another port is tried while the port was taken).
launch_nginx() {
  local dir=$1 workers=$2 try
  shift 2
  for try in 1 2 3 4 5 6 7 8; do
    port=$((20000 + (RANDOM * 7 + try) % 40000))
    port_free "$port" || continue
    "$@"
    if "$NGINX" -p "$dir" -c "$dir/nginx.conf" \
      -g "pid $dir/nginx.pid; daemon on; worker_processes $workers;" 2>"$dir/start.err"; then
      for _ in $(seq 1 100); do
        [ -s "$dir/nginx.pid" ] && curl -s -o /dev/null "http://127.0.0.1:$port/index.html" && return 0
        sleep 0.05
      done
    fi
    grep -q "Address already in use" "$dir/start.err" || break
  done
  cat "$dir/start.err" "$dir/logs/error.log" 2>/dev/null || true
  return 1
}

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
