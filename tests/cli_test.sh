#!/usr/bin/env bash
# Tests of the ratelimit command from outside: replay vectors checked line by
# line, every documented error with its exit status and message, compare's
# boundary spike and SVG, access logs, check's exit statuses.
# Usage: cli_test.sh RATELIMIT_BINARY VECTORS_DIR
set -u
R=$1
V=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0
fail=0

ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# --- replay vectors: expected output worked out by hand from the spec
for args in "$V"/*.args; do
  n=$(basename "$args" .args)
  # shellcheck disable=SC2046
  if "$R" replay $(cat "$args") "$V/$n.trace" >"$T/out" 2>"$T/err" &&
     cmp -s "$T/out" "$V/$n.out"; then ok
  else bad "replay vector $n"; diff "$V/$n.out" "$T/out" | head -5; fi
  # the same from standard input, and from '-'
  # shellcheck disable=SC2046
  "$R" replay $(cat "$args") <"$V/$n.trace" >"$T/stdin" 2>/dev/null
  # shellcheck disable=SC2046
  "$R" replay $(cat "$args") - <"$V/$n.trace" >"$T/dash" 2>/dev/null
  if cmp -s "$T/stdin" "$V/$n.out" && cmp -s "$T/dash" "$V/$n.out"; then ok
  else bad "replay vector $n from standard input"; fi
done

# --- access logs
if "$R" replay --input clf --algorithm fixed-window --limit 2 --window 1s \
     "$V/access.log" >"$T/out" 2>/dev/null && cmp -s "$T/out" "$V/access.out"
then ok; else bad "replay --input clf"; fi

# --- summary on standard error, per key
printf '0 a\n0 a\n0 b\n' | "$R" replay --algorithm fixed-window --limit 1 \
  --window 1s --per-key >"$T/out" 2>"$T/err"
if [ "$(cat "$T/err")" = "$(printf 'summary: 3 requests, 2 allowed, 1 denied\na\t1 allowed\t1 denied\nb\t1 allowed\t0 denied')" ] &&
   [ "$(wc -l <"$T/out")" -eq 3 ]; then ok; else bad "per-key summary"; cat "$T/err"; fi

# --- errors: exit 2, nothing on standard output, one line naming the problem
expect_error() { # STDIN MESSAGE ARGS...
  local input=$1 msg=$2; shift 2
  printf '%b' "$input" | "$R" "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -qF -- "$msg" "$T/err" &&
     [ ! -s "$T/out" ]; then ok
  else bad "error '$msg' for: $* (rc=$rc, stderr: $(cat "$T/err"), stdout: $(head -c 80 "$T/out"))"; fi
}
TB="--algorithm token-bucket --rate 1/s --burst 1"
FW="--algorithm fixed-window --limit 1 --window 1s"
expect_error '' "unknown option '--bogus'" replay $TB --bogus
expect_error '' "option '--rate' needs a value" replay --algorithm token-bucket --rate
expect_error '' "--algorithm is required" replay --rate 1/s --burst 1
expect_error '' "unknown algorithm 'token'" replay --algorithm token --rate 1/s
expect_error '' "--burst is required for token-bucket" replay --algorithm token-bucket --rate 1/s
expect_error '' "--capacity is required for leaky-bucket" replay --algorithm leaky-bucket --rate 1/s
expect_error '' "--limit is required" replay --algorithm sliding-log --window 1s
expect_error '' "--window is required" replay --algorithm sliding-log --limit 1
expect_error '' "--burst must be at least 1" replay --algorithm gcra --rate 1/s --burst 0
expect_error '' "--limit must be at least 1" replay --algorithm fixed-window --limit 0 --window 1s
expect_error '' "--rate '0/s' is zero" replay --algorithm gcra --rate 0/s --burst 1
expect_error '' "--rate '5/0ms' is zero" replay --algorithm gcra --rate 5/0ms --burst 1
expect_error '' "--window '0s' is zero" replay --algorithm fixed-window --limit 1 --window 0s
expect_error '' "--rate '10/fortnight'" replay --algorithm gcra --rate 10/fortnight --burst 1
expect_error '' "--window '1.5s' is not a duration" replay --algorithm fixed-window --limit 1 --window 1.5s
expect_error '' "--window '5' is not a duration" replay --algorithm fixed-window --limit 1 --window 5
expect_error '' "--max-wait 'soon' is not a duration" replay $TB --max-wait soon
expect_error '' "--max-wait applies only to token-bucket and leaky-bucket" replay $FW --max-wait 1s
expect_error '' "--burst does not apply to leaky-bucket" replay --algorithm leaky-bucket --rate 1/s --burst 2
expect_error '' "--capacity does not apply to token-bucket" replay $TB --capacity 2
expect_error '' "--limit does not apply to token-bucket" replay $TB --limit 2
expect_error '' "--rate does not apply to sliding-window" replay --algorithm sliding-window --limit 1 --window 1s --rate 1/s
expect_error '' "above 2^61" replay --algorithm gcra --rate 1/36500d --burst 2
expect_error '' "cannot read '/nonexistent/trace'" replay $TB /nonexistent/trace
expect_error '' "more than one FILE" replay $TB a b
expect_error '' "is neither 'memory' nor a redis:// or unix:// URL" replay $TB --store postgres://x
expect_error '' "--input 'json'" replay $TB --input json
expect_error '' "--key-field 'size'" replay $TB --input clf --key-field size
expect_error '' "unknown command 'replya'" replya
# repeated options: the last wins; --opt=value is --opt value
printf '0 k\n0 k\n' | "$R" replay --algorithm=gcra --rate 1/s --burst 1 --burst=2 >"$T/out" 2>/dev/null
if [ "$(cut -f4 "$T/out" | tr '\n' ' ')" = "allow allow " ]; then ok; else bad "last option wins"; fi

# --- bad trace lines: earlier lines printed, message names the line, exit 2
bad_line() { # TRACE MESSAGE LINES_BEFORE
  printf '%b' "$1" | "$R" replay $TB >"$T/out" 2>"$T/err"
  local rc=$?
  if [ $rc -eq 2 ] && grep -qF -- "$2" "$T/err" && [ "$(wc -l <"$T/out")" -eq "$3" ] &&
     [ "$(wc -l <"$T/err")" -eq 1 ]; then ok
  else bad "bad line '$1': rc=$rc $(cat "$T/err")"; fi
}
bad_line '0 a\n1. a\n' "line 2: TIME has a '.' without digits" 1
bad_line '0 a\n# x\n.5 a\n' "line 3: TIME is not a non-negative decimal" 1
bad_line '-1 a\n' "line 1: TIME is not" 0
bad_line '0 a\n1 a b\n' "line 2: PERMITS is not a whole number" 1
bad_line '1 a 2 3\n' "line 1: too many fields" 0
bad_line '5\n' "line 1: missing KEY" 0
bad_line '1.0000000001 a\n' "more than 9 fractional digits" 0
bad_line '9223372036.854775808 a\n' "TIME above 2^63-1 ns" 0
bad_line '0 a 9223372036854775808\n' "PERMITS above 2^63-1" 0
bad_line "0 $(head -c 513 /dev/zero | tr '\0' k)\n" "KEY longer than 512 bytes" 0
# the largest time and permits are fine; a last line without newline counts
printf '9223372036.854775807 a 9223372036854775807\n1 b' | "$R" replay $TB >"$T/out" 2>/dev/null
if [ $? -eq 0 ] && [ "$(wc -l <"$T/out")" -eq 2 ] && grep -q "	inf	" "$T/out"; then ok; else bad "largest values"; fi

# --- CLF: malformed lines
clf_error() {
  printf '%s\n' "$1" | "$R" replay --input clf $FW >"$T/out" 2>"$T/err"
  if [ $? -eq 2 ] && grep -qF -- "$2" "$T/err"; then ok; else bad "clf '$1': $(cat "$T/err")"; fi
}
clf_error '1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 200' "missing bytes"
clf_error '1.2.3.4 - - 10/Oct/2000:13:55:36 -0700 "GET / HTTP/1.1" 200 1' "[timestamp]"
clf_error '1.2.3.4 - - [10/Foo/2000:13:55:36 -0700] "GET / HTTP/1.1" 200 1' "timestamp is not"
clf_error '1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1 200 1' "unclosed \"request\""
clf_error '1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 2000 1' "status is not"
clf_error '1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GET /" 200 1 "ref"' "referer without a user agent"

# --- compare: the fixed window lets about twice its limit through around an
# edge, the sliding log never more than its limit; the SVG is well-formed XML
{ for i in $(seq 0 9); do printf '0.99%d edge\n' "$i"; done
  for i in $(seq 0 9); do printf '1.00%d edge\n' "$i"; done; } >"$T/spike.trace"
"$R" compare --rate 10/s --svg "$T/c.svg" "$T/spike.trace" >"$T/table" 2>"$T/err"
# columns from the end: ms, mean delay, edge spike, max/period
fw=$(awk '$1 == "fixed-window" {print $(NF-2)}' "$T/table")
sl=$(awk '$1 == "sliding-log" {print $(NF-3)}' "$T/table")
if [ "$fw" = 20 ] && [ "$sl" = 10 ]; then ok; else bad "compare spike fw=$fw sl=$sl"; cat "$T/table"; fi
if xmllint --noout "$T/c.svg" 2>"$T/xml" && grep -q "<polyline" "$T/c.svg" &&
   grep -q "sliding-log 10/s" "$T/c.svg"; then ok; else bad "svg: $(cat "$T/xml")"; fi
expect_error '' "--rate is required" compare
expect_error '' "cannot write '/nonexistent/x.svg'" compare --rate 10/s --svg /nonexistent/x.svg "$T/spike.trace"

# --- check: exit 0 allowed, 1 denied, 2 error
"$R" check --key u --algorithm gcra --rate 1/s --burst 1 >"$T/out"; rc=$?
if [ $rc -eq 0 ] && grep -qx "decision allow" "$T/out" && grep -qx "remaining 0" "$T/out"; then ok; else bad "check allow rc=$rc"; fi
"$R" check --key u --algorithm gcra --rate 1/s --burst 1 --permits 2 >"$T/out"; rc=$?
if [ $rc -eq 1 ] && grep -qx "retry_after inf" "$T/out"; then ok; else bad "check deny rc=$rc"; fi
expect_error '' "--key is required" check --algorithm gcra --rate 1/s --burst 1
expect_error '' "--permits 'x'" check --key u --algorithm gcra --rate 1/s --burst 1 --permits x

# --- --store redis://: the same output as --store memory, in a namespace
# of the run's own that is gone afterwards (a private server, stopped by PID)
if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
  rpid=""
  for _ in 1 2 3 4 5 6 7 8; do
    rport=$((20000 + RANDOM % 40000))
    redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no \
      >"$T/redis.log" 2>&1 &
    rpid=$!
    for _ in $(seq 50); do
      redis-cli -p "$rport" ping >/dev/null 2>&1 && break
      kill -0 "$rpid" 2>/dev/null || break
      sleep 0.1
    done
    redis-cli -p "$rport" ping >/dev/null 2>&1 && break
    kill "$rpid" 2>/dev/null; wait "$rpid" 2>/dev/null; rpid=""
  done
  if [ -n "$rpid" ]; then
    trap 'kill "$rpid" 2>/dev/null; rm -rf "$T"' EXIT
    for args in "$V"/*.args; do
      n=$(basename "$args" .args)
      # shellcheck disable=SC2046
      if "$R" replay $(cat "$args") --store "redis://127.0.0.1:$rport/1" \
           "$V/$n.trace" >"$T/out" 2>/dev/null && cmp -s "$T/out" "$V/$n.out"
      then ok; else bad "replay --store redis:// vector $n"; fi
    done
    if [ "$(redis-cli -p "$rport" -n 1 dbsize)" = 0 ]; then ok
    else bad "replay left keys in Redis"; fi
    for want in allow allow deny; do
      got=$("$R" check --store "redis://127.0.0.1:$rport/1" --key u \
            --algorithm gcra --rate 1/h --burst 2 | head -1)
      if [ "$got" = "decision $want" ]; then ok; else bad "check via Redis: $got"; fi
    done
    expect_error '' "--store: cannot connect to 127.0.0.1:1" replay $TB --store redis://127.0.0.1:1/0
    expect_error '' "--store: 'redis://x:y:z'" replay $TB --store redis://x:y:z
    kill "$rpid"; wait "$rpid" 2>/dev/null
  else
    bad "could not start a private redis-server"
  fi
else
  bad "redis-server is not installed (scripts/deps.sh installs it)"
fi

# --- help
for c in replay compare check bench; do
  if "$R" "$c" --help | grep -q "^usage: ratelimit $c"; then ok; else bad "$c --help"; fi
done
if "$R" --help | grep -q "^usage: ratelimit COMMAND"; then ok; else bad "--help"; fi

echo "cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
