#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# `make install` and `make uninstall`.
#   scripts/install.sh install BUILD_DIR [PREFIX]
#       cmake --install BUILD_DIR (into PREFIX, by default the prefix the
#       build was configured with: make's PREFIX),
#       then runs ldconfig if the library directory is one ld.so searches and
#       we are root (otherwise says what a program needs to find the library),
#       and adds every file it wrote, and every directory it created, to
#       BUILD_DIR/ratelimit-installed.txt.
#   scripts/install.sh uninstall BUILD_DIR
#       removes exactly what that list names (directories only if empty),
#       then the list, and runs ldconfig as install did.
# The list is ours, not CMake's install_manifest.txt, which any later
# `cmake --install` (the install test, say) overwrites.  RATE_INSTALL_LIST
# names another list (the install test keeps its own).
set -euo pipefail

mode=${1:-}
build=${2:-build}
prefix=()
[ -n "${3:-}" ] && prefix=(--prefix "$3")
list=${RATE_INSTALL_LIST:-$build/ratelimit-installed.txt}

# The directories ld.so searches without help: /etc/ld.so.conf's and the
# trusted ones.
# (ldconfig -v exits 1 over a missing directory: its status is not ours.)
ld_dirs() { { ldconfig -v -N -X 2>/dev/null || true; } | sed -n 's|^\(/[^[:space:]]*\):.*|\1|p'; }
in_ld_path() {
  local d x
  d=$(readlink -f "$1" 2>/dev/null || echo "$1")
  while read -r x; do
    [ -n "$x" ] && [ "$(readlink -f "$x" 2>/dev/null || echo "$x")" = "$d" ] && return 0
  done <<<"$(ld_dirs)"
  return 1
}
# ldconfig LIBDIR: refresh ld.so's cache when LIBDIR is one it searches.
refresh_ld() {
  local libdir=$1
  if in_ld_path "$libdir"; then
    if [ "$(id -u)" -eq 0 ]; then
      echo "-- ldconfig ($libdir is in ld.so's search path)"
      ldconfig
    else
      echo "-- note: run 'sudo ldconfig' so that ld.so finds the library in $libdir" >&2
    fi
    return 0
  fi
  return 1
}

case "$mode" in
  install)
    [ -f "$build/CMakeCache.txt" ] || { echo "install: $build is not configured (run make)" >&2; exit 1; }
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    # A dry run into a scratch DESTDIR gives the directories the install will
    # need; those that do not exist yet are the ones it creates.
    DESTDIR=$stage cmake --install "$build" "${prefix[@]}" >/dev/null
    created=()
    while read -r d; do
      [ -n "$d" ] && [ ! -e "$d" ] && created+=("$d")
    done < <(cd "$stage" && find . -mindepth 1 -type d | sed 's|^\.||' | sort)
    cmake --install "$build" "${prefix[@]}"
    {
      [ -f "$list" ] && cat "$list"
      sed 's|^|f |' "$build/install_manifest.txt"; echo
      for d in "${created[@]}"; do echo "d $d"; done
    } | grep -v '^$' | sort -u >"$list.tmp"
    mv "$list.tmp" "$list"
    lib=$(grep -m1 '/libratelimit\.so' "$build/install_manifest.txt" || true)
    libdir=$(dirname "$lib")
    if ! refresh_ld "$libdir"; then
      echo "-- $libdir is not in ld.so's search path: build programs with"
      echo "--   cc app.c \$(pkg-config --cflags --libs ratelimit) -Wl,-rpath,$libdir"
      echo "-- with PKG_CONFIG_PATH=$libdir/pkgconfig (see docs/install.md)"
    fi
    echo "-- installed files are listed in $list (make uninstall removes them)"
    ;;
  uninstall)
    if [ ! -f "$list" ]; then
      echo "uninstall: nothing recorded in $list (nothing installed from $build)"
      exit 0
    fi
    libdirs=$(sed -n 's|^f \(.*\)/libratelimit\.so.*|\1|p' "$list" | sort -u)
    while read -r kind path; do
      [ "$kind" = f ] || continue
      if [ -e "$path" ] || [ -L "$path" ]; then
        echo "-- Removing: $path"
        rm -f -- "$path"
      fi
    done <"$list"
    # Created directories, deepest first, and only if now empty.
    sed -n 's|^d ||p' "$list" | sort -r | while read -r d; do
      [ -d "$d" ] && rmdir -- "$d" 2>/dev/null && echo "-- Removing: $d/" || true
    done
    rm -f -- "$list"
    for d in $libdirs; do refresh_ld "$d" || true; done
    ;;
  *) echo "usage: $0 install|uninstall BUILD_DIR" >&2; exit 2 ;;
esac
