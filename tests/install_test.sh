#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs the build into a scratch prefix as `make install PREFIX=...`
# does (scripts/install.sh) and builds a small program against it: with
# pkg-config, shared (the run-time path given by -Wl,-rpath, the line of
# docs/install.md, or by LD_LIBRARY_PATH) and static; with CMake
# find_package(ratelimit), the shared and the static target.  Runs the
# installed command; loads the installed Redis module (when the build has
# it) into a private redis-server, by the line of docs/redis-module.md,
# and runs a command through it; then uninstalls and checks that nothing
# is left.
# Usage: install_test.sh BUILD_DIR
set -eu
B=$1
S=$(cd "$(dirname "$0")/.." && pwd)
T=$(mktemp -d)
rpid=""
# shellcheck source=lib/servers.sh
. "$S/tests/lib/servers.sh"
# (stop_pid || true: its wait returns the killed server's status, which
# set -e would take for a failure)
trap 'stop_pid "$rpid" || true; rm -rf "$T"' EXIT
export RATE_INSTALL_LIST="$T/installed.txt"
bash "$S/scripts/install.sh" install "$B" "$T/prefix" >"$T/install.log" 2>&1 \
  || { cat "$T/install.log"; exit 1; }
cat >"$T/app.c" <<'C'
#include <ratelimit.h>
#include <stdio.h>
int main(void)
{
    rate_policy_t *p;
    rate_limiter_t *l;
    if (rate_policy_parse("token-bucket 10/s burst=2", &p, NULL, 0) != RATE_OK)
        return 1;
    rate_limiter_config_t cfg = {.policy = p};
    if (rate_limiter_new(&cfg, &l) != RATE_OK)
        return 1;
    int ok = rate_try_acquire(l, "k", 1) + rate_try_acquire(l, "k", 1) +
             rate_try_acquire(l, "k", 1);
    rate_limiter_free(l);
    rate_policy_free(p);
    return ok == 2 ? 0 : 1;
}
C
pass=0
fail=0
check() { if "$@" >/dev/null 2>&1; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $*"; fi; }
libdir=$(ls -d "$T"/prefix/lib*/ | head -1)
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname "$(find "$T/prefix" -name ratelimit.pc)")
# The line of docs/install.md for a prefix outside ld.so's path.
# shellcheck disable=SC2046
check cc "$T/app.c" -o "$T/shared" $(pkg-config --cflags --libs ratelimit) -Wl,-rpath,$(pkg-config --variable=libdir ratelimit)
check "$T/shared"
# shellcheck disable=SC2046
check cc "$T/app.c" -o "$T/shared-norpath" $(pkg-config --cflags --libs ratelimit)
check env LD_LIBRARY_PATH="$libdir" "$T/shared-norpath"
# shellcheck disable=SC2046
check cc "$T/app.c" -o "$T/static" $(pkg-config --cflags ratelimit) "$libdir/libratelimit.a" $(pkg-config --static --libs-only-l ratelimit | sed 's/-lratelimit//')
check "$T/static"
# A build with optional parts off installs neither their headers nor
# their dependencies in ratelimit.pc (ctest sets RATE_PARTS).
parts=${RATE_PARTS-redis dynamodb http}
for part in redis dynamodb http; do
  case " $parts " in
    *" $part "*) check test -f "$T/prefix/include/ratelimit_$part.h" ;;
    *) check test ! -e "$T/prefix/include/ratelimit_$part.h" ;;
  esac
done
# docs/install.md's list of what is installed names every header installed.
sed -n '/^    PREFIX\/include\//,/^    PREFIX\/lib\//p' "$S/docs/install.md" >"$T/doc-headers"
for h in "$T"/prefix/include/ratelimit*.h; do
  check grep -qw "$(basename "$h")" "$T/doc-headers"
done
case " $parts " in *" redis "*) ;; *) check test -z "$(pkg-config --print-requires-private ratelimit | grep -x hiredis)" ;; esac
case " $parts " in *" http "*) ;; *) check test -z "$(pkg-config --print-requires-private ratelimit | grep -x inih)" ;; esac
case " $parts " in *" dynamodb "*) ;; *)
  check test -z "$(pkg-config --print-requires-private ratelimit | grep -x jansson)"
  check test -z "$(pkg-config --static --libs ratelimit | grep -w -- -lcurl)" ;; esac
# The loop adapters, as a user includes them: both in one file, one used,
# built without optimization (which keeps a static function that nothing
# calls) and linked with that one loop's library only; and the public
# headers compiled as C++ with both adapters used.
if pkg-config --exists libuv libevent_core; then
  cat >"$T/adapters.c" <<'C'
