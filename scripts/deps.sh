#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The Debian packages the build, the tests and the tools need.
#   scripts/deps.sh core         install what the core and the command alone
#                                need (`make demo`), only what is missing
#   scripts/deps.sh build        install what the build (`make`,
#                                `make install`) needs, only what is missing
#   scripts/deps.sh test         the same for the build and every test
#   scripts/deps.sh fuzz         the same for the build and `make fuzz`
#                                (clang and its libFuzzer)
#   scripts/deps.sh check [core|build|test|fuzz]
#                                install nothing: name each missing package
#                                and the command that installs them, and exit
#                                1 if any is missing
# Idempotent: a machine that has them all runs no apt-get at all.
set -euo pipefail

core_pkgs=(gcc make cmake pkg-config libxxhash-dev)
build_pkgs=("${core_pkgs[@]}" libhiredis-dev
            libcurl4-openssl-dev libjansson-dev libinih-dev libmicrohttpd-dev)
test_pkgs=(libcmocka-dev libuv1-dev libevent-dev valgrind libxml2-utils abigail-tools redis-server
           redis-tools nodejs python3 curl wrk openssl
           nginx nginx-dev libpcre2-dev libssl-dev zlib1g-dev
           python3-dev python3-setuptools python3-venv python3-pytest
           python3-limits python3-flask-limiter python3-starlette python3-uvicorn)
fuzz_pkgs=(clang libclang-rt-14-dev)

usage() { echo "usage: $0 [core|build|test|fuzz] | $0 check [core|build|test|fuzz]" >&2; exit 2; }

check_only=0
set_=${1:-test}
if [ "$set_" = check ]; then
  check_only=1
  set_=${2:-build}
fi
case "$set_" in
  core) want=("${core_pkgs[@]}") ;;
  build) want=("${build_pkgs[@]}") ;;
  test) want=("${build_pkgs[@]}" "${test_pkgs[@]}") ;;
  fuzz) want=("${build_pkgs[@]}" "${fuzz_pkgs[@]}") ;;
  *) usage ;;
esac

# A package whose command is already here by another way counts as present
# (NodeSource's nodejs, say).  Debian's npm is not in the list: it would
# pull in about 365 packages for one test tool; scripts/dynalite.sh fetches
# npm's own tarball instead when there is no npm.
provided_by_command() {
  case "$1" in
    nodejs) command -v node >/dev/null 2>&1 ;;
    *) return 1 ;;
  esac
}

missing=()
for p in "${want[@]}"; do
  provided_by_command "$p" && continue
  if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo "
if [ "$check_only" -eq 1 ]; then
  echo "missing Debian packages: ${missing[*]}" >&2
  echo "install them with: ${SUDO}apt-get install ${missing[*]}" >&2
  echo "(or run scripts/deps.sh $set_, or make demo / make test, which install them)" >&2
  exit 1
fi

if [ -n "$SUDO" ]; then
  command -v sudo >/dev/null || { echo "deps: need root or sudo to install ${missing[*]}" >&2; exit 1; }
fi
# Progress, not minutes of silence: what is missing, how long it usually
# takes, then apt's own download and set-up lines, one per package.
echo "deps: ${#missing[@]} Debian packages missing: ${missing[*]}" >&2
echo "deps: installing them with apt-get (on a fresh machine about 1 to 3 minutes for" >&2
echo "deps: the build's packages, 5 to 10 for the tests'; apt's progress follows)" >&2
export DEBIAN_FRONTEND=noninteractive
echo "deps: apt-get update (the package lists)" >&2
${SUDO}apt-get update -qq
echo "deps: apt-get install" >&2
start=$(date +%s)
if ! ${SUDO}apt-get install -y --no-install-recommends "${missing[@]}" 2>&1 |
     { grep --line-buffered -E '^(Need to get|Get:|Setting up) ' || true; } |
     sed -u 's/^/deps:   /' >&2; then
  echo "deps: apt-get install failed (run it by hand to see why: ${SUDO}apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "deps: done in $(( $(date +%s) - start )) s" >&2
