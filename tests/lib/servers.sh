# SPDX-License-Identifier: MIT
# shellcheck shell=bash
# Sourced by the shell suites: waiting on conditions and private servers.
#
#   wait_until SECONDS CMD...  runs CMD until it succeeds (0) or SECONDS
#                              have passed (1); pauses of 0.05 s between.
#                              A wait for something that must happen gives
#                              it TEST_WAIT_S (60 s): giving up is a
#                              failure, not a measure, so it is generous.
#   free_port                  prints a loopback port free now
#   start_redis LOG [ARGS...]  starts a private redis-server on a free
#                              loopback port (a few tries), its output to
#                              LOG, and waits until it answers PING; sets
#                              rport and rpid (rpid empty when none could
#                              be started).  Stop it by its PID: stop_pid.
#   stop_pid PID               SIGKILL and reap PID (a child of this shell)
TEST_WAIT_S=${TEST_WAIT_S:-60}

# skip WHY: a suite that cannot run here exits 77 (ctest: skipped); under
# CI=true, where every tool is installed, that is a failure instead.
skip() {
  if [ "${CI:-}" = true ]; then echo "FAIL (CI=true): $*"; exit 1; fi
  echo "SKIP: $*"; exit 77
}

wait_until() {
  local limit=$1 start=$SECONDS
  shift
  while ! "$@"; do
    [ $((SECONDS - start)) -ge "$limit" ] && { "$@"; return; }
    sleep 0.05
  done
}

free_port() {
  local p
  for _ in $(seq 100); do
    p=$((20000 + RANDOM % 12000))
    # nothing listening there now (the start retries if it is taken meanwhile)
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
  done
  return 1
}

redis_up_or_gone() { # PORT PID: answers PING, or the process has exited
  redis-cli -p "$1" ping >/dev/null 2>&1 || ! kill -0 "$2" 2>/dev/null
}

start_redis() {
  local log=$1
  shift
  rpid=""
  for _ in 1 2 3 4 5 6 7 8; do
    rport=$(free_port) || return 1
    redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no "$@" \
      >"$log" 2>&1 &
    rpid=$!
    wait_until "$TEST_WAIT_S" redis_up_or_gone "$rport" "$rpid"
    redis-cli -p "$rport" ping >/dev/null 2>&1 && return 0
    stop_pid "$rpid"; rpid=""
  done
  return 1
}

stop_pid() {
  [ -n "$1" ] || return 0
  kill -KILL "$1" 2>/dev/null
  wait "$1" 2>/dev/null
  return 0
}
