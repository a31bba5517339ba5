#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# examples/api-server from outside: started on a free loopback port (port 0,
# read back from its log), driven with curl, every status and header
# checked against the exact expectation; a reload mid-run keeps state and
# drops no request; a bad file changes nothing.
#   api_server_test.sh API_SERVER EXAMPLE_CONF
set -euo pipefail

SERVER=$1
EXAMPLE=$2
# shellcheck source=lib/servers.sh
. "$(dirname "$0")/lib/servers.sh" # wait_until, TEST_WAIT_S
command -v curl >/dev/null || { echo "api_server_test: curl is missing (scripts/deps.sh test)"; exit 1; }

tmp=$(mktemp -d /tmp/api_server_test.XXXXXX)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
# shellcheck source=api_lib.sh
. "$(dirname "$0")/api_lib.sh"


# --- --help: the usage on standard output, exit 0; a bad argument: its
# name on standard error, exit 2
rc=0; "$SERVER" --help >"$tmp/out" 2>"$tmp/err" || rc=$?
expect "--help exit status" "$rc" 0
expect "--help on stderr" "$(cat "$tmp/err")" ""
grep -q -- "--config FILE" "$tmp/out" || fail "--help prints no usage: $(cat "$tmp/out")"
rc=0; "$SERVER" --bogus >"$tmp/out" 2>"$tmp/err" || rc=$?
expect "--bogus exit status" "$rc" 2
expect "--bogus stdout" "$(cat "$tmp/out")" ""
expect "--bogus message" "$(head -1 "$tmp/err")" "api-server: unknown argument '--bogus'"
rc=0; "$SERVER" --listen 127.0.0.1:0 >/dev/null 2>"$tmp/err" || rc=$?
expect "no --config" "$rc:$(head -1 "$tmp/err")" "2:api-server: --config is required"


# get [CURL ARGS] URL: the response's headers (CR stripped) to $tmp/h, its
# body to $tmp/b; prints the status.
get() {
  curl -s -D "$tmp/h" -o "$tmp/b" -w '%{http_code}' "$@"
  sed -i 's/\r$//' "$tmp/h"
}
header() { sed -n "s/^$1: //Ip" "$tmp/h"; }
now_ns() { date +%s%N; }

cat >"$tmp/rules.conf" <<'EOF'
[policies]
free = token-bucket 1/h burst=10
pro = token-bucket 100/h burst=2000
enterprise = unlimited
search = fixed-window 3/h

[rule pro]
group = tier
match = api_key=pro-1
policy = pro
[rule enterprise]
group = tier
match = api_key=ent-1
policy = enterprise
[rule free]
group = tier
policy = free
[rule search]
group = route
match = route=/search*
policy = search
key = shared
EOF
cp "$tmp/rules.conf" "$tmp/good.conf"
start "$tmp/rules.conf"

# --- the free tier: 10 pass, then 429 with every field
t0=$(now_ns)
expect "status 1" "$(get -H 'X-API-Key: u1' "$base/a")" 200
expect "policy 1" "$(header RateLimit-Policy)" '"free";q=10;w=36000'
expect "ratelimit 1" "$(header RateLimit)" '"free";r=9;t=3600'
expect "retry-after 1" "$(header Retry-After)" ''
expect "content-type 1" "$(header Content-Type)" 'application/json'
expect "body 1" "$(cat "$tmp/b")" '{"status":"ok"}'
# in_window WHAT GOT WANT T0: GOT is WANT less at most the seconds since T0
# (rounded up): what a time the server computes from its own clock reads
# when the test cannot stop the clock
in_window() {
  local el=$(( ($(now_ns) - $4 + 999999999) / 1000000000 ))
  if [ "$2" -gt "$3" ] || [ "$2" -lt $(($3 - el)) ]; then
    fail "$1: $2 outside [$(($3 - el)), $3] ($el s elapsed)"
  fi
}
# t_of: the t= of the RateLimit field; r_of its item without t
t_of() { header RateLimit | sed 's/.*;t=//'; }
r_of() { header RateLimit | sed 's/;t=[0-9]*$//'; }
for i in $(seq 2 10); do
  expect "status $i" "$(get -H 'X-API-Key: u1' "$base/a")" 200
  # i tokens back at 1/h: i hours from the first request
  expect "ratelimit $i" "$(r_of)" "\"free\";r=$((10 - i))"
  in_window "ratelimit $i t" "$(t_of)" $((3600 * i)) "$t0"
