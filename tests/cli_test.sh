#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
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
# The library's parts this build has (ctest sets RATE_PARTS; all of them
# when the script is run by hand).
parts=${RATE_PARTS-redis dynamodb http}
has_part() { case " $parts " in *" $1 "*) return 0 ;; esac; return 1; }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
# errors: exit 2, nothing on standard output, one line naming the problem
expect_error() { # STDIN MESSAGE ARGS...
  local input=$1 msg=$2; shift 2
  printf '%b' "$input" | "$R" "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -qF -- "$msg" "$T/err" &&
     [ ! -s "$T/out" ]; then ok
  else bad "error '$msg' for: $* (rc=$rc, stderr: $(cat "$T/err"), stdout: $(head -c 80 "$T/out"))"; fi
}

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
if [ "$(cat "$T/err")" = "$(printf 'summary: 3 requests, 2 allowed, 1 denied\nkey\trequests\tadmitted\tdenied\tdenied_share\tfirst_denial_s\tfirst_denial\na\t2\t1\t1\t0.500\t0.000000000\t0\nb\t1\t1\t0\t0.000\t-\t-')" ] &&
   [ "$(wc -l <"$T/out")" -eq 3 ]; then ok; else bad "per-key summary"; cat "$T/err"; fi
# --per-key=FILE: sorted by denials (then requests, then first seen), the
# first denial's time from the start and as written; --top N on stderr
printf '5 c\n5 a\n5.5 a\n6 b\n6 b\n6.25 b\n7 b\n7.1 b\n' | "$R" replay --algorithm fixed-window \
  --limit 1 --window 1s --per-key="$T/pk.tsv" --top 2 >"$T/out" 2>"$T/err"
want=$(printf 'key\trequests\tadmitted\tdenied\tdenied_share\tfirst_denial_s\tfirst_denial\nb\t5\t2\t3\t0.600\t1.000000000\t6\na\t2\t1\t1\t0.500\t0.500000000\t5.5\nc\t1\t1\t0\t0.000\t-\t-')
if [ "$(cat "$T/pk.tsv")" = "$want" ] && grep -q "^2 of 3 keys had a request denied; the 2 denied most:" "$T/err" &&
   grep -qE "^  b +5 +3 +60.0%  1.000: 6$" "$T/err" && ! grep -q "^  c " "$T/err"; then ok
else bad "--per-key=FILE / --top: $(cat "$T/pk.tsv") / $(cat "$T/err")"; fi
expect_error '' "cannot write --per-key '/nonexistent/x.tsv'" replay --policy "gcra 1/s" --per-key=/nonexistent/x.tsv
expect_error '' "--top 'x' is not a whole number" replay --policy "gcra 1/s" --top x

# --- real logs' times: a warning when they are coarser than the policy
# resolves (40 requests of one second: a token bucket admits its burst, a
# leaky bucket one), none when they are fine enough; finer times read from
# a CLF field (nginx's $msec) and from JSON lines
for i in $(seq 0 39); do echo "1000 user"; done >"$T/sec.trace"
for i in $(seq 0 39); do printf '1000.%03d user\n' $((i * 25)); done >"$T/fine.trace"
"$R" replay --policy "token-bucket 10/s burst=20" "$T/sec.trace" >/dev/null 2>"$T/err"
if [ "$(grep -c "warning: the input's times are whole seconds, coarser than 'token-bucket 10/s burst=20' resolves (a permit every 100 ms)" "$T/err")" -eq 1 ] &&
   grep -q "token bucket admits at most its burst" "$T/err" &&
   grep -q "summary: 40 requests, 20 allowed" "$T/err"; then ok
else bad "coarse-time warning: $(cat "$T/err")"; fi
"$R" replay --policy "token-bucket 10/s burst=20" "$T/fine.trace" >/dev/null 2>"$T/err"
if ! grep -q warning "$T/err" && grep -q "summary: 40 requests, 29 allowed" "$T/err"; then ok
else bad "no warning on fine times: $(cat "$T/err")"; fi
"$R" replay --policy "fixed-window 10/s" "$T/sec.trace" >/dev/null 2>"$T/err"
if ! grep -q warning "$T/err"; then ok; else bad "a 1 s window needs no finer times: $(cat "$T/err")"; fi
"$R" compare --rate 10/s "$T/sec.trace" >/dev/null 2>"$T/err"
if [ "$(grep -c warning "$T/err")" -eq 1 ]; then ok; else bad "compare: one warning: $(cat "$T/err")"; fi
i=0; : >"$T/msec.log"; : >"$T/lines.json"
for i in $(seq 0 39); do
  printf '10.0.0.1 - - [02/Dec/2025:03:00:00 +0000] "GET / HTTP/1.1" 200 5 1764644400.%03d\n' $((i * 25)) >>"$T/msec.log"
  printf '{"remote_addr":"10.0.0.1","req":{"uri":"/}"},"time":"1764644400.%03d"}\n' $((i * 25)) >>"$T/lines.json"
done
"$R" replay --input clf --time-field 8 --policy "token-bucket 10/s burst=20" "$T/msec.log" >"$T/out" 2>"$T/err"; rc=$?
"$R" replay --input clf --policy "token-bucket 10/s burst=20" "$T/msec.log" >/dev/null 2>"$T/err2"
if [ $rc -eq 0 ] && grep -q "summary: 40 requests, 29 allowed" "$T/err" && ! grep -q warning "$T/err" &&
   [ "$(head -1 "$T/out" | cut -f1)" = 1764644400.000 ] &&
   grep -q "summary: 40 requests, 20 allowed" "$T/err2" && grep -q "warning" "$T/err2"; then ok
else bad "--time-field on a CLF log: rc=$rc $(cat "$T/err") / $(cat "$T/err2")"; fi
"$R" replay --input json --policy "token-bucket 10/s burst=20" "$T/lines.json" >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 0 ] && grep -q "summary: 40 requests, 29 allowed" "$T/err" &&
   [ "$(head -1 "$T/out" | cut -f1-2)" = "$(printf '1764644400.000\t10.0.0.1')" ]; then ok
else bad "--input json: rc=$rc $(cat "$T/err")"; fi
# the warning says what a sliding window does with whole seconds (about
# half its rate), and reaches a chart saved by compare --svg
"$R" replay --policy "sliding-window 5/500ms" "$T/sec.trace" >/dev/null 2>"$T/err"
if grep -q "sliding window about half its rate" "$T/err" && ! grep -q "fewer than the real" "$T/err"; then ok
else bad "coarse-time warning on a sliding window: $(cat "$T/err")"; fi
"$R" compare --rate 10/s --svg "$T/coarse.svg" "$T/sec.trace" >/dev/null 2>&1
"$R" compare --rate 10/s --svg "$T/finec.svg" "$T/fine.trace" >/dev/null 2>&1
if grep -q "Warning: the input's times are whole seconds" "$T/coarse.svg" &&
   ! grep -q "Warning" "$T/finec.svg" && { ! command -v xmllint >/dev/null || xmllint --noout "$T/coarse.svg"; }; then ok
else bad "the coarse-time warning in compare's chart"; fi
# under --fair the policy's rate is the shared limit's: no key's panel
# draws it as the key's own
"$R" compare --rate 10/s --fair up --svg "$T/fair.svg" "$T/fine.trace" >/dev/null 2>&1
if grep -q "shared fairly by all the keys" "$T/fair.svg" && ! grep -q "stroke-dasharray" "$T/fair.svg" &&
   grep -q "stroke-dasharray" "$T/finec.svg"; then ok