#include <ratelimit_event.h>
#include <ratelimit_uv.h>
int main(void)
{
    rate_loop_t loop;
    rate_loop_uv(&loop, uv_default_loop());
    return loop.io_new == NULL;
}
C
  # shellcheck disable=SC2046
  check cc -O0 -Wall -Wextra -Werror "$T/adapters.c" -o "$T/adapters" $(pkg-config --cflags --libs ratelimit libuv)
  sed 's/rate_loop_uv(&loop, uv_default_loop())/struct event_base *b = event_base_new(); rate_loop_event(\&loop, b); event_base_free(b)/' "$T/adapters.c" >"$T/adapters-ev.c"
  # shellcheck disable=SC2046
  check cc -O0 -Wall -Wextra -Werror "$T/adapters-ev.c" -o "$T/adapters-ev" $(pkg-config --cflags --libs ratelimit libevent_core)
  if command -v c++ >/dev/null; then
    cat >"$T/adapters.cpp" <<'CXX'
#include <ratelimit.h>
#include <ratelimit_event.h>
#include <ratelimit_loop.h>
#include <ratelimit_store.h>
#include <ratelimit_uv.h>
int main()
{
    rate_loop_t a, b;
    struct event_base *base = event_base_new();
    rate_loop_uv(&a, uv_default_loop());
    rate_loop_event(&b, base);
    event_base_free(base);
    return a.io_new == nullptr || b.io_new == nullptr;
}
CXX
    # shellcheck disable=SC2046
    check c++ -std=c++17 -Wall -Wextra -Werror -pedantic "$T/adapters.cpp" -o "$T/adapters-cxx" $(pkg-config --cflags --libs ratelimit libuv libevent_core)
  fi
fi
for target in ratelimit ratelimit_static; do
  mkdir -p "$T/cm-$target"
  cat >"$T/cm-$target/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.18)
project(app C)
find_package(ratelimit REQUIRED)
add_executable(app $T/app.c)
target_link_libraries(app ratelimit::$target)
CM
  check cmake -S "$T/cm-$target" -B "$T/cm-$target/b" -DCMAKE_PREFIX_PATH="$T/prefix"
  check cmake --build "$T/cm-$target/b"
  check "$T/cm-$target/b/app"
done
# The package's version rule: 0.4 and this release are found, 0.3 (before
# the stable ABI) and a later one are not.
for want in 0.4 "$(sed -n 's/^project(ratelimit VERSION \([0-9.]*\).*/\1/p' "$S/CMakeLists.txt")" 0.3 99.0; do
  mkdir -p "$T/cm-v"
  cat >"$T/cm-v/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.18)
project(app C)
find_package(ratelimit $want REQUIRED)
CM
  case $want in
    0.3 | 99.0) check test "$(cmake -S "$T/cm-v" -B "$T/cm-v/b$want" -DCMAKE_PREFIX_PATH="$T/prefix" >/dev/null 2>&1; echo $?)" != 0 ;;
    *) check cmake -S "$T/cm-v" -B "$T/cm-v/b$want" -DCMAKE_PREFIX_PATH="$T/prefix" ;;
  esac
done
# The installed command runs (it links the library statically).
check "$T/prefix/bin/ratelimit" --version
# The installed Redis module loads (Redis 7 refuses a module it may not
# execute: installed 0755) and answers a command.
if grep -q '^RATE_BUILD_REDIS_MODULE:BOOL=ON' "$B/CMakeCache.txt"; then
  so="${libdir}ratelimit/ratelimit.so"
  check test -f "$so"
  check test "$(stat -c %a "$so" 2>/dev/null)" = 755
  if ! command -v redis-server >/dev/null; then
    fail=$((fail + 1)); echo "FAIL: no redis-server to load $so into"
  elif start_redis "$T/redis.log" --loadmodule "$so"; then
    check test "$(redis-cli -p "$rport" CL.THROTTLE installed 1 1 1 | head -1)" = 0
    check test "$(redis-cli -p "$rport" MODULE LIST | grep -cx ratelimit)" = 1
    stop_pid "$rpid" || true; rpid=""
  else
    fail=$((fail + 1))
    echo "FAIL: redis-server --loadmodule $so did not start:"
    tail -5 "$T/redis.log"
  fi
fi
# Uninstall removes every file and every directory the install created.
check bash "$S/scripts/install.sh" uninstall "$B"
check test ! -e "$T/prefix"
check test ! -e "$RATE_INSTALL_LIST"
if [ -e "$T/prefix" ]; then echo "left after uninstall:"; find "$T/prefix"; fi
echo "install: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