done
expect "status 11" "$(get -H 'X-API-Key: u1' "$base/a")" 429
t1=$(now_ns)
# The first token is back 3600 s after the first request: Retry-After is
# that less the time since, rounded up -- 3600 unless a second has passed.
el=$(( (t1 - t0 + 999999999) / 1000000000 ))
ra=$(header Retry-After)
if [ "$ra" -gt 3600 ] || [ "$ra" -lt $((3600 - el)) ]; then
  fail "Retry-After $ra outside [$((3600 - el)), 3600] ($el s elapsed)"
fi
expect "policy 11" "$(header RateLimit-Policy)" '"free";q=10;w=36000'
rl=$(header RateLimit)
t=${rl#*;t=}
if [ "${rl%;t=*}" != '"free";r=0' ] || [ "$t" -gt 36000 ] || [ "$t" -lt $((36000 - el)) ]; then
  fail "RateLimit '$rl' (t within [$((36000 - el)), 36000])"
fi
expect "content-type 11" "$(header Content-Type)" 'application/problem+json'
expect "problem body" "$(cat "$tmp/b")" \
  "{\"type\":\"about:blank\",\"title\":\"Too Many Requests\",\"status\":429,\"detail\":\"Policy 'free' allows no more requests now; retry after $ra s.\",\"instance\":\"/a\",\"policy\":\"free\",\"retry_after\":$ra}"

# every body ends with a newline, the 429's as the 200's
expect "problem body's last byte" "$(tail -c 1 "$tmp/b" | od -An -c | tr -d ' ')" '\n'

# --- no key: the client's address is the key (a fresh free bucket)
expect "no key" "$(get "$base/a")" 200
expect "no key ratelimit" "$(header RateLimit)" '"free";r=9;t=3600'

# --- enterprise: unlimited, no fields
for i in $(seq 1 30); do
  code=$(get -H 'X-API-Key: ent-1' "$base/a")
  [ "$code" = 200 ] || fail "enterprise request $i: $code"
done
expect "enterprise policy field" "$(header RateLimit-Policy)" ''
expect "enterprise ratelimit field" "$(header RateLimit)" ''

# --- a per-route limit beside the tier: both must pass, a denial charges neither
for i in 1 2 3; do
  expect "search $i" "$(get -H 'X-API-Key: pro-1' "$base/search?q=$i")" 200
done
expect "search policy" "$(header RateLimit-Policy)" '"pro";q=2000;w=72000, "search";q=3;w=3600'
rl=$(header RateLimit)
case "$rl" in
  '"pro";r=1997;t='*', "search";r=0;t='*) ;;
  *) fail "search 3 RateLimit: '$rl'" ;;
esac
expect "search 4" "$(get -H 'X-API-Key: pro-1' "$base/search")" 429
# the pro bucket's permit was given back: r is what it was, 1997
case "$(header RateLimit)" in
  '"pro";r=1997;t='*', "search";r=0;t='*) ;;
  *) fail "search 4 RateLimit: '$(header RateLimit)'" ;;
esac
grep -q '"policy":"search"' "$tmp/b" || fail "search 4 body names search: $(cat "$tmp/b")"

# --- /metrics
get "$base/metrics" >/dev/null
for line in \
  'ratelimit_decisions_total{policy="free",result="allowed",reason="allowed"} 11' \
  'ratelimit_decisions_total{policy="free",result="denied",reason="limited"} 1' \
  'ratelimit_decisions_total{policy="enterprise",result="allowed",reason="allowed"} 30' \
  'ratelimit_decisions_total{policy="search",result="denied",reason="limited"} 1' \
  'ratelimit_decisions_total{policy="pro",result="allowed",reason="allowed"} 4' \
  'ratelimit_store_errors_total 0' \
  'ratelimit_decision_seconds_count 46' \
  'ratelimit_decision_seconds_bucket{le="+Inf"} 46' \
  'ratelimit_keys 4' \
  'ratelimit_rules_generation 1'; do
  grep -qxF "$line" "$tmp/b" || fail "metrics: no line '$line'"
done
expect "metrics content-type" "$(header Content-Type)" 'text/plain; version=0.0.4'

# --- reloads mid-run: 1000 requests on one connection while the file
# changes and SIGHUPs come; every one answered 200
urls=()
for i in $(seq 1 1000); do urls+=(-o /dev/null "$base/r$i"); done
curl -s -H 'X-API-Key: pro-1' -w '%{http_code}\n' "${urls[@]}" >"$tmp/codes" &
cpid=$!
# Signals of one kind pending together are one: each SIGHUP waits for the
# reload before it to be logged (a loaded machine may be slow to run it).
reloads_logged() { [ "$(grep -c 'SIGHUP: rules reloaded' "$tmp/log")" -ge "$1" ]; }
for i in 1 2 3 4 5; do
  kill -HUP "$pid"
  wait_until "$TEST_WAIT_S" reloads_logged "$i" || true
