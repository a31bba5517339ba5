# SPDX-License-Identifier: MIT
# What the example API server's test scripts share: counting failures,
# comparing, and starting a server on a free port and stopping it.
# Sourced with $SERVER (the server) and $tmp (the suite's directory) set;
# start sets $pid and $base.

# shellcheck source=lib/servers.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/servers.sh"

fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
expect() { # expect WHAT GOT WANT
  if [ "$2" != "$3" ]; then fail "$1: got '$2', want '$3'"; fi
}

# start CONFIG [ARGS...]: starts the server on port 0; sets pid and base.
start() {
  local config=$1
  shift
  # emptied here, not by the child's redirection: that one may come after
  # the loop below has read the last server's port
  : >"$tmp/log"
  "$SERVER" --listen 127.0.0.1:0 --config "$config" "$@" 2>>"$tmp/log" &
  pid=$!
  local port=
  listening() {
    port=$(sed -n 's/^api-server: listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$tmp/log")
    [ -n "$port" ]
  }
  wait_until "$TEST_WAIT_S" listening || true
  [ -n "$port" ] || { cat "$tmp/log"; echo "FAIL: the server did not start"; exit 1; }
  base="http://127.0.0.1:$port"
}
# stop: SIGTERM to the server started last; it must exit 0.
stop() {
  kill -TERM "$pid"
  local rc=0
  wait "$pid" || rc=$?
  pid=
  expect "exit status after SIGTERM" "$rc" 0
}
