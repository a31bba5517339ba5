#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ratelimit check under an in-flight policy (docs/leases.md): a lease of
# the key held while a command runs, on a shared-memory region.  The
# command's status passes through; the (N+1)-th concurrent job is denied
# with 75 and not run; a lease comes back when its job ends, when check is
# sent SIGTERM (passed on) and when check is killed with SIGKILL (taken
# back from the dead holder at once, its command killed with it); a job
# running past the TTL keeps its lease (extended every third of the TTL);
# a check without a shared store is refused; policy errors.
# No assertion depends on speed except the extension, whose slack is two
# thirds of a 3 s TTL; every wait is a bounded poll.
# On Redis, check and a program on the library's defaults (LEASE_HOLD)
# share one key under one clock: N=1 held by either denies the other.
# Usage: lease_cli_test.sh RATELIMIT_BINARY [LEASE_HOLD]
set -u
R=$1
H=${2-}
T=$(mktemp -d)
P=/dev/shm/rl-lease-cli-$$
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$T"; rm -f "$P"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
POL="concurrency 2 ttl=3s"
chk() { "$R" check --key job --policy "$POL" --store "shm:$P" "$@"; }
# Waits (up to 60 s) for a file to appear.
await() { for _ in $(seq 600); do [ -e "$1" ] && return 0; sleep 0.1; done; return 1; }
# A job under check that says it started and runs until its go file
# appears; a simple command, so that $! is check's own pid.
J='echo $$ > "$0/pid.$1"; touch "$0/started.$1"; while [ ! -e "$0/go.$1" ]; do sleep 0.05; done'

# The command's exit status, and its output, pass through.
out=$(chk -- sh -c 'echo ran; exit 3'); rc=$?
if [ $rc = 3 ] && [ "$out" = ran ]; then ok; else bad "status $rc, output '$out'"; fi

# Two jobs hold both leases; the third is denied (75) and does not run.
"$R" check --key job --policy "$POL" --store "shm:$P" -- sh -c "$J" "$T" a & A=$!
"$R" check --key job --policy "$POL" --store "shm:$P" -- sh -c "$J" "$T" b & B=$!
await "$T/started.a" && await "$T/started.b" || bad "jobs did not start"
out=$(chk -- touch "$T/third"); rc=$?
if [ $rc = 75 ] && [ ! -e "$T/third" ] && grep -q '^decision deny' <<<"$out" &&
   grep -q '^remaining 0' <<<"$out"; then ok
else bad "third job: status $rc, ran: $([ -e "$T/third" ] && echo yes), '$out'"; fi

# A job that ends gives its lease back.
touch "$T/go.a"; wait $A
if chk -- true; then ok; else bad "no lease after a job ended"; fi

# SIGTERM: passed on to the job, the lease released, 128+15.
"$R" check --key job --policy "$POL" --store "shm:$P" -- sh -c "$J" "$T" c & C=$!
await "$T/started.c" || bad "job c did not start"
out=$(chk -- true); rc=$?
[ $rc = 75 ] && ok || bad "two held, a third was not denied ($rc)"
kill -TERM $C; wait $C; rc=$?
if [ $rc = 143 ] && chk -- true; then ok; else bad "after SIGTERM: status $rc"; fi

# SIGKILL: the dead holder's lease is taken back at once (not after 3 s:
# the region's dead holders are reaped).
"$R" check --key job --policy "$POL" --store "shm:$P" -- sh -c "$J" "$T" d & D=$!
await "$T/started.d" || bad "job d did not start"
kill -KILL $D; wait $D 2>/dev/null
out=$(chk -- true); rc=$?
if [ $rc = 0 ]; then ok; else bad "after SIGKILL: status $rc, '$out'"; fi
# Its command died with it (no job runs on after its lease was taken
# back): gone or a zombie within a bounded poll (10 s).
cmdpid=$(cat "$T/pid.d")
alive() { [ -e /proc/$1 ] && ! grep -q '^[^)]*) Z' /proc/$1/stat 2>/dev/null; }
for _ in $(seq 100); do alive "$cmdpid" || break; sleep 0.1; done
if ! alive "$cmdpid"; then ok; else bad "the command of a killed check runs on"; fi
touch "$T/go.d" # if it did run on, it ends now