else bad "compare --fair's chart draws the shared rate in a key's panel"; fi
# --time-field on a combined log without $msec: the error says what the
# field is and that leaving the option out reads [time]
printf '10.0.0.1 - - [02/Dec/2025:03:00:00 +0000] "GET / HTTP/1.1" 200 5 "-" "curl/8"\n' >"$T/combined.log"
"$R" replay --input clf --time-field 10 --policy "gcra 1/s" "$T/combined.log" >/dev/null 2>"$T/err"; rc=$?
if [ $rc -eq 2 ] && grep -q "a combined log has 9 fields" "$T/err" && grep -q "leave --time-field out" "$T/err"; then ok
else bad "--time-field past a combined log's fields: rc=$rc $(cat "$T/err")"; fi
# a first denial read from $msec is shown as the date and time it stands for
"$R" replay --input clf --time-field 8 --policy "token-bucket 10/s burst=20" --top 1 \
  --per-key="$T/msec.tsv" "$T/msec.log" >/dev/null 2>"$T/err"
if grep -qE "^  10\.0\.0\.1 .*: 2025-12-02T03:00:00\.[0-9]{3}Z$" "$T/err" &&
   [ "$(tail -1 "$T/msec.tsv" | cut -f7)" = "$(grep -oE '2025-12-02T03:00:00\.[0-9]{3}Z' "$T/err")" ]; then ok
else bad "first denial of a \$msec log as a date: $(cat "$T/err") / $(cat "$T/msec.tsv")"; fi
printf '{"ip":"a","ts":"2025-12-02T03:00:00.5Z"}\n' | "$R" replay --input json --key-field ip --time-field ts --policy "gcra 1/s" >"$T/out" 2>/dev/null
if [ "$(cut -f1-2 "$T/out")" = "$(printf '2025-12-02T03:00:00.5Z\ta')" ]; then ok; else bad "json --key-field/--time-field: $(cat "$T/out")"; fi
expect_error '{"remote_addr":"a"}\n' 'line 1: no time member (name it with --time-field NAME; default "time")' replay --input json --policy "gcra 1/s"
expect_error '{"time":"1"}\n' 'line 1: no key member' replay --input json --policy "gcra 1/s"
expect_error '{"time":"yesterday","remote_addr":"a"}\n' "line 1: time is neither seconds since 1970" replay --input json --policy "gcra 1/s"
expect_error '' "--time-field 'msec' is not a field number from 1 to 64" replay --input clf --time-field msec --policy "gcra 1/s"
expect_error '' "--time-field applies to --input clf or json" replay --time-field 8 --policy "gcra 1/s"
expect_error '' "--input 'xml' is not 'trace', 'clf' or 'json'" replay --input xml --policy "gcra 1/s"
expect_error '10.0.0.1 - - [02/Dec/2025:03:00:00 +0000] "GET / HTTP/1.1" 200 5\n' "line 1: too many fields (a line is TIME KEY [PERMITS]); the line looks like an access log (Common or Combined Log Format): read it with --input clf" replay --policy "gcra 1/s"
expect_error '{"time":1,"remote_addr":"a"}\n' "the line looks like JSON: read it with --input json" replay --policy "gcra 1/s"
# lines that go back in time: one warning naming the first, and the rule
printf '1 a\n2 a\n1.5 b\n0 a\n3 a\n' | "$R" replay --policy "gcra 10/s" >/dev/null 2>"$T/err"
if [ "$(grep -c warning "$T/err")" -eq 1 ] &&
   grep -q "warning: 2 requests are earlier than a line before them (first at line 3, at most 2 s back); a key's clock never runs backwards, so such a request is decided at the latest time its key has seen" "$T/err"; then ok
else bad "out-of-order warning: $(cat "$T/err")"; fi

# --- every name and alias of the library's algorithm map: an alias decides
# exactly as its algorithm's name, in replay, check and the help
alias_same() { # ALIAS NAME OPTIONS...
  local alias=$1 name=$2; shift 2
  printf '0 a\n0 a\n0 a\n0.4 a\n1 a\n1.2 b\n' >"$T/alias.trace"
  "$R" replay --algorithm "$alias" "$@" "$T/alias.trace" >"$T/a" 2>"$T/ea"; local ra=$?
  "$R" replay --algorithm "$name" "$@" "$T/alias.trace" >"$T/b" 2>/dev/null
  "$R" check --key k --algorithm "$alias" "$@" >/dev/null 2>&1; local rc=$?
  if [ $ra -eq 0 ] && [ -s "$T/a" ] && cmp -s "$T/a" "$T/b" && [ $rc -eq 0 ] &&
     "$R" replay --help | grep -qF -- "$name ($alias)"; then ok
  else bad "--algorithm $alias as $name (rc=$ra/$rc: $(cat "$T/ea"))"; fi
}
alias_same gcra token-bucket --rate 2/s --burst 2
alias_same sliding-window-log sliding-log --limit 2 --window 1s
alias_same sliding-window-counter sliding-window --limit 2 --window 1s
# an alias makes the same policy as its name (the output differs from another
# algorithm's on this trace)
"$R" replay --algorithm sliding-window-counter --limit 2 --window 1s "$T/alias.trace" >"$T/a" 2>/dev/null
"$R" replay --algorithm sliding-window-log --limit 2 --window 1s "$T/alias.trace" >"$T/b" 2>/dev/null
"$R" replay --policy "sliding-window-counter 2/s" "$T/alias.trace" >"$T/c" 2>/dev/null
if cmp -s "$T/a" "$T/c" && ! cmp -s "$T/a" "$T/b"; then ok; else bad "sliding-window-counter is sliding-window, not sliding-log"; fi

# --- errors: exit 2, nothing on standard output, one line naming the problem
TB="--algorithm token-bucket --rate 1/s --burst 1"
FW="--algorithm fixed-window --limit 1 --window 1s"
expect_error '' "unknown option '--bogus'" replay $TB --bogus
expect_error '' "option '--rate' needs a value" replay --algorithm token-bucket --rate
expect_error '' "--algorithm or --policy is required" replay --rate 1/s --burst 1
expect_error '' "unknown algorithm 'token'" replay --algorithm token --rate 1/s
expect_error '' "unknown algorithm 'Gcra' (token-bucket (gcra), leaky-bucket, fixed-window, sliding-log (sliding-window-log), sliding-window (sliding-window-counter))" replay --algorithm Gcra --rate 1/s
expect_error '' "--algorithm or --policy is required (token-bucket (gcra), leaky-bucket" check --key u --rate 1/s
expect_error '' "--rate 'x/s': count 'x' is not a whole number up to 2^63-1" replay --algorithm gcra --rate x/s --burst 1
expect_error '' "--rate '10' is not COUNT/DURATION (e.g. 10/s, 100/1m)" replay --algorithm gcra --rate 10 --burst 1
expect_error '' "--burst 'x' is not a whole number up to 2^63-1" replay --algorithm gcra --rate 1/s --burst x
expect_error '' "--capacity does not apply to gcra" replay --algorithm gcra --rate 1/s --burst 1 --capacity 1
expect_error '' "--burst does not apply to sliding-window-counter" replay --algorithm sliding-window-counter --limit 1 --window 1s --burst 1
expect_error '' "--max-wait applies only to token-bucket and leaky-bucket" replay --algorithm sliding-window-log --limit 1 --window 1s --max-wait 1s
# --burst / --capacity are required with --algorithm (spec/cli-replay.md);
# the message names the policy text, whose default is the rate's N, and
# that text decides as the flags with the burst N do
expect_error '' "--burst is required for token-bucket (or give the policy as --policy 'token-bucket 3/s', whose burst defaults to 3)" replay --algorithm token-bucket --rate 3/s
expect_error '' "--capacity is required for leaky-bucket (or give the policy as --policy 'leaky-bucket 3/s', whose capacity defaults to 3)" replay --algorithm leaky-bucket --rate 3/s
printf '0 a\n0 a\n0 a\n0 a\n0.3 a\n0.6 a\n' >"$T/dflt.trace"
for b in "token-bucket burst" "leaky-bucket capacity"; do
  set -- $b
  "$R" replay --policy "$1 3/s" "$T/dflt.trace" >"$T/b" 2>/dev/null
  "$R" replay --algorithm "$1" --rate 3/s --"$2" 3 "$T/dflt.trace" >"$T/c" 2>/dev/null
  if [ -s "$T/b" ] && cmp -s "$T/b" "$T/c"; then ok
  else bad "--policy '$1 3/s' is not --algorithm $1 --rate 3/s --$2 3"; fi