done
# the same policies, written again (a change of the file)
sed 's/^pro = token-bucket 100\/h burst=2000$/pro = token-bucket 100\/h burst=2000 /' \
  "$tmp/rules.conf" >"$tmp/rules.new" && mv "$tmp/rules.new" "$tmp/rules.conf"
wait "$cpid"
expect "answers during reloads" "$(grep -c . "$tmp/codes")" 1000
expect "all 200 during reloads" "$(grep -vc '^200$' "$tmp/codes" || true)" 0
wait_until "$TEST_WAIT_S" grep -q 'file changed: rules reloaded' "$tmp/log" || true
grep -q 'file changed: rules reloaded' "$tmp/log" || fail "no reload on the file's change: $(cat "$tmp/log")"
expect "SIGHUP reloads" "$(grep -c 'SIGHUP: rules reloaded' "$tmp/log")" 5
# state kept: u1 is still used up, and the route too
expect "u1 after reloads" "$(get -H 'X-API-Key: u1' "$base/a")" 429
expect "search after reloads" "$(get -H 'X-API-Key: pro-1' "$base/search")" 429

# --- a bad file: reported, and the rules in use stay
gen=$(curl -s "$base/metrics" | sed -n 's/^ratelimit_rules_generation //p')
printf '[policies]\nfree = token-bucket 10/fortnight\n' >"$tmp/rules.conf"
kill -HUP "$pid"
wait_until "$TEST_WAIT_S" grep -q 'the rules in use stay' "$tmp/log" || true
grep -qF "$tmp/rules.conf:2: policy 'free': limit 1: rate '10/fortnight'" "$tmp/log" ||
  fail "bad file not reported: $(tail -n 2 "$tmp/log")"
expect "generation after a bad file" \
  "$(curl -s "$base/metrics" | sed -n 's/^ratelimit_rules_generation //p')" "$gen"
expect "enterprise after a bad file" "$(get -H 'X-API-Key: ent-1' "$base/a")" 200
expect "u1 after a bad file" "$(get -H 'X-API-Key: u1' "$base/a")" 429

# --- a reload of an empty file, or of one cut inside a line (a file being
# written in place): refused and logged, the rules in use stay (u1, used
# up on the free tier, stays denied; before, an empty file was adopted
# and every key was unlimited)
for torn in empty cut norules; do
  case $torn in
    empty) : >"$tmp/rules.conf" ;;
    cut) head -c 150 "$tmp/good.conf" >"$tmp/rules.conf" ;;
    norules) printf '[policies]\nfree = token-bucket 1/h burst=10\n' >"$tmp/rules.conf" ;;
  esac
  n=$(grep -c 'the rules in use stay' "$tmp/log" || true)
  stays_logged_over() { [ "$(grep -c 'the rules in use stay' "$tmp/log")" -gt "$1" ]; }
  kill -HUP "$pid"
  wait_until "$TEST_WAIT_S" stays_logged_over "$n" || true
  case $torn in
    empty) want='the file is empty' ;;
    cut) want='the file ends inside this line, without its newline' ;;
    norules) want='no [rule NAME] section: every request would be unlimited' ;;
  esac
  grep -qF "$want" "$tmp/log" || fail "$torn file not reported: $(tail -n 2 "$tmp/log")"
  expect "generation after the $torn file" \
    "$(curl -s "$base/metrics" | sed -n 's/^ratelimit_rules_generation //p')" "$gen"
  expect "u1 after the $torn file" "$(get -H 'X-API-Key: u1' "$base/a")" 429
done
stop

# --- a long reload: the file is read on a thread of its own.  The server
# starts on 20000 policies and rules; the file is then swapped for a pipe
# the test feeds, so that a reload lasts exactly as long as the test
# wants.  Meanwhile requests are answered, a silent connection is closed
# by the header deadline (2 s; 10 s allowed: the idle timeout is 30 s), a
# SIGHUP is not lost, and SIGTERM stops the server within 5 s.  The log's
# first line gives the port and the PID, the one to signal.
awk 'BEGIN {
  print "[policies]"; print "free = token-bucket 1/h burst=1000"
  for (i = 0; i < 20000; i++) printf "p%d = token-bucket %d/h burst=10\n", i, i + 1
  for (i = 0; i < 20000; i++)
    printf "[rule r%d]\ngroup = tier\nmatch = api_key=k%d\npolicy = p%d\n", i, i, i
  print "[rule free]"; print "group = tier"; print "policy = free"
}' >"$tmp/big.orig"
cp "$tmp/big.orig" "$tmp/big.conf"
start "$tmp/big.conf" --header-timeout 2
expect "the log's first line" "$(head -1 "$tmp/log")" \
  "api-server: listening on ${base#http://} (pid $pid, store memory)"
