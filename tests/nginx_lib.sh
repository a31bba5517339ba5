# SPDX-License-Identifier: MIT
# What the nginx test scripts (nginx_test.sh, nginx_redis_test.sh) share:
# counting failures, comparing, a free port, starting an nginx on one and
# stopping it by the pid in its pid file, a response header, and the
# HTTP/2 helpers.  Sourced; $tmp/h holds the headers.  Waits are on
# conditions, bounded by TEST_WAIT_S (tests/lib/servers.sh).

# shellcheck source=lib/servers.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/servers.sh"

# nginx_needs NAME [redis] [python3]: what an nginx suite needs, nginx at
# $NGINX, the module at $MODULE and the tools named (skipped when absent),
# and curl (a failure when absent).
nginx_needs() {
  local name=$1 w
  shift
  [ -x "$NGINX" ] || skip "$NGINX is missing (Debian: apt-get install nginx)"
  [ -n "$MODULE" ] && [ -f "$MODULE" ] ||
    skip "the module is not built (Debian: apt-get install nginx-dev, then rebuild)"
  for w in "$@"; do
    case $w in
      redis) command -v redis-server >/dev/null && command -v redis-cli >/dev/null ||
               skip "redis-server is missing (Debian: apt-get install redis-server)" ;;
      python3) command -v python3 >/dev/null || skip "python3 is missing (the slow upstream)" ;;
    esac
  done
  command -v curl >/dev/null || { echo "$name: curl is missing (scripts/deps.sh test)"; exit 1; }
}

fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
expect() { # expect WHAT GOT WANT
  if [ "$2" != "$3" ]; then fail "$1: got '$2', want '$3'"; fi
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# launch_nginx DIR WORKERS CONF...: picks a free port into $port, runs the
# command CONF... to write DIR/nginx.conf for it, starts nginx in DIR (pid
# file DIR/nginx.pid) and waits until it serves /index.html (curl with the
# arguments in the array ready_args: --http2-prior-knowledge for a port
# that speaks only HTTP/2): 0; else 1, its errors printed (another port is
# tried while the port was taken).
ready_args=()
nginx_serves() { # DIR: its pid file written, /index.html served on $port
  [ -s "$1/nginx.pid" ] &&
    curl -s "${ready_args[@]}" -o /dev/null "http://127.0.0.1:$port/index.html"
}
launch_nginx() {
  local dir=$1 workers=$2 try
  shift 2
  for try in 1 2 3 4 5 6 7 8; do
    port=$((20000 + (RANDOM * 7 + try) % 40000))
    port_free "$port" || continue
    "$@"
    if "$NGINX" -p "$dir" -c "$dir/nginx.conf" \
      -g "pid $dir/nginx.pid; daemon on; worker_processes $workers;" 2>"$dir/start.err"; then
      wait_until "$TEST_WAIT_S" nginx_serves "$dir" && return 0
    fi
    grep -q "Address already in use" "$dir/start.err" || break
  done
  cat "$dir/start.err" "$dir/logs/error.log" 2>/dev/null || true
  return 1
}

# proc_stat PID: the fields of /proc/PID/stat after the command name
# (state, ppid, ...), or nothing when there is no such process.  Read from
# /proc, not ps: procps is in neither scripts/deps.sh nor the minbase root
# of scripts/fresh-check.sh, and without ps every process would look gone.
# (The name, in parentheses, may hold spaces and ')': cut at the last ')'.)
proc_stat() {
  local line
  read -r line 2>/dev/null <"/proc/$1/stat" || return 0
  echo "${line##*) }"
}

# alive PID: the process runs (a zombie does not: a daemon's master, once
# exited, waits for PID 1 to reap it, which may take a second or more).
alive() {
  local st
  st=$(proc_stat "$1")
  [ -n "$st" ] && [ "${st%% *}" != Z ]
}

# children PID: the pids of PID's child processes (from /proc).
children() {
  local d st rest
  for d in /proc/[0-9]*; do
    st=$(proc_stat "${d#/proc/}")
    rest=${st#* } # from the ppid on
    [ -n "$st" ] && [ "${rest%% *}" = "$1" ] && echo "${d#/proc/}"
  done
  return 0
}

# stop_pidfile PIDFILE: stop_gracefully (below), whatever it took: a
# cleanup's stop, which checks nothing.
stop_pidfile() { stop_gracefully "$1" || true; }

header() { sed -n "s/^$1: //Ip" "$tmp/h"; }

# ---- HTTP/2.  h2_missing: why this machine cannot test HTTP/2 (nothing
# when it can): a curl without HTTP/2, no openssl to make a certificate,
# an nginx without its HTTP/2 module.  (grep reads a process substitution:
# under pipefail, "cmd | grep -q" fails when grep's early exit kills cmd.)
h2_missing() {
  if ! grep -q HTTP2 <(curl -V); then
    echo "curl has no HTTP/2 support"
  elif ! command -v openssl >/dev/null; then
    echo "openssl is missing (scripts/deps.sh test)"
  elif ! grep -q -- --with-http_v2_module <("$NGINX" -V 2>&1); then
    echo "$NGINX has no HTTP/2 module"
  fi
}

# h2_prefix DIR: an HTTP/2 nginx's prefix: DIR/logs, DIR/html/index.html
# (readable by the workers, nobody when started by root), and a self-signed
# certificate for 127.0.0.1, DIR/h2.crt and DIR/h2.key (a P-256 key: made
# in milliseconds).  Fails when openssl makes no certificate.
h2_prefix() {
  mkdir -p "$1/logs" "$1/html"
  chmod 755 "$1" "$1/html"
  echo hello >"$1/html/index.html"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$1/h2.key" -out "$1/h2.crt" -days 2 -subj /CN=127.0.0.1 >/dev/null 2>&1
}

# free_port_but P: a free loopback port other than P.
free_port_but() {
  local p try
  for try in 1 2 3 4 5 6 7 8; do
    p=$((20000 + (RANDOM * 7 + try) % 40000))
    [ "$p" != "$1" ] && port_free "$p" && { echo "$p"; return 0; }
  done
  echo "$1"
}

# h2_mux OUT N URL [CURL ARGS]: N requests, URL1 .. URLN, multiplexed as
# streams of ONE HTTP/2 connection (curl --parallel, which adds a transfer
# to a connection that multiplexes rather than open another), one line
# "STATUS HTTP_VERSION NEW_CONNECTIONS PRETRANSFER TOTAL" each in OUT (the
# last two curl's times in seconds: until the request could be sent, the
# connection and its TLS handshake up, and until the answer).  Over TLS
# (https, h2 by ALPN): Debian 12's curl 7.88 fails every transfer but the
# first that reuses a prior-knowledge (plaintext) HTTP/2 connection
# ("Error in the HTTP2 framing layer", curl issue 10634, fixed in curl
# 8.0).
h2_mux() {
  local out=$1 n=$2 url=$3 i
  shift 3
  for i in $(seq 1 "$n"); do
    printf 'url = "%s%s"\noutput = "/dev/null"\n' "$url" "$i"
  done >"$out.cfg"
  curl -s -k --http2 -Z --parallel-max 100 --max-time 20 "$@" \
    -w '%{http_code} %{http_version} %{num_connects} %{time_pretransfer} %{time_total}\n' \
    -K "$out.cfg" >"$out" 2>"$out.err" || true
}
gone() { ! alive "$1"; }

# h2_count OUT STATUS: how many of OUT's streams were answered STATUS over
# HTTP/2; h2_conns OUT: how many connections they took.
h2_count() { grep -c "^$2 2 " "$1" || true; }
h2_conns() { awk '{ c += $3 } END { print c + 0 }' "$1"; }
# h2_slowest OUT: the longest any of OUT's streams took from being sent to
# its answer, in ms (the connection's start and TLS handshake left out).
h2_slowest() { awk '{ d = ($5 - $4) * 1000; if (d > m) m = d } END { printf "%d\n", m }' "$1"; }

# wait_line FILE PATTERN: until FILE has a line matching PATTERN (grep
# -E), TEST_WAIT_S at most: 0, else 1.
has_line() { grep -qE "$2" "$1" 2>/dev/null; }
wait_line() { wait_until "$TEST_WAIT_S" has_line "$1" "$2"; }

# stop_gracefully PIDFILE: QUIT, then the master must be gone within
# TEST_WAIT_S (every request answered or let go, no timer left behind): 0;
# else KILL (the master and its workers, by pid) and 1.
stop_gracefully() {
  local pid kids _
  [ -s "$1" ] || return 0
  pid=$(cat "$1")
  kids=$(children "$pid")
  kill -QUIT "$pid" 2>/dev/null || true
  if wait_until "$TEST_WAIT_S" gone "$pid"; then rm -f "$1"; return 0; fi
  # shellcheck disable=SC2086
  kill -KILL "$pid" $kids 2>/dev/null || true
  rm -f "$1"
  return 1
}