done
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
expect_error '' "is neither 'memory', shm:PATH, nor a redis://, unix:// or dynamodb:// URL" replay $TB --store postgres://x
if has_part redis; then
  expect_error '' "TLS (rediss://) is not supported" replay $TB --store rediss://127.0.0.1:1
  expect_error '' "TLS (rediss://) is not supported" check --key u $TB --store rediss://127.0.0.1:1
else
  expect_error '' "this build has no Redis store (it was built with RATE_WITH_REDIS=OFF)" replay $TB --store redis://127.0.0.1:1/0
  expect_error '' "--redis: this build has no Redis store" bench --redis redis://127.0.0.1:1/0
fi
if ! has_part dynamodb; then
  expect_error '' "this build has no DynamoDB store (it was built with RATE_WITH_DYNAMODB=OFF)" replay $TB --store dynamodb://t
fi
expect_error '' "--shm for a shared-memory region), not 'shm:/tmp/x.rl'" bench --store shm:/tmp/x.rl
# bench: a missing value, two benches, an option the bench would ignore
expect_error '' "bench: option '--rounds' needs a value" bench --rounds
expect_error '' "bench: option '--redis' needs a value" bench --redis
expect_error '' "bench: --shm and --fair are two benches: run one at a time" bench --shm --fair
expect_error '' "bench: --rules and --leases are two benches" bench --rules --leases
expect_error '' "bench: unknown option '--frob'" bench --rules --frob
expect_error '' "bench: --rounds does not apply to --leases" bench --leases --rounds 2
expect_error '' "bench: --java-peer does not apply to --shm" bench --shm --java-peer true
expect_error '' "bench: --iterations does not apply to --fair --redis" bench --fair --redis redis://127.0.0.1:1 --iterations 5
expect_error '' "bench: --redis does not apply to --sync" bench --sync redis://127.0.0.1:1 --redis redis://127.0.0.1:1
expect_error '' "--input 'xml'" replay $TB --input xml
expect_error '' "--key-field 'size'" replay $TB --input clf --key-field size
expect_error '' "unknown command 'replya'" replya
# repeated options: the last wins; --opt=value is --opt value
printf '0 k\n0 k\n' | "$R" replay --algorithm=gcra --rate 1/s --burst 1 --burst=2 >"$T/out" 2>/dev/null
if [ "$(cut -f4 "$T/out" | tr '\n' ' ')" = "allow allow " ]; then ok; else bad "last option wins"; fi

# --- --policy TEXT (the library's text form, composites too) gives the
# output of the equivalent flags, in replay, check and compare
policy_vector() { # VECTOR POLICY [MORE ARGS]
  local n=$1 pol=$2; shift 2
  if "$R" replay --policy "$pol" "$@" "$V/$n.trace" >"$T/out" 2>/dev/null &&
     cmp -s "$T/out" "$V/$n.out"; then ok
  else bad "replay --policy '$pol' (vector $n)"; fi
}
policy_vector fixed-window "fixed-window 2/1s"
policy_vector gcra "gcra 3/500ms burst=1"
policy_vector leaky-bucket "leaky-bucket 20/s capacity=2" --max-wait 100ms
policy_vector sliding-log "sliding-log 2/s"
policy_vector sliding-window "sliding-window 10/1s"
policy_vector token-bucket "token-bucket 2/s burst=2" --max-wait=1s
printf '0 a\n0 a\n0.5 a\n' | "$R" replay --policy "token-bucket 1/s burst=2; fixed-window 1/1h" \
  >"$T/out" 2>/dev/null
if [ "$(cut -f4 "$T/out" | tr '\n' ' ')" = "allow deny deny " ] &&
   [ "$(head -1 "$T/out" | cut -f8)" = 3600.000000000 ]; then ok
else bad "replay --policy composite: $(cat "$T/out")"; fi
"$R" check --key u --policy "token-bucket 1/h burst=1; sliding-log 5/1d" --permits 2 >"$T/out"; rc=$?
if [ $rc -eq 1 ] && grep -qx "decision deny" "$T/out"; then ok; else bad "check --policy deny rc=$rc"; fi
"$R" check --key u --policy "token-bucket 1/h burst=1; sliding-log 5/1d" >"$T/out"; rc=$?
if [ $rc -eq 0 ] && grep -qx "reset_after 86400.000000000" "$T/out"; then ok; else bad "check --policy allow rc=$rc"; fi
"$R" compare --rate 10/s --policy "token-bucket 10/s burst=20; sliding-log 15/2s" \
  --policy "fixed-window 5/500ms" --series "$T/pol.csv" --svg "$T/pol.svg" \
  "$V/edges-chart.trace" >"$T/table" 2>"$T/err"; rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c . "$T/table")" -eq 8 ] &&
   grep -q "^token-bucket 10/s burst=20; sliding-log 15/2s " "$T/table" &&
   grep -q "^fixed-window 5/500ms " "$T/table" &&
   head -1 "$T/pol.csv" | grep -q ',"fixed-window 5/500ms"$' &&
   [ "$(grep -c '<polyline' "$T/pol.svg")" -eq 7 ]; then ok
else bad "compare --policy rows and lines: rc=$rc $(cat "$T/err")"; cat "$T/table"; fi
"$R" compare --policy "fixed-window 10/s" "$V/edges-chart.trace" >"$T/table" 2>&1; rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c . "$T/table")" -eq 2 ]; then ok; else bad "compare --policy alone"; fi
# compare takes the windows' spelling too: --limit N --window DUR = --rate N/DUR
"$R" compare --rate 10/s "$V/edges-chart.trace" >"$T/a" 2>&1
"$R" compare --limit 10 --window 1s "$V/edges-chart.trace" >"$T/b" 2>&1
if cmp -s "$T/a" "$T/b"; then ok; else bad "compare --limit --window"; fi
expect_error '' "--policy replaces --algorithm" replay --policy "gcra 1/s" --algorithm gcra
expect_error '' "--policy replaces --algorithm and its options; drop --burst" check --key u --policy "gcra 1/s" --burst 2
expect_error '' "--policy 'token-bucket 10/fortnight'" replay --policy "token-bucket 10/fortnight"
expect_error '' "--max-wait applies only to token-bucket and leaky-bucket" replay --policy "gcra 1/s; fixed-window 5/1m" --max-wait 1s
expect_error '' "--policy 'nope'" compare --rate 1/s --policy nope
expect_error '' "say the same thing" compare --rate 1/s --limit 1 --window 1s
expect_error '' "--limit needs --window" compare --limit 1

