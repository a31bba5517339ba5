#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# replay --fair and compare --fair (docs/fair.md, docs/ratelimit.1): a trace
# through one shared limit divided fairly among its keys.  Saturated keys
# of weights 1:2:4 get shares within 5% of 1:2:4; a light key beside a key
# asking 100x the limit gets what it asks; without --fair the same trace is
# first come, first served; every error names what is wrong.
# Usage: fair_cli_test.sh RATELIMIT_BINARY
set -u
R=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# 10 s of three keys, each asking 1000 times a second (in turn)
awk 'BEGIN { for (i = 0; i < 10000; i++) { t = i / 1000;
       printf "%.6f w1\n%.6f w2\n%.6f w4\n", t, t, t } }' >"$T/sat.trace"
# the admitted column of --per-key for a key
admitted() { awk -v k="$2" '$1 == k { print $3 }' "$1"; }

if "$R" replay --policy "token-bucket 100/s burst=10" --fair upstream \
     --weight w2=2 --weight w4=4 --per-key="$T/pk" "$T/sat.trace" \
     >"$T/out" 2>"$T/err"; then
  a1=$(admitted "$T/pk" w1); a2=$(admitted "$T/pk" w2); a4=$(admitted "$T/pk" w4)
  if awk -v a="$a1" -v b="$a2" -v c="$a4" 'BEGIN { t = a + b + c;
       e1 = t / 7; e2 = 2 * t / 7; e4 = 4 * t / 7;
       exit !(a >= .95 * e1 && a <= 1.05 * e1 && b >= .95 * e2 &&
              b <= 1.05 * e2 && c >= .95 * e4 && c <= 1.05 * e4) }'; then ok
  else bad "weights 1:2:4 got $a1:$a2:$a4"; fi
  # one line per request, naming each request's own key
  if [ "$(wc -l <"$T/out")" = 30000 ] && grep -q $'\tw4\t1\tallow\t' "$T/out"; then ok
  else bad "replay --fair's output lines"; head -3 "$T/out"; fi
else bad "replay --fair failed: $(cat "$T/err")"; fi

# a light key (10/s) beside a heavy one (10000/s) on 100/s
awk 'BEGIN { for (i = 0; i < 100000; i++) { t = i / 10000;
       printf "%.6f heavy\n", t;
       if (i % 1000 == 70) printf "%.6f light\n", t } }' >"$T/light.trace"
"$R" replay --policy "token-bucket 100/s burst=100" --fair upstream \
  --per-key="$T/pk" "$T/light.trace" >/dev/null 2>"$T/err"
l=$(admitted "$T/pk" light)
if [ "${l:-0}" -ge 99 ]; then ok; else bad "light key with --fair got ${l:-none} of 100"; cat "$T/err"; fi
# the same trace without --fair: per-key limits, so run it as one key to
# see first come, first served on the shared limit
sed 's/ heavy$/ shared heavy/; s/ light$/ shared light/' "$T/light.trace" |
  awk '{ print $1, $2 }' >"$T/fcfs.trace"
"$R" replay --policy "token-bucket 100/s burst=100" "$T/fcfs.trace" >"$T/out" 2>/dev/null
paste -d' ' <(awk '{ print $4 }' "$T/out") <(awk '{ print $2 }' "$T/light.trace") >"$T/both"
l=$(awk '$1 == "allow" && $2 == "light"' "$T/both" | wc -l)
if [ "$l" -le 10 ]; then ok; else bad "first come, first served gave the light key $l"; fi

# compare --fair: a row per algorithm, all through the fair limit
if "$R" compare --rate 100/s --fair upstream --weight w4=4 "$T/sat.trace" \
     >"$T/out" 2>"$T/err" && grep -q token-bucket "$T/out" &&
   grep -q sliding-log "$T/out"; then ok
else bad "compare --fair: $(cat "$T/err")"; fi

# errors: one line each, status 2, naming what is wrong
err() {
  local want=$1; shift
  "$R" "$@" "$T/sat.trace" >/dev/null 2>"$T/err"
  local rc=$?
  if [ "$rc" = 2 ] && grep -qF -- "$want" "$T/err" && [ "$(wc -l <"$T/err")" = 1 ]; then ok
  else bad "$* => $rc: $(cat "$T/err") (want '$want')"; fi
}
err "replay: --weight needs --fair KEY" replay --rate 10/s --algorithm token-bucket --burst 5 --weight a=2
err "replay: --weight 'a' is not FLOW=WEIGHT" replay --policy "fixed-window 5/s" --fair u --weight a
err "replay: --weight 'a=0': the weight '0' is not a whole number from 1 to 1048576" replay --policy "fixed-window 5/s" --fair u --weight a=0
err "replay: --weight 'a=x'" replay --policy "fixed-window 5/s" --fair u --weight a=x
err "replay: --weight 'a=1048577'" replay --policy "fixed-window 5/s" --fair u --weight a=1048577
err "replay: --fair decides without waiting: it takes no --max-wait" replay --policy "token-bucket 5/s" --fair u --max-wait 1s
err "replay: --fair '': the shared limit's key must be 1 to 512 bytes" replay --policy "fixed-window 5/s" --fair ""
err "compare: --weight needs --fair KEY" compare --rate 10/s --weight a=2
err "compare: --fair decides without waiting: it takes no --max-wait" compare --rate 10/s --fair u --max-wait 1s

echo "fair_cli: $pass passed, $fail failed"
[ "$fail" = 0 ]
