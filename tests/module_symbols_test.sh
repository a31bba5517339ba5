#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ratelimit.so's symbols (docs/redis-module.md, "The declarations"): it
# exports RedisModule_OnLoad and RedisModule_OnUnload and nothing else,
# and defines no symbol at all, exported or hidden, under a name
# redis-server exports.  The server exports its module API as RM_OpenKey,
# RM_HashSet, ...: a module global of such a name is bound to the
# server's symbol by the dynamic linker as soon as it is not hidden (a
# build without -fvisibility=hidden), and the module's load then writes
# into the server's code (a crash at MODULE LOAD).
# Usage: module_symbols_test.sh RATELIMIT_SO
set -u
SO=$1
# shellcheck source=lib/servers.sh
. "$(dirname "$0")/lib/servers.sh"
command -v nm >/dev/null || skip "no nm (binutils)"
server=$(command -v redis-server) || skip "no redis-server"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

nm -D --defined-only "$SO" | awk '{print $NF}' | sort >"$T/exported"
printf '%s\n' RedisModule_OnLoad RedisModule_OnUnload >"$T/want"
cmp -s "$T/exported" "$T/want" ||
  bad "ratelimit.so exports $(tr '\n' ' ' <"$T/exported")(only RedisModule_OnLoad and RedisModule_OnUnload)"

# Every symbol the module defines (its symbol table: hidden ones too).
nm --defined-only "$SO" 2>"$T/nm.err" | awk '{print $NF}' | sort -u >"$T/mine"
[ -s "$T/mine" ] || bad "ratelimit.so has no symbol table to read: $(cat "$T/nm.err")"
nm -D --defined-only "$server" | awk '{print $NF}' | sed 's/@.*//' | sort -u >"$T/server"
[ -s "$T/server" ] || bad "$server exports no symbol nm can read"
comm -12 "$T/mine" "$T/server" >"$T/both"
[ -s "$T/both" ] &&
  bad "ratelimit.so defines names redis-server exports (rename them): $(tr '\n' ' ' <"$T/both")"

echo "module_symbols: $(wc -l <"$T/mine") symbols of the module, $(wc -l <"$T/server") of the server; $fail failed"
[ "$fail" -eq 0 ]