# A job past its TTL keeps its lease: at 4.5 s into a 3 s TTL the two
# jobs b and e still hold both.
"$R" check --key job --policy "$POL" --store "shm:$P" -- sh -c "$J" "$T" e & E=$!
await "$T/started.e" || bad "job e did not start"
sleep 4.5
out=$(chk -- true); rc=$?
if [ $rc = 75 ]; then ok; else bad "an extended lease lapsed ($rc, '$out')"; fi
touch "$T/go.b" "$T/go.e"; wait $B; wait $E

# A region of other sizes is used when its states are room enough: one
# made for concurrency 10 serves concurrency 9, one made for a rate policy
# an in-flight one; one too small is refused, naming both sizes.
P2=$P.sizes; P3=$P.rate
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$T"; rm -f "$P" "$P2" "$P3"' EXIT
ck() { "$R" check --key "$1" --policy "$2" --store "shm:$3" >/dev/null 2>"$T/err"; }
if ck k "concurrency 10 ttl=3s" "$P2" && ck k "concurrency 9 ttl=3s" "$P2"
then ok; else bad "concurrency 9 on a concurrency 10 region: $(cat "$T/err")"; fi
if ck k "sliding-log 20/s" "$P3" && ck j "concurrency 2 ttl=3s" "$P3"
then ok; else bad "in-flight on a rate region: $(cat "$T/err")"; fi
ck k "concurrency 20 ttl=3s" "$P2"; rc=$?
if [ $rc = 2 ] && grep -q 'states of up to 254 bytes, the policy.s take 494' "$T/err"
then ok; else bad "a region too small: $rc $(cat "$T/err")"; fi

# On Redis (a fleet's store) the lease times are the wall clock, the one
# the hosts share: the held lease's expiry, read inside the job, is now +
# the TTL of 1 h by CLOCK_REALTIME (a 60 s slack for a loaded machine;
# CLOCK_MONOTONIC, the uptime, would be decades off).  The state is field
# s of the key's hash, its first 8 bytes the latest expiry (little-endian
# ns).  Needs redis-server.
# The library's parts this build has (ctest sets RATE_PARTS).
parts=${RATE_PARTS-redis dynamodb http}
if [ "${parts#*redis}" = "$parts" ]; then
    echo "note: a build without Redis: the fleet clock is not checked"
elif command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
    . "$(dirname "$0")/lib/servers.sh"
    start_redis "$T/redis.log"
    if [ -n "$rpid" ]; then
        lua='local k=redis.call("KEYS","*")[1] local v=redis.call("HGET",k,"s")
             local t=0 for i=8,1,-1 do t=t*256+string.byte(v,i) end
             return math.floor(t/1e9)'
        now=$(date +%s)
        got=$("$R" check --key job --policy "concurrency 2 ttl=1h" \
              --store "redis://127.0.0.1:$rport/0" -- \
              redis-cli -p "$rport" EVAL "$lua" 0 2>&1); rc=$?
        want=$((now + 3600))
        if [ $rc = 0 ] && [ "$got" -ge $((want - 60)) ] 2>/dev/null &&
           [ "$got" -le $((want + 60)) ]; then ok
        else bad "redis lease expiry '$got' (rc $rc), wanted about $want"; fi
        # One clock per store, whoever calls: the library's lease denies
        # check's at N=1, check's the library's, and once both are
        # released the key is free (no lease timed by another clock held
        # for decades).
        if [ -n "$H" ]; then
            url="redis://127.0.0.1:$rport/0"; hp="concurrency 1 ttl=1h"
            "$H" "$url" shared "$hp" "$T/go.h" >"$T/h.out" 2>&1 & HP=$!
            for _ in $(seq 600); do
                grep -q . "$T/h.out" && break; sleep 0.1
            done
            if grep -qx allow "$T/h.out"; then ok
            else bad "the library's first lease: '$(cat "$T/h.out")'"; fi
            out=$("$R" check --key shared --policy "$hp" --store "$url" -- \
                  touch "$T/both"); rc=$?
            if [ $rc = 75 ] && [ ! -e "$T/both" ]; then ok
            else bad "check took a lease the library holds at N=1 ($rc)"; fi
            touch "$T/go.h"; wait $HP; rc=$?
            [ $rc = 0 ] && ok || bad "the library's release ($rc)"
            "$R" check --key shared --policy "$hp" --store "$url" -- \
                sh -c "$J" "$T" f & F=$!
            await "$T/started.f" || bad "job f did not start"
            out=$("$H" "$url" shared "$hp" "$T/go.h" 2>&1); rc=$?
            if [ $rc = 1 ] && [ "$out" = deny ]; then ok
            else bad "the library took a lease check holds at N=1 ($rc '$out')"; fi
            touch "$T/go.f"; wait $F
            out=$("$H" "$url" shared "$hp" "$T/go.h" 2>&1); rc=$?
            if [ $rc = 0 ] && [ "$out" = allow ]; then ok
            else bad "the key after both released ($rc '$out')"; fi
        fi
        stop_pid "$rpid"
    else bad "could not start a private redis-server"; fi