spid=$(sed -n '1s/.*(pid \([0-9]*\),.*/\1/p' "$tmp/log") # as docs/api-server.md
expect "the PID logged" "$spid" "$pid"
[ -n "$spid" ] || spid=$pid # reported above; the rest goes on
generation() { curl -s "$base/metrics" | sed -n 's/^ratelimit_rules_generation //p'; }
mkfifo "$tmp/fifo"
exec 4<>"$tmp/fifo" # a writer held open: the server's reads wait for more
mv "$tmp/fifo" "$tmp/big.conf"
kill -HUP "$spid"
readings_over() { [ "$(grep -c ': reading .*big\.conf$' "$tmp/log")" -gt "$1" ]; }
wait_until "$TEST_WAIT_S" readings_over 0 || true
head -n 1000 "$tmp/big.orig" >&4 # well under a pipe's buffer
expect "answered during a reload" "$(get -m 10 -H 'X-API-Key: k7' "$base/a")" 200
expect "its policy during a reload" "$(header RateLimit-Policy | cut -d';' -f1)" '"p7"'
expect "generation during a reload" "$(generation)" 1
exec 5<>"/dev/tcp/127.0.0.1/${base##*:}" # sends nothing
rc=0; timeout 10 cat <&5 >/dev/null || rc=$?
exec 5<&-
expect "silent connection closed during a reload (0: closed, 124: open at 10 s)" "$rc" 0
kill -HUP "$spid" # during the reload: one more once it is over
tail -n +1001 "$tmp/big.orig" >&4 &
wpid=$!
exec 4>&- # the rest's writer the last: its end is the file's
wait_until "$TEST_WAIT_S" grep -q 'rules reloaded (generation 2)' "$tmp/log" || true
grep -q 'rules reloaded (generation 2)' "$tmp/log" || fail "the long reload never ended: $(cat "$tmp/log")"
wait "$wpid" || true
expect "generation after the long reload" "$(generation)" 2
expect "answered after the long reload" "$(get -m 10 -H 'X-API-Key: k7' "$base/a")" 200
# no writer now: the next reading waits to open the pipe
wait_until "$TEST_WAIT_S" readings_over 1 || true
readings_over 1 || fail "the SIGHUP during the reload was lost: $(cat "$tmp/log")"
# SIGTERM while a reload waits: the server ends within 5 s, status 0
t0=$SECONDS
kill -TERM "$spid"
gone() { ! kill -0 "$spid" 2>/dev/null; }
wait_until 5 gone || true
if gone; then
  rc=0; wait "$pid" || rc=$?
  expect "exit status after SIGTERM during a reload" "$rc" 0
  grep -q 'stopping during a reload' "$tmp/log" ||
    fail "no word of the reload dropped: $(tail -n 3 "$tmp/log")"
else
  fail "SIGTERM during a reload: still running after $((SECONDS - t0)) s"
  kill -KILL "$spid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
fi
pid=

