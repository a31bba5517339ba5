#!/usr/bin/env bash
# Installs the build into a scratch prefix and builds a small program
# against it four ways: pkg-config shared and static, CMake
# find_package(ratelimit) with the shared and the static target.
# Usage: install_test.sh BUILD_DIR
set -eu
B=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cmake --install "$B" --prefix "$T/prefix" >/dev/null
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
# shellcheck disable=SC2046
check cc "$T/app.c" -o "$T/shared" $(pkg-config --cflags --libs ratelimit) -Wl,-rpath,"$libdir"
check "$T/shared"
# shellcheck disable=SC2046
check cc "$T/app.c" -o "$T/static" $(pkg-config --cflags ratelimit) "$libdir/libratelimit.a" $(pkg-config --static --libs-only-l ratelimit | sed 's/-lratelimit//')
check "$T/static"
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
echo "install: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