elif [ "${CI:-}" = true ]; then bad "no redis-server under CI=true"
else echo "note: no redis-server: the fleet clock is not checked"; fi

# Without a command: a lease taken and released, 0 or 1.
if chk >/dev/null && chk >/dev/null; then ok; else bad "check without a command"; fi

# Errors.
err=$("$R" check --key job --policy "concurrency 2" 2>&1); rc=$?
if [ $rc = 2 ] && grep -q 'missing ttl=DURATION' <<<"$err"; then ok; else bad "no ttl: $rc '$err'"; fi
err=$("$R" check --key job --policy "fixed-window 1/s" -- true 2>&1); rc=$?
if [ $rc = 2 ] && grep -q 'in-flight policy only' <<<"$err"; then ok; else bad "command without concurrency: $rc '$err'"; fi
err=$("$R" check --key job --policy "fixed-window 1/s" --critical 2>&1); rc=$?
if [ $rc = 2 ] && grep -q 'critical needs an in-flight policy' <<<"$err"; then ok; else bad "--critical: $rc '$err'"; fi
# --permits and --max-wait would be ignored by a lease: refused, the command not run.
for o in "--permits 2" "--max-wait 1s"; do
    err=$(chk $o -- touch "$T/ignored" 2>&1); rc=$?
    if [ $rc = 2 ] && [ ! -e "$T/ignored" ] &&
       grep -q "check: ${o%% *} does not apply to an in-flight policy" <<<"$err"; then ok
    else bad "$o with a lease: $rc '$err'"; fi
done
# No shared store: refused (each check would count only its own lease).
for s in "" "--store memory"; do
    err=$("$R" check --key job --policy "$POL" $s -- touch "$T/nostore" 2>&1); rc=$?
    if [ $rc = 2 ] && [ ! -e "$T/nostore" ] && grep -q 'store shm:PATH' <<<"$err"; then ok
    else bad "no shared store ('$s'): $rc '$err'"; fi
done
# Which policy is in-flight: one with a concurrency clause, named or not;
# not a rate policy whose name merely starts with the word.
out=$("$R" check --key k --policy "name=concurrency-api fixed-window 5/s" 2>&1); rc=$?
if [ $rc = 0 ] && grep -q '^decision allow' <<<"$out"; then ok
else bad "a rate policy named concurrency-api: $rc '$out'"; fi
out=$("$R" check --key named --policy "name=api concurrency 2 ttl=3s" \
      --store "shm:$P" -- true 2>&1); rc=$?
if [ $rc = 0 ]; then ok; else bad "name=api concurrency 2: $rc '$out'"; fi
err=$("$R" check --key named --policy "name=api concurrency 2" \
      --store "shm:$P" 2>&1); rc=$?
if [ $rc = 2 ] && grep -q 'missing ttl=DURATION' <<<"$err"; then ok
else bad "name=api concurrency 2 without ttl: $rc '$err'"; fi
# A region made by check keeps keys of 160 bytes: a lease key is the key
# and 8 bytes, so 152 bytes pass and 153 are refused, saying so.
k152=$(printf 'k%.0s' $(seq 152)); k153=${k152}k
if chk2=$("$R" check --key "$k152" --policy "$POL" --store "shm:$P" -- true 2>&1)
then ok; else bad "a key of 152 bytes: '$chk2'"; fi
err=$("$R" check --key "$k153" --policy "$POL" --store "shm:$P" -- touch "$T/long" 2>&1); rc=$?
if [ $rc = 2 ] && [ ! -e "$T/long" ] && grep -q 'at most 152 bytes' <<<"$err"; then ok
else bad "a key of 153 bytes: $rc '$err'"; fi

out=$(chk -- /nonexistent/cmd 2>&1); rc=$?
if [ $rc = 127 ]; then ok; else bad "a missing command: $rc '$out'"; fi

echo "lease_cli: $pass passed, $fail failed"
[ $fail = 0 ]