# --- slow clients: 40 connections from 127.0.0.1 each trickling a header
# line every 0.3 s and never ending their headers.  With at most 8 per
# address, 32 are closed at once; the 8 others are closed by the header
# deadline (4 s here), though the trickle keeps resetting the idle
# timeout (30 s); meanwhile a client from another address (127.0.0.2, a
# loopback address too) is answered, and once the slow ones are gone one
# from 127.0.0.1 too.  (Before: all 40 were taken and kept open while
# they trickled, and about 1,030 such connections blocked every client.)
if command -v python3 >/dev/null; then
  start "$tmp/good.conf" --max-conns-per-ip 8 --header-timeout 4
  grep -qF 'at most 1000 connections, 8 per address (0: no cap), headers within 4 s' "$tmp/log" ||
    fail "the caps are not in the log: $(cat "$tmp/log")"
  port=${base##*:}
  python3 "$(dirname "$0")/slow_clients.py" "$port" 40 2 20 "$tmp/slow.ready" >"$tmp/slow" &
  spid=$!
  # (all 40 connected and trickling, not a fixed second)
  wait_until "$TEST_WAIT_S" test -e "$tmp/slow.ready" || true
  t0=$(now_ns)
  expect "another address during the trickle" \
    "$(get --interface 127.0.0.2 -m 10 -H 'X-API-Key: other' "$base/a")" 200
  echo "another address answered in $(( ($(now_ns) - t0) / 1000000 )) ms during the trickle"
  wait "$spid" || fail "slow_clients.py failed"
  expect "slow clients: at once, by the deadline, still open" "$(cat "$tmp/slow")" "32 8 0"
  expect "127.0.0.1 after the slow clients" "$(get -m 10 -H 'X-API-Key: other2' "$base/a")" 200
  stop
  grep -q 'stopped (8 connections closed by the header deadline)' "$tmp/log" ||
    fail "the deadline's count: $(tail -n 1 "$tmp/log")"
  # a bad cap is a clear error
  if "$SERVER" --listen 127.0.0.1:0 --config "$tmp/good.conf" --max-conns-per-ip x 2>"$tmp/err"; then
    fail "--max-conns-per-ip x accepted"
  fi
  grep -qF "api-server: --max-conns-per-ip 'x' is not a whole number from 0 to 1000000" "$tmp/err" ||
    fail "--max-conns-per-ip x: $(cat "$tmp/err")"
elif [ "${CI:-}" = true ]; then
  fail "python3 is missing (CI=true): the slow-client part cannot run"
else
  echo "api_server_test: python3 not installed; the slow-client part is skipped"
fi

# --- the example's own rules: of 100 requests in a row from one unknown
# key, the first 10 pass (burst 10), and some get 429s
start "$EXAMPLE"
urls=()
for i in $(seq 1 100); do urls+=(-o /dev/null "$base/items"); done
curl -s -H 'X-API-Key: stranger' -w '%{http_code}\n' "${urls[@]}" >"$tmp/codes"
expect "first 10 of 100" "$(head -n 10 "$tmp/codes" | sort -u)" 200
n429=$(grep -c '^429$' "$tmp/codes" || true)
n200=$(grep -c '^200$' "$tmp/codes" || true)
expect "answered of 100" "$((n200 + n429))" 100
[ "$n429" -gt 0 ] || fail "no 429 in 100 requests"
echo "example.conf, 100 requests from one unknown key: $n200 x 200, $n429 x 429"
stop

# --- --store redis://: the state is Redis's, shared by a second server
# process (skipped without redis-server)
if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
  . "$(dirname "$0")/lib/servers.sh"
  if start_redis "$tmp/redis.log"; then
    url="redis://127.0.0.1:$rport/0"
    start "$tmp/good.conf" --store "$url"
    grep -q " store $url)" "$tmp/log" || fail "redis store not in the log: $(cat "$tmp/log")"
    t0=$(now_ns)
    for i in $(seq 1 10); do
      expect "redis status $i" "$(get -H 'X-API-Key: shared-user' "$base/a")" 200
    done
    expect "redis ratelimit 10" "$(r_of)" '"free";r=0'
    in_window "redis ratelimit 10 t" "$(t_of)" 36000 "$t0"
    stop
    start "$tmp/good.conf" --store "$url" # another process, the same Redis
    expect "redis, a second process" "$(get -H 'X-API-Key: shared-user' "$base/a")" 429
    # Redis gone: 503, and the log says so, with the store's reason once
    # it has one (a reconnect refused: a connection that was open fails
    # first without one); the main loop writes at most a line a second,
    # so requests go on, 0.2 s apart, until a line names the server (at
    # most 50: 10 s of slack)
    kill "$rpid" 2>/dev/null || true
    wait "$rpid" 2>/dev/null || true
    for i in $(seq 1 50); do
      expect "redis stopped $i" "$(get -H 'X-API-Key: shared-user' "$base/a")" 503
      grep -q "failed on the store (.*127.0.0.1:$rport" "$tmp/log" && break
      sleep 0.2
    done
    grep -q "^api-server: [0-9]* decisions\{0,1\} failed on the store (.*127.0.0.1:$rport.*), answered 503$" "$tmp/log" ||
      fail "no store-error line naming the server: $(cat "$tmp/log")"
    stop
  else
    echo "api_server_test: no redis-server could start; the Redis part is skipped"
  fi
else
  echo "api_server_test: redis-server not installed; the Redis part is skipped"
fi

if [ "$fails" -ne 0 ]; then
  echo "api_server_test: $fails failure(s)"
  exit 1
fi
echo "api_server_test: ok"