# --- unit words: documented aliases of the spec's units, wherever the
# command reads a rate or a duration; durations stay whole numbers
printf '0 k\n0.5 k\n1 k\n30 k\n59 k\n61 k\n' >"$T/units.trace"
same_as() { # CANONICAL-ARGS -- ALIAS-ARGS (replay over units.trace)
  local canon=$1 alias=$2
  # shellcheck disable=SC2086
  "$R" replay $canon "$T/units.trace" >"$T/a" 2>/dev/null
  # shellcheck disable=SC2086
  if "$R" replay $alias "$T/units.trace" >"$T/b" 2>"$T/err" && [ -s "$T/a" ] &&
     cmp -s "$T/a" "$T/b"; then ok
  else bad "'$alias' should mean '$canon': $(cat "$T/err")"; fi
}
for u in sec secs second seconds; do
  same_as "--algorithm gcra --rate 10/s --burst 1" "--algorithm gcra --rate 10/$u --burst 1"
  same_as "--algorithm fixed-window --limit 1 --window 2s" "--algorithm fixed-window --limit 1 --window 2$u"
done
for u in min mins minute minutes; do
  same_as "--algorithm gcra --rate 1/m --burst 1" "--algorithm gcra --rate 1/$u --burst 1"
  same_as "--algorithm sliding-log --limit 1 --window 1m" "--algorithm sliding-log --limit 1 --window 1$u"
done
for u in hr hrs hour hours; do
  same_as "--algorithm gcra --rate 100/h --burst 1" "--algorithm gcra --rate 100/$u --burst 1"
done
for u in day days; do
  same_as "--algorithm leaky-bucket --rate 1/d --capacity 2" "--algorithm leaky-bucket --rate 1/$u --capacity 2"
done
same_as "--algorithm gcra --rate 1/1s --burst 1 --max-wait 2s" "--algorithm gcra --rate 1/sec --burst 1 --max-wait 2seconds"
same_as "--algorithm gcra --rate 5/250ms --burst 1" "--algorithm gcra --rate 5/250msec --burst 1"
"$R" check --key u --algorithm gcra --rate 10/sec --burst 1 >/dev/null; rc=$?
if [ $rc -eq 0 ]; then ok; else bad "check --rate 10/sec: rc=$rc"; fi
"$R" compare --rate 10/s "$V/edges-chart.trace" >"$T/a" 2>&1
"$R" compare --rate 10/second "$V/edges-chart.trace" >"$T/b" 2>&1
if cmp -s "$T/a" "$T/b"; then ok; else bad "compare --rate 10/second"; fi
expect_error '' "write '1500ms'" replay --algorithm fixed-window --limit 1 --window 1.5s
expect_error '' "write '1500ms'" replay --algorithm gcra --rate 1/1.5s --burst 1
expect_error '' "write '90s'" replay --algorithm gcra --rate 1/1.5min --burst 1
expect_error '' "write '250ms'" check --key u $TB --max-wait 0.25sec
expect_error '' "write '1500ms'" compare --limit 1 --window 1.5s
expect_error '' "--window '1.5s' is not a duration: durations are whole numbers of a unit; write '1500ms'" replay --algorithm fixed-window --limit 1 --window 1.5s
expect_error '' "--rate '1/1.5s': '1.5s' is not a duration: durations are whole numbers of a unit; write '1500ms'" replay --algorithm gcra --rate 1/1.5s --burst 1
expect_error '' "whole numbers of a unit (the smallest is 1ns)" replay --algorithm fixed-window --limit 1 --window 0.0000000001s
expect_error '' "--window '2fortnights' is not a duration" replay --algorithm fixed-window --limit 1 --window 2fortnights
expect_error '' "above 2^63-1 ns" replay --algorithm fixed-window --limit 1 --window 999999999999days

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
# a number too large, and an output that cannot be written, say why
expect_error '' "--top '99999999999999999999' is not a whole number up to 2^63-1" replay $TB --top 99999999999999999999
printf '0 a\n' | "$R" replay $TB >/dev/full 2>"$T/err"
if [ $? -eq 2 ] && grep -qx "ratelimit: replay: cannot write the output: No space left on device" "$T/err"; then ok
else bad "replay to /dev/full: $(cat "$T/err")"; fi
# a key in the library's reserved space is named so, by replay and compare
bad_line '0 a\n0 \xffLEASE\x01\x00x\n' "line 2: KEY begins with the library's reserved bytes" 1
expect_error '0 \xffLEASE\x01\x00x\n' "line 1: KEY begins with the library's reserved bytes" compare --rate 1/s --burst 1
# the largest time and permits are fine; a last line without newline counts
printf '9223372036.854775807 a 9223372036854775807\n1 b' | "$R" replay $TB >"$T/out" 2>/dev/null
if [ $? -eq 0 ] && [ "$(wc -l <"$T/out")" -eq 2 ] && grep -q "	inf	" "$T/out"; then ok; else bad "largest values"; fi

# --- memory: a documented maximum line length (65536 bytes), an error that
# names the line, read in constant memory; --skip-bad skips it
{ echo "0 a"; head -c 70000 /dev/zero | tr '\0' k; echo; echo "1 b"; } >"$T/long.trace"
"$R" replay $TB "$T/long.trace" >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 2 ] && grep -qx "ratelimit: replay: line 2: longer than the maximum of 65536 bytes" "$T/err" &&
   [ "$(wc -l <"$T/out")" -eq 1 ]; then ok; else bad "long line: rc=$rc $(head -c 300 "$T/err")"; fi
"$R" replay --skip-bad $TB "$T/long.trace" >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 0 ] && grep -qx "replay: skipped 1 bad line (line 2)" "$T/err" &&
   [ "$(wc -l <"$T/out")" -eq 2 ]; then ok; else bad "long line --skip-bad: rc=$rc $(cat "$T/err")"; fi
# a line of exactly the maximum is fine
{ printf '0 '; head -c 65534 /dev/zero | tr '\0' k; echo; } >"$T/max.trace"
"$R" replay $TB "$T/max.trace" >/dev/null 2>"$T/err"
if grep -q "KEY longer than 512" "$T/err"; then ok; else bad "a line of 65536 bytes: $(cat "$T/err")"; fi
# a 256 MB line under a 128 MB address-space limit (when the binary runs
# under one at all: not with AddressSanitizer)
if (ulimit -v 131072; "$R" --version) >/dev/null 2>&1; then
  (ulimit -v 131072; head -c 268435456 /dev/zero | tr '\0' k | "$R" replay --skip-bad $TB) \
    >"$T/out" 2>"$T/err"; rc=$?
  if [ $rc -eq 0 ] && grep -q "skipped 1 bad line (line 1)" "$T/err"; then ok
  else bad "a 256 MB line in 128 MB: rc=$rc $(head -c 300 "$T/err")"; fi
