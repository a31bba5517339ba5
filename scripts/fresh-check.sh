#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Runs the README's quick start (`make demo`, then `make test`) as a new
# user would: in a minimal Debian 12 (bookworm) root that has only what a
# fresh machine has (debootstrap's minbase plus build-essential, git and
# ca-certificates; no cmake, no cmocka), on a clean clone of this
# repository's HEAD, as root, by chroot.  Then, as a user of the library:
# `make install`, the README's C example built with the README's line
# (`cc app.c $(pkg-config --cflags --libs ratelimit)`) and run, the
# installed command run, and `make uninstall`, which must leave nothing of
# ratelimit in /usr/local.  Run as root: `make fresh-check`.
#
#   scripts/fresh-check.sh         build the base root if it is not cached,
#                                  then check HEAD in a fresh copy of it
#   scripts/fresh-check.sh base    (re)build the cached base root only
#
# Environment:
#   RATE_FRESH_CACHE   where the base root is cached, as a tarball
#                      (default /var/cache/ratelimit-fresh-root)
#   RATE_FRESH_WORK    where each run's copy is unpacked (default /var/tmp)
#   RATE_FRESH_MIRROR  Debian mirror (default http://deb.debian.org/debian)
#   RATE_FRESH_KEEP=1  keep the run's root afterwards (it is unmounted anyway)
#   RATE_FRESH_REBUILD=1  rebuild the base root even if it is cached
#
# Only committed work is checked: the clone is of HEAD.  Exit status 0 only
# if the root was built and both commands passed inside it.
set -euo pipefail
# The whole script is one block, read before it runs: editing the file
# during a run cannot change what the run does.
{
say() { echo "fresh-check: $*" >&2; }
die() { say "FAILED: $*"; exit 1; }

mode=${1:-check}
case "$mode" in
  check | base) ;;
  *) echo "usage: $0 [check|base]" >&2; exit 2 ;;
esac

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, mount and chroot need it): sudo make fresh-check"

repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel) || die "not inside a git checkout"
cache=${RATE_FRESH_CACHE:-/var/cache/ratelimit-fresh-root}
workdir=${RATE_FRESH_WORK:-/var/tmp}
mirror=${RATE_FRESH_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
# What a new user's machine has beyond the base system.  Changing this list
# changes the cache's name, so a stale base is never reused.
extra=build-essential,git,ca-certificates
base="$cache/$suite-minbase-$(echo "$extra" | tr ',' '+')-v1.tar"

start=$(date +%s)
elapsed() { local s=$(($(date +%s) - start)); printf '%dm%02ds' $((s / 60)) $((s % 60)); }

# ---- mounts, and their cleanup on every exit ----------------------------
root=""
mounted=()
cleanup() {
  local rc=$?
  set +e
  if [ -n "$root" ] && [ -d "$root" ]; then
    # Whatever the run left behind in the root (a redis-server, say) would
    # keep /dev busy: stop it first, by its PID, only processes whose root
    # is this one.
    local p pids=()
    for p in /proc/[0-9]*; do
      [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] && pids+=("${p#/proc/}")
    done
    if [ ${#pids[@]} -gt 0 ]; then
      say "stopping processes left in the root: ${pids[*]}"
      kill "${pids[@]}" 2>/dev/null; sleep 1; kill -9 "${pids[@]}" 2>/dev/null
    fi
    local i
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
      umount -R "${mounted[i]}" 2>/dev/null || umount -R -l "${mounted[i]}" 2>/dev/null \
        || say "could not unmount ${mounted[i]}"
    done
    if grep -qF " $root/" /proc/mounts || grep -qF " $root " /proc/mounts; then
      say "something is still mounted under $root: not removing it"
      rc=1
    elif [ "${RATE_FRESH_KEEP:-0}" = 1 ]; then
      say "kept the root: $root"
    else
      rm -rf --one-file-system "$root"
    fi
  fi
  [ -n "${stage:-}" ] && [ -d "$stage" ] && ! grep -qF " $stage/" /proc/mounts \
    && rm -rf --one-file-system "$stage"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

mount_into() { # mount_into ROOT: /proc, /sys, /dev (with /dev/pts, /dev/shm)
  local r=$1
  mount -t proc proc "$r/proc" && mounted+=("$r/proc") || die "cannot mount /proc in $r"
  mount -t sysfs sysfs "$r/sys" && mounted+=("$r/sys") || die "cannot mount /sys in $r"
  # rbind, then rslave: nothing done under the root's /dev reaches the host's.
  mount --rbind /dev "$r/dev" && mounted+=("$r/dev") || die "cannot bind /dev into $r"
  mount --make-rslave "$r/dev" || die "cannot make $r/dev a slave mount"
}

in_root() { # in_root ROOT COMMAND...: a clean login-like environment
  local r=$1; shift
  # CI passes through (.ci/run sets CI=true: a missing server fails the
  # suites instead of skipping them), and so does the network's trust:
  # node reads the CA bundle only when told (see local_cas below).
  chroot "$r" /usr/bin/env -i HOME=/root USER=root LOGNAME=root LANG=C.UTF-8 \
    TERM=dumb PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    ${CI:+CI=$CI} ${node_cas:+NODE_EXTRA_CA_CERTS=$node_cas} "$@"
}
node_cas=

# ---- the base root, cached as a tarball ---------------------------------
build_base() {
  if ! command -v debootstrap >/dev/null; then
    say "installing debootstrap"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; } \
      || die "debootstrap is missing and apt-get could not install it"
  fi
  mkdir -p "$cache" "$workdir" || die "cannot create $cache"
  stage=$(mktemp -d "$workdir/ratelimit-fresh-base.XXXXXX")
  say "building the base root: debootstrap --variant=minbase --include=$extra $suite ($mirror)"
  if ! debootstrap --variant=minbase --include="$extra" "$suite" "$stage/root" "$mirror" \
      >"$stage/debootstrap.log" 2>&1; then
    tail -n 30 "$stage/debootstrap.log" >&2
    [ -f "$stage/root/debootstrap/debootstrap.log" ] && tail -n 30 "$stage/root/debootstrap/debootstrap.log" >&2
    die "debootstrap could not build the $suite root (log above)"
  fi
  # A fresh Debian 12 machine's sources: the release, its updates and security.
  cat >"$stage/root/etc/apt/sources.list" <<EOF
deb $mirror $suite main
deb $mirror $suite-updates main
deb ${mirror%/debian}/debian-security $suite-security main
EOF
  # No daemon may start inside the chroot when a package is installed (the
  # redis-server package would start one on port 6379, in the host's
  # network): the usual policy-rc.d of chroots.
  printf '#!/bin/sh\nexit 101\n' >"$stage/root/usr/sbin/policy-rc.d"
  chmod 755 "$stage/root/usr/sbin/policy-rc.d"
  in_root "$stage/root" apt-get clean
  tar -C "$stage/root" -cf "$base.tmp" . || die "cannot write $base"
  mv "$base.tmp" "$base"
  rm -rf --one-file-system "$stage"; stage=""
  say "base root cached: $base ($(du -h "$base" | cut -f1), $(elapsed))"
}

if [ "$mode" = base ] || [ "${RATE_FRESH_REBUILD:-0}" = 1 ] || [ ! -s "$base" ]; then
  build_base
else
  say "using the cached base root $base"
fi
[ "$mode" = base ] && exit 0

# ---- a fresh copy per run, a clean clone of HEAD ------------------------
head=$(git -C "$repo" rev-parse HEAD)
if [ -n "$(git -C "$repo" status --porcelain --untracked-files=no)" ]; then
  say "note: the checkout has uncommitted changes; only HEAD ($head) is checked"
fi
root=$(mktemp -d "$workdir/ratelimit-fresh.XXXXXX")
tar -C "$root" -xf "$base" || die "cannot unpack $base"
cp -L /etc/resolv.conf "$root/etc/resolv.conf" || die "cannot copy /etc/resolv.conf"
# The host's local certificate authorities (a network that inspects TLS
# has one): the network's set-up, like resolv.conf, not a package.
local_cas=(/usr/local/share/ca-certificates/*.crt)
if [ -e "${local_cas[0]}" ]; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp -L "${local_cas[@]}" "$root/usr/local/share/ca-certificates/"
  in_root "$root" update-ca-certificates >/dev/null 2>&1 || die "update-ca-certificates failed in the root"
  node_cas=/etc/ssl/certs/ca-certificates.crt
fi
git clone -q --no-hardlinks "$repo" "$root/root/ratelimit" || die "cannot clone $repo"
git -C "$root/root/ratelimit" checkout -q --detach "$head" || die "cannot check out $head"
for tool in cmake pkg-config redis-server valgrind clang; do
  if in_root "$root" sh -c "command -v $tool" >/dev/null; then
    die "the base root already has $tool: it is not what a new user has"
  fi
done
mount_into "$root"
say "checking $head in $root"

log=$root/root/fresh-check.log
run_step() { # run_step NAME: `make NAME` in the clone, as root
  local t0=$(date +%s) rc=0
  say "make $1 ..."
  in_root "$root" bash -c "cd /root/ratelimit && make $1" >>"$log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    tail -n 80 "$log" >&2
    RATE_FRESH_KEEP=1
    die "make $1 failed in the fresh root (exit $rc; last lines above; whole log: $log)"
  fi
  say "make $1 passed ($(($(date +%s) - t0)) s)"
}
# `make` installs nothing: on the fresh root it must stop and name the
# missing packages and the command that installs them.
in_root "$root" bash -c "cd /root/ratelimit && make" >"$root/root/make-bare.log" 2>&1 \
  && die "make succeeded on a root without cmake: it should have named the missing packages"
grep -q "missing Debian packages: .*cmake" "$root/root/make-bare.log" \
  && grep -q "apt-get install .*cmake" "$root/root/make-bare.log" \
  || { cat "$root/root/make-bare.log" >&2; die "make on the fresh root did not name the missing packages"; }
say "make (no packages installed) named what is missing: $(head -n 1 "$root/root/make-bare.log")"
run_step demo
[ -s "$root/root/ratelimit/build/demo.svg" ] || die "make demo wrote no build/demo.svg"
run_step test

# ---- installed like a C library ----------------------------------------
# The README's example, taken from the README itself (the first C block
# after "## In C").
awk '/^## In C/ { c = 1 } c && /^```c/ { p = 1; next } p && /^```/ { exit } p' \
  "$root/root/ratelimit/README.md" >"$root/root/app.c"
[ -s "$root/root/app.c" ] || die "no C example found under '## In C' in README.md"
say "make install, the README's example, make uninstall ..."
cat >"$root/root/install-check.sh" <<'EOF'
set -eux
cd /root/ratelimit
make install
cd /root
cc app.c -o app $(pkg-config --cflags --libs ratelimit)
out=$(./app)
[ "$out" = 1111111111111111111100000 ]
ratelimit --version
cd /root/ratelimit
make uninstall
left=$(find /usr/local -name '*ratelimit*')
[ -z "$left" ] || { echo "left after make uninstall: $left"; exit 1; }
ldconfig -p >/tmp/ldconfig.out
! grep -q libratelimit /tmp/ldconfig.out
EOF
if ! in_root "$root" bash /root/install-check.sh >>"$log" 2>&1; then
  tail -n 40 "$log" >&2
  RATE_FRESH_KEEP=1
  die "install, build with the README's line, run, uninstall failed in the fresh root (log: $log)"
fi
say "make install / README example / make uninstall passed"
say "PASSED: make, make demo, make test, make install/uninstall on a fresh $suite root, $head ($(elapsed))"
exit 0
}
