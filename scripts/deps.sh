#!/usr/bin/env bash
# Installs the Debian packages the build, tests and tools need, and only
# those that are missing (idempotent: a machine that has them all runs no
# apt-get at all).  Usage: scripts/deps.sh [build|test]
set -euo pipefail

build_pkgs=(gcc make cmake pkg-config libxxhash-dev libhiredis-dev)
test_pkgs=(libcmocka-dev valgrind libxml2-utils clang libclang-rt-14-dev redis-server)

case "${1:-test}" in
  build) want=("${build_pkgs[@]}") ;;
  test) want=("${build_pkgs[@]}" "${test_pkgs[@]}") ;;
  *) echo "usage: $0 [build|test]" >&2; exit 2 ;;
esac

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "deps: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