fi
# --max-keys N: the memory store keeps N keys; evictions are counted and
# can change answers (k1 comes back cold)
{ for i in $(seq 100); do echo "0 k$i"; done; echo "1 k1"; } >"$T/keys.trace"
FWH="--algorithm fixed-window --limit 1 --window 1h"
"$R" replay $FWH --max-keys 10 "$T/keys.trace" >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 0 ] && [ "$(tail -1 "$T/out" | cut -f4)" = allow ] &&
   grep -q "^replay: --max-keys 10 evicted 9[01] keys" "$T/err"; then ok
else bad "--max-keys: rc=$rc $(cat "$T/err")"; fi
"$R" replay $FWH "$T/keys.trace" >"$T/out" 2>"$T/err"
if [ "$(tail -1 "$T/out" | cut -f4)" = deny ] && ! grep -q evicted "$T/err"; then ok
else bad "unbounded replay"; fi
expect_error '' "--max-keys '0'" replay $FW --max-keys 0
expect_error '' "--max-keys bounds the memory store and a shared-memory region the command creates only" replay $FW --max-keys 5 --store redis://127.0.0.1:1/0

# --- clear messages: a directory as FILE, a bad unix-socket path
for sub in replay compare; do
  if [ $sub = replay ]; then a=$TB; else a="--rate 1/s"; fi
  # shellcheck disable=SC2086
  expect_error '' "$sub: '$T' is a directory, not a trace or log file" $sub $a "$T"
done
expect_error '' "--store 'unix:///nonexistent.sock': /nonexistent.sock: No such file or directory" replay $TB --store unix:///nonexistent.sock
expect_error '' "--store 'unix://$T': $T is not a socket" check --key u $TB --store "unix://$T"
expect_error '' "a unix:// URL needs an absolute path" replay $TB --store unix://relative.sock
if has_part redis && command -v python3 >/dev/null; then
  python3 -c "import socket,sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])" "$T/stale.sock"
  expect_error '' "--store: cannot connect to $T/stale.sock: Connection refused" replay $TB --store "unix://$T/stale.sock"
  # the library's own message names the socket by its path alone (no port)
  for sub in replay check; do
    if [ $sub = replay ]; then a=""; else a="--key u"; fi
    # shellcheck disable=SC2086
    "$R" $sub $a $TB --store "unix://$T/stale.sock" </dev/null >/dev/null 2>"$T/err"
    if grep -qxF "ratelimit: $sub: --store: cannot connect to $T/stale.sock: Connection refused" "$T/err"; then ok
    else bad "$sub: unix socket message: $(cat "$T/err")"; fi
  done
elif has_part redis && [ "${CI:-}" = true ]; then
  bad "python3 is missing (CI=true): the stale Unix socket case cannot run"
fi

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
clf_error '1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GET /" 200 1 "ref" "agent' "unclosed quote"

# access-log times: no wrap-around after 2262, no impossible dates or zones
clf_time_error() { # TIMESTAMP MESSAGE
  { echo '1.2.3.4 - - [01/Jan/2024:00:00:00 +0000] "GET /" 200 1'
    echo "1.2.3.4 - - [$1] \"GET /\" 200 1"; } >"$T/t.log"
  "$R" replay --input clf $FW "$T/t.log" >"$T/out" 2>"$T/err"; rc=$?
  if [ $rc -eq 2 ] && grep -qF "line 2: $2" "$T/err" && [ "$(wc -l <"$T/out")" -eq 1 ]; then ok
  else bad "clf time '$1': rc=$rc $(cat "$T/err")"; fi
  "$R" replay --input clf --skip-bad $FW "$T/t.log" >"$T/out" 2>"$T/err"; rc=$?
  if [ $rc -eq 0 ] && grep -q "skipped 1 bad line (line 2)" "$T/err"; then ok
  else bad "clf time '$1' --skip-bad: rc=$rc"; fi
}
clf_time_error "01/Jan/2600:00:00:00 +0000" "timestamp after 2262-04-11"
clf_time_error "31/Feb/2024:00:00:00 +0000" "timestamp has a day its month does not have"
clf_time_error "29/Feb/2021:00:00:00 +0000" "timestamp has a day its month does not have"
clf_time_error "01/Mar/2024:00:00:00 +9900" "timestamp's zone is more than 14 hours"
printf '%s\n' '1.2.3.4 - - [29/Feb/2024:12:00:00 +0000] "GET /" 200 1' |
  "$R" replay --input clf $FW >"$T/out" 2>/dev/null
if [ "$(cut -f1 "$T/out")" = "29/Feb/2024:12:00:00 +0000" ]; then ok; else bad "29/Feb/2024"; fi

# --- real access logs: trailing fields, the key from any field or the
# forwarded-for address, --skip-bad
L1='10.0.0.1 - - [01/Jan/2024:00:00:00 +0000] "GET /a HTTP/1.1" 200 5 "-" "curl/8" "203.0.113.7, 10.0.0.9"'
L2='10.0.0.1 - - [01/Jan/2024:00:00:00 +0000] "-" 400 0 "-" "-" "198.51.100.2"'
L3='10.0.0.1 - - [01/Jan/2024:00:00:01 +0000] "GET /b HTTP/1.1" 200 5 "-" "curl/8" "-"'
printf '%s\n%s\n%s\n' "$L1" "$L2" "$L3" >"$T/nginx.log"
"$R" replay --input clf --key-field xff $FW "$T/nginx.log" >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 0 ] && [ "$(cut -f2 "$T/out" | tr '\n' ' ')" = "203.0.113.7 198.51.100.2 10.0.0.1 " ]; then ok
else bad "--key-field xff: rc=$rc $(cat "$T/err") $(cut -f2 "$T/out")"; fi
"$R" replay --input clf --key-field path $FW "$T/nginx.log" >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 0 ] && [ "$(cut -f2 "$T/out" | tr '\n' ' ')" = "/a - /b " ]; then ok
else bad "--key-field path on a \"-\" request: rc=$rc $(cat "$T/err")"; fi
"$R" replay --input clf --key-field 9 $FW "$T/nginx.log" >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 0 ] && [ "$(cut -f2 "$T/out" | tr '\n' ' ')" = "curl/8 - curl/8 " ]; then ok
else bad "--key-field 9: rc=$rc $(cat "$T/err")"; fi
expect_error '' "--key-field '0'" replay $FW --input clf --key-field 0
{ echo "$L1"; echo "garbage"; echo "$L3"; echo "also garbage"; } >"$T/mixed.log"
"$R" replay --input clf $FW "$T/mixed.log" >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 2 ] && grep -q "line 2: " "$T/err" && [ "$(wc -l <"$T/out")" -eq 1 ]; then ok
else bad "a bad clf line without --skip-bad: rc=$rc"; fi
"$R" replay --input clf --skip-bad $FW "$T/mixed.log" >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 0 ] && [ "$(wc -l <"$T/out")" -eq 2 ] &&
   grep -qx "replay: skipped 2 bad lines (lines 2, 4)" "$T/err" &&
   grep -q "^summary: 2 requests" "$T/err"; then ok
