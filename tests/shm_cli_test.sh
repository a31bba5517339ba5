#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The command on a shared-memory region (--store shm:PATH): the replay
# vectors give the memory store's output byte for byte, both on a region
# the run creates (and removes) and in a namespace of its own in one that
# exists (removed after, the region's own keys untouched); check shares a
# limit across calls; the errors name the region's bound.
# Usage: shm_cli_test.sh RATELIMIT_BINARY SHM_KEYS_BINARY VECTORS_DIR
set -u
R=$1
K=$2
V=$3
# shellcheck source=lib/servers.sh
. "$(dirname "$0")/lib/servers.sh" # wait_until, TEST_WAIT_S
T=$(mktemp -d)
P=/dev/shm/rl-cli-test-$$
trap 'umount "$T/fs" 2>/dev/null; rm -rf "$T"; rm -f "$P" "$P".*' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

rm -f "$P"
for args in "$V"/*.args; do
  n=$(basename "$args" .args)
  # shellcheck disable=SC2046
  if "$R" replay $(cat "$args") --store "shm:$P" "$V/$n.trace" >"$T/out" 2>"$T/err" &&
     cmp -s "$T/out" "$V/$n.out" && [ ! -e "$P" ]; then ok
  else bad "vector $n on a region the run creates"; diff "$V/$n.out" "$T/out" | head -5; cat "$T/err"; fi
done

# A region that exists, with a key of its own: each run in a namespace.
"$R" check --key mine --policy "fixed-window 5/1h" --store "shm:$P" --max-keys 500 >/dev/null
before=$("$K" "$P")
if [ "$before" = "1 1" ] && [ "$(stat -c %a "$P")" = 600 ]; then ok
else bad "check made the region (keys/records: $before)"; fi
for args in "$V"/*.args; do
  n=$(basename "$args" .args)
  # shellcheck disable=SC2046
  if "$R" replay $(cat "$args") --store "shm:$P" "$V/$n.trace" >"$T/out" 2>"$T/err" &&
     cmp -s "$T/out" "$V/$n.out" && [ "$("$K" "$P")" = "$before" ]; then ok
  else bad "vector $n in a namespace ($("$K" "$P"))"; diff "$V/$n.out" "$T/out" | head -5; cat "$T/err"; fi
done
# the access log too
if "$R" replay --input clf --algorithm fixed-window --limit 2 --window 1s \
     --store "shm:$P" "$V/access.log" >"$T/out" 2>/dev/null &&
   cmp -s "$T/out" "$V/access.out" && [ "$("$K" "$P")" = "$before" ]; then ok
else bad "replay --input clf in a namespace"; fi

# check: one limit across calls (and processes)
for i in 2 3 4 5; do "$R" check --key mine --policy "fixed-window 5/1h" --store "shm:$P" >/dev/null; done
"$R" check --key mine --policy "fixed-window 5/1h" --store "shm:$P" >"$T/out"
rc=$?
if [ $rc -eq 1 ] && grep -q "^decision deny" "$T/out"; then ok
else bad "check: the sixth call of 5/1h (rc=$rc)"; fi

# errors
expect_error() { # WORDS COMMAND...
  local words=$1; shift
  "$R" "$@" >/dev/null 2>"$T/err"; local rc=$?
  if [ $rc -eq 2 ] && grep -qF -- "$words" "$T/err"; then ok
  else bad "$* (rc=$rc): $(cat "$T/err")"; fi
}
expect_error "max_keys: the region has 500, the options ask 7" \
  check --key k --policy "fixed-window 1/s" --store "shm:$P" --max-keys 7
expect_error "the policy's states take up to 1622 bytes, the region keeps at most 96" \
  check --key k --policy "sliding-log 100/s" --store "shm:$P"
expect_error "needs a PATH" check --key k --policy "fixed-window 1/s" --store shm:
expect_error "--max-keys sizes a shm:PATH region only" check --key k --policy "fixed-window 1/s" --max-keys 5
head -c 8192 /dev/zero | tr '\0' x >"$T/notastore"
expect_error "not a ratelimit shm store" check --key k --policy "fixed-window 1/s" --store "shm:$T/notastore"
expect_error "No such file or directory" check --key k --policy "fixed-window 1/s" --store "shm:/nonexistent/dir/r"
long=$(head -c 200 /dev/zero | tr '\0' k)
printf '0 %s\n' "$long" >"$T/long.trace"
expect_error "the key's 200 bytes and the run's namespace's" \
  replay --policy "fixed-window 1/s" --store "shm:$P" "$T/long.trace"
expect_error "are longer than the shared-memory region's key_max (160 bytes)" \
  replay --policy "fixed-window 1/s" --store "shm:$P" "$T/long.trace"
if [ "$("$K" "$P")" = "$before" ]; then ok; else bad "a failed run left keys"; fi
expect_error "check: the key's 200 bytes are longer than the shared-memory region's key_max (160 bytes)" \
  check --key "$long" --policy "fixed-window 1/s" --store "shm:$P"
# --max-keys: one bound and one message for check and replay
for cmd in check replay; do
  if [ $cmd = check ]; then a=(--key k); else a=("$T/long.trace"); fi
  expect_error "--max-keys '2147483648' is not a whole number from 1 to 2147483647" \
    $cmd --policy "fixed-window 1/s" --store "shm:$T/new.rl" --max-keys 2147483648 "${a[@]}"
  if [ ! -e "$T/new.rl" ]; then ok; else bad "$cmd --max-keys 2147483648 made a file"; fi
done
# a file system without room (an 8 MB tmpfs; root): a clear error, exit 2,
# no temporary file.  (On a tmpfs, never the real disk: a build without
# the fix writes until the file system is full.)
mkdir "$T/fs"
if mount -t tmpfs -o size=8m tmpfs "$T/fs" 2>/dev/null; then
  # the largest count is refused before any file is made (it would be
  # hundreds of GB)
  for cmd in check replay; do
    if [ $cmd = check ]; then a=(--key k); else a=("$T/long.trace"); fi
    expect_error "more than a region may" \
      $cmd --policy "fixed-window 1/s" --store "shm:$T/fs/new.rl" --max-keys 2147483647 "${a[@]}"
    if [ -z "$(ls -A "$T/fs")" ]; then ok; else bad "$cmd --max-keys 2147483647 left $(ls -A "$T/fs")"; fi
  done
  expect_error "cannot allocate its" \
    check --key k --policy "token-bucket 1/s burst=2" --store "shm:$T/fs/big.rl" --max-keys 1000000
  expect_error "No space left on device" \
    check --key k --policy "token-bucket 1/s burst=2" --store "shm:$T/fs/big.rl" --max-keys 1000000
  if [ -z "$(ls -A "$T/fs")" ]; then ok; else bad "a full file system left $(ls -A "$T/fs")"; fi
  umount "$T/fs"
else
  echo "skipped: the tmpfs case (mount -t tmpfs failed: needs root)"
fi
# A damaged region (every bucket head out of bounds, as a writer of the
# file could leave it): an error naming the damage, not a crash.
Q="$P.damaged"
"$R" check --key k --policy "fixed-window 5/s" --store "shm:$Q" --max-keys 100 >/dev/null
u32() { od -An -tu4 -j"$1" -N4 "$Q" | tr -d ' '; }
nshards=$(u32 20); nbuckets=$(u32 44); shard_size=$(u32 68); off_shards=$(u32 80)
for ((si = 0; si < nshards; si++)); do
  head -c $((4 * nbuckets)) /dev/zero | tr '\0' '\377' |
    dd of="$Q" bs=1 seek=$((off_shards + si * shard_size + 128)) conv=notrunc status=none
done
expect_error "check: the shared-memory region is damaged (shard 0 bucket 0: a bad link or a cycle); remove it to start again" \
  check --key k --policy "fixed-window 5/s" --store "shm:$Q"
rm -f "$Q"

# a region the run creates for a sliding log is made big enough for it
printf '0 a\n0 a\n0 a\n' >"$T/log.trace"
if "$R" replay --policy "sliding-log 100/s" --store "shm:$T/log" "$T/log.trace" >"$T/out" 2>/dev/null &&
   [ "$(cut -f4 "$T/out" | tr '\n' ' ')" = "allow allow allow " ] && [ ! -e "$T/log" ]; then ok
else bad "a sliding log on a region the run creates"; fi

# Stopped by a signal: the region file the run made (or its namespace in
# one that exists) removed, and one line of error says so.
rm -f "$T/fifo"; mkfifo "$T/fifo"
# the run has read the 300 lines (their keys are in the region)
read_300() { case $("$K" "$1" 2>/dev/null) in "300 "*|"301 "*) return 0;; esac; return 1; }
for where in file namespace; do
  if [ $where = file ]; then Q=$P.sig; want_keys=""; what="region file"
  else Q=$P; want_keys=$("$K" "$P"); what=namespace; fi
  for sig in INT TERM; do
    { for i in $(seq 300); do echo "0 k$i"; done; exec sleep 600; } >"$T/fifo" & # (holds the pipe open: killed below)
    feeder=$!
    "$R" replay --policy "token-bucket 1/s burst=1" --store "shm:$Q" <"$T/fifo" >"$T/out" 2>"$T/err" &
    rp=$!
    wait_until "$TEST_WAIT_S" read_300 "$Q"
    kill -$sig "$rp"; { wait "$rp"; } 2>/dev/null; rc=$?
    kill "$feeder" 2>/dev/null; wait "$feeder" 2>/dev/null
    case $sig in INT) want=130;; TERM) want=143;; esac
    if [ $where = file ]; then left=$([ -e "$Q" ] && echo present); else left=$("$K" "$Q"); fi
    if [ $rc -eq $want ] && [ "$left" = "$want_keys" ] &&
       grep -qx "ratelimit: replay: stopped by SIG$sig after line 300; the run's $what was removed" "$T/err" &&
       [ "$(wc -l <"$T/out")" -eq 300 ]; then ok
    else bad "replay --store shm ($where) stopped by SIG$sig: rc=$rc, left '$left', $(cat "$T/err")"; fi
  done
done

# SIGTERM or SIGINT while the run makes its region (a large one, so that
# the signal lands while the temporary PATH.XXXXXX exists): the run stops
# with 143 or 130 and leaves no file at all.  The signal is sent as soon
# as the temporary file is seen (polled by a shell builtin, bounded).
# On a loaded machine the poll may see the temporary file only after the
# region is made, or never (the whole run passed between two polls): the
# run then ends as usual (0, the region removed at the end).  Either way
# nothing is left, and at least one of the runs must have been stopped
# while it made the region (the file seen, then 143 or 130).
printf '0 a\n' >"$T/one.trace"
stopped_making=0
for sig in TERM INT TERM INT TERM INT TERM INT; do
  Q=$P.make
  "$R" replay --policy "sliding-log 1000/1h" --max-keys 16384 --store "shm:$Q" \
    "$T/one.trace" >/dev/null 2>"$T/err" &
  rp=$!
  seen=no
  for _ in $(seq 200000); do
    if compgen -G "$Q.*" >/dev/null; then seen=yes; break; fi
    kill -0 "$rp" 2>/dev/null || break
  done
  kill -$sig "$rp" 2>/dev/null; { wait "$rp"; } 2>/dev/null; rc=$?
  case $sig in INT) want=130;; TERM) want=143;; esac
  left=$(compgen -G "$Q*" | tr '\n' ' ')
  [ $seen = yes ] && [ $rc -eq $want ] && stopped_making=$((stopped_making + 1))
  if [ -z "$left" ] &&
     { [ $rc -eq $want ] || { [ $rc -eq 0 ] && grep -q "removed at the end" "$T/err"; }; }; then ok
  else bad "SIG$sig while the region is made: seen=$seen rc=$rc, left '$left', $(cat "$T/err")"; fi
  rm -f "$Q" "$Q".*
done
if [ $stopped_making -ge 1 ]; then ok
else bad "no replay was stopped while it made its region (8 tries)"; fi

# Replays on one PATH at once, again and again (four at a time, on a
# short trace, so that regions are made and removed while the others make
# or attach to theirs): each gives the memory store's output, whichever
# makes the region and whichever finds it made or removed; nothing is
# left.  (Before the fix: about 1 in 8 failed, "cannot open it: No such
# file or directory" or "cannot create it: File exists".)
printf '0 a\n0 b\n0 a\n1 a\n' >"$T/race.trace"
"$R" replay --policy "token-bucket 1/s burst=1" "$T/race.trace" >"$T/race.out" 2>/dev/null
for i in $(seq 30); do
  pids=()
  for j in 1 2 3 4; do
    "$R" replay --policy "token-bucket 1/s burst=1" --store "shm:$P.two" "$T/race.trace" >"$T/o$j" 2>"$T/e$j" &
    pids+=($!)
  done
  failed=""
  for j in 1 2 3 4; do
    wait "${pids[$((j - 1))]}" && cmp -s "$T/o$j" "$T/race.out" || failed="$failed $j: $(cat "$T/e$j")"
  done
  if [ -z "$failed" ] && [ ! -e "$P.two" ]; then ok
  else bad "replays at once ($i):$failed"; break; fi
done
v=$(ls "$V"/*.args | head -1); n=$(basename "$v" .args)
# ... also with two policies: the second either fits the first's region
# or says which region was made for other policies; never a crash, a
# missing file or a file left behind.
for i in $(seq 10); do
  "$R" replay --policy "token-bucket 5/s burst=5" --store "shm:$P.two" "$V/$n.trace" >/dev/null 2>"$T/e1" &
  a=$!
  "$R" replay --policy "sliding-log 50/s" --store "shm:$P.two" "$V/$n.trace" >/dev/null 2>"$T/e2" &
  b=$!
  wait $a; ra=$?; wait $b; rb=$?
  if [ $ra -eq 0 ] && { [ $rb -eq 0 ] || { [ $rb -eq 2 ] &&
       grep -q "the region keeps at most 96 (its state_max): it was made for other policies" "$T/e2"; }; } &&
     [ ! -e "$P.two" ]; then ok
  else bad "two policies at once ($i): rc $ra $rb: $(cat "$T/e1" "$T/e2")"; break; fi
done

# A region the run makes is sized from the trace's distinct keys (twice
# over and 256 more), not 65536 keys of the policy's longest state: a
# sliding log of 1000/1h (16 KB states) on 3 keys takes a few MB.
printf '0 a\n0 b\n1 c\n2 a\n' >"$T/small.trace"
if "$R" replay --policy "sliding-log 1000/1h" --store "shm:$P.small" "$T/small.trace" >/dev/null 2>"$T/err" &&
   bytes=$(sed -n 's/^replay: made the region .* for 262 keys (\([0-9]*\) bytes), removed at the end$/\1/p' "$T/err") &&
   [ -n "$bytes" ] && [ "$bytes" -lt $((32 << 20)) ] && [ ! -e "$P.small" ]; then ok
else bad "the region for a small trace: $(cat "$T/err")"; fi
# the same trace through a pipe cannot be read ahead: 65536 keys, or
# fewer within 256 MB
if cat "$T/small.trace" | "$R" replay --policy "sliding-log 1000/1h" --store "shm:$P.small" >/dev/null 2>"$T/err" &&
   bytes=$(sed -n 's/^replay: made the region .* for [0-9]* keys (\([0-9]*\) bytes), removed at the end$/\1/p' "$T/err") &&
   [ -n "$bytes" ] && [ "$bytes" -le $((256 << 20)) ] && [ ! -e "$P.small" ]; then ok
else bad "the region for a piped trace: $(cat "$T/err")"; fi

echo "shm cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
