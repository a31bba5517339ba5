# SPDX-License-Identifier: MIT
# Sourced by the shell suites: start_redis LOG starts a private
# redis-server on a free loopback port (a few tries) and sets rport and
# rpid (rpid empty when none could be started); stop it by its PID.
start_redis() {
  rpid=""
  for _ in 1 2 3 4 5 6 7 8; do
    rport=$((20000 + RANDOM % 40000))
    redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no \
      >"$1" 2>&1 &
    rpid=$!
    for _ in $(seq 50); do
      redis-cli -p "$rport" ping >/dev/null 2>&1 && break
      kill -0 "$rpid" 2>/dev/null || break
      sleep 0.1
    done
    redis-cli -p "$rport" ping >/dev/null 2>&1 && return 0
    kill "$rpid" 2>/dev/null; wait "$rpid" 2>/dev/null; rpid=""
  done
  return 1
}
