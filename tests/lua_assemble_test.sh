#!/bin/bash
# SPDX-License-Identifier: MIT
#
# The Redis scripts' assembly (cmake/lua_assemble.cmake, docs/redis.md "How
# the scripts are made"): --@include lines replaced by their files, nested,
# in order; a missing file, a file included twice and a cycle stop it with
# a message naming what is wrong; and the build's own scripts are whole:
# no --@include left, the range constants and each algorithm's rule
# (src/algo/NAME.lua) in every script that decides it, once; and only
# the Redis store's scripts (src/store/redis/) include.
#
# usage: lua_assemble_test.sh CMAKE SOURCE_DIR GENERATED_DIR
set -u

cmake=$1 src=$2 gen=$3
asm=$src/cmake/lua_assemble.cmake
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

mkdir -p "$tmp/a/sub" "$tmp/b"
printf -- '-- driver\n--@include one.lua\nlocal x = 1; local y = "a\\\\b"\n--@include two.lua\nreturn x\n' >"$tmp/a/drv.lua"
printf -- '-- one\n--@include sub/three.lua\n' >"$tmp/a/one.lua"
printf -- 'local three = {}' >"$tmp/a/sub/three.lua" # no newline at its end
printf -- '-- two, from the second directory\n' >"$tmp/b/two.lua"
want=$(printf -- '-- driver\n-- one\nlocal three = {}\nlocal x = 1; local y = "a\\\\b"\n-- two, from the second directory\nreturn x\n')
if "$cmake" -DIN="$tmp/a/drv.lua" "-DPATH=$tmp/a|$tmp/b" -DOUT="$tmp/out.lua" \
        -P "$asm" >"$tmp/log" 2>&1; then
    got=$(cat "$tmp/out.lua")
    [ "$got" = "$want" ] || fail "nested includes: got
$got
want
$want"
else
    fail "nested includes did not assemble: $(cat "$tmp/log")"
fi

# expect_error NAME DRIVER_TEXT MESSAGE: assembling fails, naming it.
expect_error() {
    printf -- '%s' "$2" >"$tmp/a/bad.lua"
    if "$cmake" -DIN="$tmp/a/bad.lua" "-DPATH=$tmp/a|$tmp/b" \
            -DOUT="$tmp/bad_out.lua" -P "$asm" >"$tmp/log" 2>&1; then
        fail "$1: assembled, should have stopped"
    elif ! grep -qF -- "$3" "$tmp/log"; then
        fail "$1: no '$3' in: $(cat "$tmp/log")"
    fi
}
expect_error missing $'--@include nowhere.lua\n' \
    'bad.lua: --@include nowhere.lua: no such file'
expect_error twice $'--@include two.lua\n--@include two.lua\n' \
    '--@include two.lua: included twice'
printf -- '--@include loop.lua\n' >"$tmp/a/loop.lua"
expect_error cycle $'--@include loop.lua\n' '--@include loop.lua: included twice'

# The build's scripts: whole, each rule in it once.
check_script() { # FILE PIECE...
    local f=$gen/$1
    shift
    [ -s "$f" ] || { fail "$f: missing"; return; }
    if grep -n -- '^--@include' "$f"; then fail "$f: an --@include left"; fi
    grep -q '^local TOKEN_BUCKET_STEP, TOKEN_BUCKET_LEAN = ' "$f" ||
        fail "$f: no range constants"
    for piece in "$@"; do # each rule's decide, once
        n=$(grep -c "^local function ${piece}_decide(" "$f")
        [ "$n" = 1 ] || fail "$f: ${piece}_decide defined $n times, want once"
    done
}
check_script redis_step.lua tb lb fw sw sl
check_script redis_tb.lua tb
check_script redis_lb.lua lb
check_script redis_fw.lua fw
check_script redis_sw.lua sw
check_script redis_sl.lua sl
# the lease-and-rate script: the general step's rules once, beside the
# lease step (its count and acquire, once)
check_script lease_rate.lua tb lb fw sw sl
n=$(grep -c "^local function lease_step(KEYS, ARGV)" "$gen/lease_rate.lua")
[ "$n" = 1 ] || fail "lease_rate.lua: lease_step defined $n times, want once"

# The includes run one way: only the Redis store's drivers and pieces
# (src/store/redis/) include; the rules beside their C (src/algo/*.lua,
# src/fair/*.lua) are leaves, so no script's pieces make a circle.
while IFS= read -r f; do
    case $f in "$src"/src/store/redis/*) continue ;; esac
    if grep -q -- '^--@include' "$f"; then
        fail "${f#"$src"/}: includes a file; only src/store/redis/ may"
    fi
done < <(find "$src/src" -name '*.lua')

if [ "$fails" -ne 0 ]; then
    echo "$fails failure(s)"
    exit 1
fi
echo "ok: the scripts' assembly"