else bad "--skip-bad: rc=$rc $(cat "$T/err")"; fi
printf '0 a\nx\n1 b\n2\n3 c d\n4 e\n.5 f\n6 g 1.5\n7 h 9 9\n' >"$T/bad.trace"
"$R" replay --skip-bad $FW "$T/bad.trace" >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 0 ] && [ "$(wc -l <"$T/out")" -eq 3 ] &&
   grep -qx "replay: skipped 6 bad lines (lines 2, 4, 5, 7, 8, ...)" "$T/err"; then ok
else bad "--skip-bad on a trace: rc=$rc $(cat "$T/err")"; fi
"$R" compare --rate 1/s --skip-bad "$T/bad.trace" >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 0 ] && grep -q "compare: skipped 6 bad lines" "$T/err"; then ok
else bad "compare --skip-bad: rc=$rc $(cat "$T/err")"; fi

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

# --- compare's chart shows what the table says: --series writes the plotted
# numbers (admitted in the last period, sampled every 1/128 of it); around
# the edge at 2 s the fixed window's line peaks above its limit, the sliding
# log's never does; the last sample is a whole window, not a drop.
col_max() { # CSV COLUMN-NAME
  awk -F, -v name="\"$2\"" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == name) c = i; next }
    c && $c + 0 > m { m = $c + 0 } END { print m + 0 }' "$1"
}
"$R" compare --rate 10/s --series "$T/series.csv" --svg "$T/chart.svg" \
  "$V/edges-chart.trace" >"$T/table" 2>"$T/err"
fw=$(col_max "$T/series.csv" "fixed-window 10/s")
sl=$(col_max "$T/series.csv" "sliding-log 10/s")
spike=$(awk '$1 == "fixed-window" {print $(NF-2)}' "$T/table")
if [ "$fw" -gt 10 ] && [ "$fw" = "$spike" ] && [ "$sl" -le 10 ] && [ "$sl" -ge 5 ]; then ok
else bad "chart series at edges: fixed-window peak $fw (table: $spike), sliding-log peak $sl"; head -3 "$T/series.csv"; fi
last=$(tail -1 "$T/series.csv" | cut -d, -f2)
if [ "$last" = 5 ] && [ "$(grep -c '^[0-9]' "$T/series.csv")" -ge 30 ]; then ok
else bad "chart series: last sample $last (want 5: the steady rate, no drop)"; fi
if grep -q "Requests per 1 s of the key, and what each policy admits" "$T/chart.svg" &&
   grep -q "seconds from the start of the trace" "$T/chart.svg"; then ok; else bad "chart title"; fi
# --- the chart of a dated log: the keys denied most, one column each, in
# that order; clock times (not 1.76464e+09); the policy's rate drawn
{ for i in $(seq 0 99); do printf '10.0.0.1 - - [02/Dec/2025:03:00:%02d +0000] "GET / HTTP/1.1" 200 5 %d.%03d\n' $((i / 10)) $((1764644400 + i / 10)) $((i % 10 * 100)); done
  for i in $(seq 0 49); do printf '10.0.0.2 - - [02/Dec/2025:03:00:%02d +0000] "GET / HTTP/1.1" 200 5 %d.%03d\n' $((i / 5)) $((1764644400 + i / 5)) $((i % 5 * 200)); done
  for i in $(seq 0 199); do printf '10.0.0.3 - - [02/Dec/2025:03:00:%02d +0000] "GET / HTTP/1.1" 200 5 %d.%03d\n' $((i / 20)) $((1764644400 + i / 20)) $((i % 20 * 50)); done
  for k in 4 5 6; do printf '10.0.0.%d - - [02/Dec/2025:03:00:00 +0000] "GET / HTTP/1.1" 200 5 1764644400.000\n' $k; done
} | sort -t' ' -k11,11 -s >"$T/keys.log"
"$R" compare --input clf --time-field 8 --policy "token-bucket 4/s burst=4" \
  --policy "sliding-log 4/s" --svg "$T/keys.svg" "$T/keys.log" >/dev/null 2>"$T/err"; rc=$?
heads=$(grep -o 'font-size="12" font-weight="bold">[^<]*' "$T/keys.svg" | sed 's/.*>//' | tr '\n' ' ')
if [ $rc -eq 0 ] && xmllint --noout "$T/keys.svg" && [ "$heads" = "10.0.0.3 10.0.0.1 10.0.0.2 " ] &&
   grep -q "of the 3 keys denied most (of 6)" "$T/keys.svg" && grep -q ">03:00:05<" "$T/keys.svg" &&
   grep -q "time (UTC) on 2025-12-02" "$T/keys.svg" && ! grep -q "e+09" "$T/keys.svg" &&
   [ "$(grep -c 'stroke-dasharray="5 3"/>' "$T/keys.svg")" -eq 7 ] &&
   [ "$(grep -c '<polyline' "$T/keys.svg")" -eq 6 ] && [ "$(grep -c '<polygon' "$T/keys.svg")" -eq 6 ]; then ok
else bad "per-key chart: rc=$rc heads '$heads' $(cat "$T/err")"; fi

# --- every subcommand that reads input, on an empty input and on one of
# only comments and blank lines: it ends (a time limit), exits 0, and writes
# no NaN (compare --svg used to loop for ever writing "-nan" lines).
: >"$T/empty.trace"
printf '# only a comment\n\n  # another\n' >"$T/comments.trace"
for input in empty comments; do
  f="$T/$input.trace"
  for fmt in trace clf; do
    timeout 20 "$R" replay --input $fmt $TB "$f" >"$T/out" 2>"$T/err"; rc=$?
    if [ $rc -eq 0 ] && [ ! -s "$T/out" ] &&
       grep -qx "summary: 0 requests, 0 allowed, 0 denied" "$T/err"; then ok
    else bad "replay --input $fmt on $input input: rc=$rc $(head -c 200 "$T/err")"; fi
    timeout 20 "$R" replay --input $fmt $TB <"$f" >"$T/out" 2>/dev/null; rc=$?
    if [ $rc -eq 0 ] && [ ! -s "$T/out" ]; then ok
    else bad "replay --input $fmt on $input standard input: rc=$rc"; fi
    rm -f "$T/e.svg"
    timeout 20 "$R" compare --input $fmt --rate 10/s --svg "$T/e.svg" "$f" \
      >"$T/out" 2>"$T/err"; rc=$?
    if [ $rc -eq 0 ] && [ "$(wc -c <"$T/e.svg")" -lt 100000 ] &&
       ! grep -qi "nan" "$T/e.svg" && xmllint --noout "$T/e.svg" 2>/dev/null &&
       grep -q "^fixed-window" "$T/out"; then ok
    else bad "compare --svg --input $fmt on $input input: rc=$rc $(head -c 200 "$T/err")"; fi
    timeout 20 "$R" replay --input $fmt --per-key --skip-bad --policy "gcra 1/s; sliding-log 2/1m" "$f" \
      >"$T/out" 2>"$T/err"; rc=$?
    if [ $rc -eq 0 ] && [ ! -s "$T/out" ] && [ "$(wc -l <"$T/err")" -eq 2 ] &&
       [ "$(tail -1 "$T/err" | cut -f1-2)" = "$(printf 'key\trequests')" ]; then ok
    else bad "replay --per-key --skip-bad --policy on $input input: rc=$rc $(cat "$T/err")"; fi
    timeout 20 "$R" compare --input $fmt --policy "gcra 1/s" --series "$T/e.csv" "$f" >"$T/out" 2>"$T/err"; rc=$?
    if [ $rc -eq 0 ] && [ "$(cat "$T/e.csv")" = 'time,offered,"token-bucket 1/s burst=1"' ]; then ok
    else bad "compare --series on $input input: rc=$rc $(cat "$T/e.csv")"; fi
    timeout 20 "$R" compare --input $fmt --rate 10/s <"$f" >"$T/out" 2>"$T/err"; rc=$?
    if [ $rc -eq 0 ] && [ "$(grep -c ' 0 ' "$T/out")" -ge 5 ]; then ok
    else bad "compare --input $fmt on $input standard input: rc=$rc"; fi
  done
