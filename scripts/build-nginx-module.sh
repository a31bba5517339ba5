#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Builds nginx/ngx_http_ratelimit_module.so against Debian's nginx-dev, as
# Debian's own module packages do (dh's nginx_mod build system): nginx's
# ./configure in /usr/share/nginx/src with Debian's flags (conf_flags, which
# include --with-compat) and --add-dynamic-module, into a build folder of
# our own, then `make modules`.  configure runs once (again when the
# module's config changes).
#   scripts/build-nginx-module.sh MODULE_DIR BUILD_DIR INCLUDE_DIR STATIC_LIB
set -euo pipefail
[ $# -eq 4 ] || { echo "usage: $0 MODULE_DIR BUILD_DIR INCLUDE_DIR STATIC_LIB" >&2; exit 2; }
mod=$(realpath "$1"); bld=$(realpath -m "$2"); inc=$(realpath "$3"); lib=$(realpath "$4")
src=${NGINX_SRC:-/usr/share/nginx/src}
[ -x "$src/configure" ] || { echo "$src/configure: not found (Debian: apt-get install nginx-dev)" >&2; exit 1; }
mkdir -p "$bld"
stamp="$bld/.configured"
if [ ! -f "$bld/Makefile" ] || [ ! -f "$stamp" ] || [ "$mod/config" -nt "$stamp" ] \
   || [ "$(cat "$stamp")" != "$inc $lib" ]; then
  # shellcheck disable=SC1091
  (cd "$src" && . ./conf_flags &&
   RATE_INCLUDE_DIR="$inc" RATE_STATIC_LIB="$lib" ./configure \
     --with-cc-opt="-g -O2 -fPIC -fstack-protector-strong -Wformat -Werror=format-security -D_FORTIFY_SOURCE=2 -Wextra -Werror" \
     --with-ld-opt="-Wl,-z,relro -Wl,-z,now -fPIC" \
     "${NGX_CONF_FLAGS[@]}" --add-dynamic-module="$mod" --builddir="$bld") \
    > "$bld/configure.log" 2>&1 || { cat "$bld/configure.log" >&2; exit 1; }
  echo "$inc $lib" > "$stamp"
fi
# The archive is a link input the Makefile does not track: relink on change.
if [ -f "$bld/ngx_http_ratelimit_module.so" ] && [ "$lib" -nt "$bld/ngx_http_ratelimit_module.so" ]; then
  rm -f "$bld/ngx_http_ratelimit_module.so"
fi
# (nginx's make is its own: not a child of the caller's jobserver)
MAKEFLAGS= MFLAGS= make -s -C "$src" -f "$bld/Makefile" modules