done
# check reads no input; bench neither (it makes its own)
timeout 20 "$R" check --key u $TB </dev/null >/dev/null; rc=$?
if [ $rc -eq 0 ]; then ok; else bad "check with an empty standard input: rc=$rc"; fi

# --- check: exit 0 allowed, 1 denied, 2 error
"$R" check --key u --algorithm gcra --rate 1/s --burst 1 >"$T/out"; rc=$?
if [ $rc -eq 0 ] && grep -qx "decision allow" "$T/out" && grep -qx "remaining 0" "$T/out"; then ok; else bad "check allow rc=$rc"; fi
"$R" check --key u --algorithm gcra --rate 1/s --burst 1 --permits 2 >"$T/out"; rc=$?
if [ $rc -eq 1 ] && grep -qx "retry_after inf" "$T/out"; then ok; else bad "check deny rc=$rc"; fi
# without --store each run starts cold, and check says so (on standard
# error: standard output stays the decision); with a store it does not
"$R" check --key u --algorithm gcra --rate 1/s --burst 1 >/dev/null 2>"$T/err"
"$R" check --key u --algorithm gcra --rate 1/s --burst 1 --store "shm:$T/note.rl" >/dev/null 2>"$T/err2"
if grep -q "no --store, so a fresh memory store" "$T/err" && ! grep -q "note" "$T/err2"; then ok
else bad "check without --store: $(cat "$T/err") / $(cat "$T/err2")"; fi
expect_error '' "--key is required" check --algorithm gcra --rate 1/s --burst 1
expect_error '' "--permits 'x'" check --key u --algorithm gcra --rate 1/s --burst 1 --permits x

# --- --store redis://: the same output as --store memory, in a namespace
# of the run's own that is gone afterwards (a private server, stopped by PID)
if ! has_part redis; then
  : # a build without the Redis store: refused above
elif command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
  . "$(dirname "$0")/lib/servers.sh"
  start_redis "$T/redis.log"
  if [ -n "$rpid" ]; then
    trap 'kill "$rpid" 2>/dev/null; rm -rf "$T"' EXIT
    # Where a run's output is the point, not the store's timeout: a
    # timeout that a loaded machine does not reach (the default 1 s was:
    # "replay via Redis ... rc=2").  The stalls below hold the timeouts.
    ST="--store-timeout 60s"
    for args in "$V"/*.args; do
      n=$(basename "$args" .args)
      # shellcheck disable=SC2046
      if "$R" replay $(cat "$args") --store "redis://127.0.0.1:$rport/1" $ST \
           "$V/$n.trace" >"$T/out" 2>/dev/null && cmp -s "$T/out" "$V/$n.out"
      then ok; else bad "replay --store redis:// vector $n"; fi
    done
    for f in "$T/empty.trace" "$T/comments.trace"; do
      "$R" replay $TB --store "redis://127.0.0.1:$rport/1" $ST "$f" >"$T/out" 2>"$T/err"; rc=$?
      if [ $rc -eq 0 ] && [ ! -s "$T/out" ]; then ok; else bad "replay via Redis on $f: rc=$rc"; fi
    done
    if [ "$(redis-cli -p "$rport" -n 1 dbsize)" = 0 ]; then ok
    else bad "replay left keys in Redis"; fi
    for want in allow allow deny; do
      got=$("$R" check --store "redis://127.0.0.1:$rport/1" $ST --key u \
            --algorithm gcra --rate 1/h --burst 2 | head -1)
      if [ "$got" = "decision $want" ]; then ok; else bad "check via Redis: $got"; fi
    done
    # Why a check failed: a key of another type, a hash of damaged bytes
    # (each named, and left as it is), a full Redis (the server's words).
    r6() { redis-cli -p "$rport" -n 6 "$@" >/dev/null; }
    c6() { echo check --store "redis://127.0.0.1:$rport/6" --key "$1" --algorithm gcra --rate 1/h --burst 2; }
    r6 lpush "ratelimit:{u}" x
    # shellcheck disable=SC2046
    expect_error '' "check: key 'u': the Redis key of its state is not a hash but another type (127.0.0.1:$rport: replied: WRONGTYPE" $(c6 u)
    r6 del "ratelimit:{u}"; r6 hset "ratelimit:{u}" v 1 s garbage
    # shellcheck disable=SC2046
    expect_error '' "check: key 'u': its state in Redis is a hash whose bytes are not a valid state for this library" $(c6 u)
    if [ "$(redis-cli -p "$rport" -n 6 hget "ratelimit:{u}" s)" = garbage ]; then ok
    else bad "a damaged state was written over"; fi
    r6 config set maxmemory-policy noeviction; r6 config set maxmemory 1
    # shellcheck disable=SC2046
    expect_error '' "check: store unavailable: 127.0.0.1:$rport: replied: OOM command not allowed" $(c6 v)
    r6 config set maxmemory 0; r6 flushdb
    # Stopped by a signal, killed, or Redis stalled: the run's keys do not
    # stay behind, and one line of error says what happened.
    rkeys() { redis-cli -p "$rport" -n 3 dbsize; }
    keys_are() { [ "$(rkeys)" = "$1" ]; }
    keys_over() { [ "$(rkeys)" -gt "$1" ]; }
    wait_keys() { wait_until "$TEST_WAIT_S" keys_are "$1"; }
    rm -f "$T/fifo"; mkfifo "$T/fifo"
    for sig in INT TERM KILL; do
      { for i in $(seq 300); do echo "0 k$i"; done; exec sleep 600; } >"$T/fifo" & # (holds the pipe open: killed below)
      feeder=$!
      "$R" replay $TB --store "redis://127.0.0.1:$rport/3" <"$T/fifo" >"$T/out" 2>"$T/err" &
      rp=$!
      # 300 keys and the record of the policy they were written under
      if wait_keys 301; then ok; else bad "replay via Redis never wrote its keys ($sig)"; fi
      kill -$sig "$rp"; { wait "$rp"; } 2>/dev/null; rc=$?
      kill "$feeder" 2>/dev/null; wait "$feeder" 2>/dev/null
      case $sig in INT) want=130;; TERM) want=143;; KILL) want=137;; esac
      if [ $rc -eq $want ] && wait_keys 0; then ok
      else bad "replay --store redis stopped by SIG$sig: rc=$rc, $(rkeys) keys left"; fi
      if [ $sig != KILL ]; then
        if [ "$(wc -l <"$T/err")" -eq 1 ] &&
           grep -qx "ratelimit: replay: stopped by SIG$sig after line 300; the run's Redis keys were removed" "$T/err" &&
           [ "$(wc -l <"$T/out")" -eq 300 ]; then ok
        else bad "SIG$sig message: $(cat "$T/err")"; fi
      fi
    done
    # Killed together with its watchdog: every key left behind has a safety
    # expiry of at most 60 s, the policy's record too, refreshed while the
    # run lasts, also while it waits for its input (at 20 s: after 21 s
    # idle, more than 45 s are left)
    k4() { redis-cli -p "$rport" -n 4 "$@"; }
    { for i in $(seq 300); do echo "0 k$i"; done; exec sleep 600; } >"$T/fifo" & # (holds the pipe open: killed below)
    feeder=$!
    "$R" replay $TB --store "redis://127.0.0.1:$rport/4" <"$T/fifo" >/dev/null 2>"$T/err" &
    rp=$!
    k4_301() { [ "$(k4 dbsize)" = 301 ]; }
    wait_until "$TEST_WAIT_S" k4_301
    # The keeper's first refresh (20 s in, by the run's wall clock): the
    # policy record's PTTL goes up, then every key's is above 45 s.
    rec=$(k4 --scan --pattern 'ratelimit:replay:*:p{*' | head -n 1)
    pttl0=$(k4 pttl "$rec")
    refreshed() { [ "$(k4 pttl "$rec")" -gt "$pttl0" ]; }
    all_fresh() {
      k4 --scan | sed 's/^/PTTL /' | k4 | awk '!($1 > 45000) { b = 1 } END { exit b }'
    }
    if [ -n "$rec" ] && wait_until $((TEST_WAIT_S + 20)) refreshed &&
       wait_until "$TEST_WAIT_S" all_fresh; then ok
    else bad "replay via Redis: no refresh of the safety expiry ($rec: $pttl0 ms, then $(k4 pttl "$rec") ms)"; fi
    wd=$(ps -o pid= --ppid "$rp" | tr -d ' ')
    if [ -n "$wd" ] && [ "$(k4 dbsize)" = 301 ]; then ok
    else bad "replay via Redis: no watchdog ($wd) or not 301 keys ($(k4 dbsize))"; fi
    # shellcheck disable=SC2086
    [ -n "$wd" ] && kill -KILL $wd
    kill -KILL "$rp"; { wait "$rp"; } 2>/dev/null
    kill "$feeder" 2>/dev/null; wait "$feeder" 2>/dev/null
    # (the watchdog gone, not a zombie: it can remove nothing after this)
    wd_gone() { [ -z "$wd" ] || [ ! -e "/proc/$wd" ] || grep -q '^[^)]*) Z' "/proc/$wd/stat" 2>/dev/null; }
    wait_until "$TEST_WAIT_S" wd_gone || bad "the watchdog $wd outlived SIGKILL"
    k4 --scan >"$T/keys"
    sed 's/^/PTTL /' "$T/keys" | k4 >"$T/pttl"
    if [ "$(wc -l <"$T/keys")" -eq 301 ] && [ "$(wc -l <"$T/pttl")" -eq 301 ] &&
       grep -q '^ratelimit:replay:[0-9]*:[0-9]*:p{' "$T/keys" &&
       awk '!($1 > 45000 && $1 <= 60000) { exit 1 }' "$T/pttl"; then ok
    else bad "replay killed with its watchdog: $(wc -l <"$T/keys") keys, PTTLs $(sort -n "$T/pttl" | uniq -c | head -5 | tr '\n' ' ')"; fi
    k4 flushdb >/dev/null
    # Redis stalls (stopped for 3 s): the run fails with one line and its
    # keys are removed once Redis answers again
    awk 'BEGIN { for (i = 0; i < 300000; i++) print "0 k" i }' >"$T/many.trace"
    "$R" replay $TB --store "redis://127.0.0.1:$rport/3" "$T/many.trace" >/dev/null 2>"$T/err" &
    rp=$!
    wait_until "$TEST_WAIT_S" keys_over 100
    # (a stall of 3 s of wall time, past the default 1 s timeout: the point)
    kill -STOP "$rpid"; sleep 3; kill -CONT "$rpid"
    wait "$rp"; rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] &&
       grep -q "^ratelimit: replay: line [0-9]*: store did not answer in time: 127.0.0.1:$rport: no reply within the command timeout (1000 ms); the run's Redis keys" "$T/err" &&
       wait_keys 0; then ok
    else bad "replay during a Redis stall: rc=$rc, $(rkeys) keys left, $(cat "$T/err")"; fi
    # A stall shorter than --store-timeout: the run rides it out, every
    # line answered (with the default 1 s it fails, as above)
    awk 'BEGIN { for (i = 0; i < 20000; i++) print "0 s" i }' >"$T/stall.trace"
    "$R" replay $TB --store "redis://127.0.0.1:$rport/3" --store-timeout 60s \
      "$T/stall.trace" >"$T/out" 2>"$T/err" &
    rp=$!
    wait_until "$TEST_WAIT_S" keys_over 100
    kill -STOP "$rpid"; sleep 2; kill -CONT "$rpid" # a 2 s stall: the point
    wait "$rp"; rc=$?
    if [ $rc -eq 0 ] && [ "$(wc -l <"$T/out")" -eq 20000 ] && wait_keys 0; then ok
    else bad "replay --store-timeout 60s during a 2 s stall: rc=$rc, $(wc -l <"$T/out") lines, $(cat "$T/err")"; fi
    expect_error '' "--store-timeout 'x'" replay $TB --store "redis://127.0.0.1:$rport/3" --store-timeout x
    expect_error '' "--store-timeout '0': must be more than 0" check --key k --algorithm gcra --rate 1/s \
      --store "redis://127.0.0.1:$rport/3" --store-timeout 0
    expect_error '' "--store-timeout applies to a redis://, unix:// or dynamodb:// store only" \
      replay $TB --store-timeout 5s
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

# --- the man page documents every option the command accepts (the long
# options of each subcommand's table, and bench's own), and renders
SRC=$(cd "$V/../.." && pwd)
MAN=$SRC/docs/ratelimit.1
opts=$( { grep -ho '{"[a-z-]*", *\(required\|no\|optional\)_argument' "$SRC"/tools/ratelimit/*.[ch] |
          sed 's/{"\([a-z-]*\)".*/\1/'
        grep -ho 'strcmp(argv\[i\], "--[a-z-]*")' "$SRC"/tools/ratelimit/*.c |
          sed 's/.*"--\([a-z-]*\)".*/\1/'
        grep -ho '{"--[a-z-]*", \(true\|false\),' "$SRC"/tools/ratelimit/*.c |
          sed 's/{"--\([a-z-]*\)".*/\1/'
        echo version; } | sort -u)
nopts=0
for o in $opts; do
  nopts=$((nopts + 1))
  esc=${o//-/\\-}
  if grep -qF -- "\\-\\-$esc" "$MAN"; then ok; else bad "--$o is not in docs/ratelimit.1"; fi
done
if [ "$nopts" -ge 20 ]; then ok; else bad "found only $nopts options in the sources"; fi
if command -v man >/dev/null; then
  if [ -z "$(man --warnings -l "$MAN" 2>&1 >/dev/null)" ] &&
     man -l "$MAN" 2>/dev/null | grep -q "EXIT STATUS"; then ok
  else bad "man -l docs/ratelimit.1: $(man --warnings -l "$MAN" 2>&1 >/dev/null | head -3)"; fi
fi
if "$R" --version | grep -qx 'ratelimit [0-9]*\.[0-9]*\.[0-9]*'; then ok
else bad "--version"; fi

echo "cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
