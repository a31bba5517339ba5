#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The library's ABI against the committed description of the last release
# (abi/libratelimit.abi, made by abidw from Debian's abigail-tools), so that
# a break is seen in CI, not by users (docs/design.md, "A stable ABI").
#   scripts/abi-check.sh BUILD_DIR           compare BUILD_DIR's libratelimit.so
#   scripts/abi-check.sh --update BUILD_DIR  write the description anew (a release)
# The build must have every optional part (make test-plain's build/).  Only
# types of the public headers count; functions added are no change.  Any
# change abidiff reports fails: a reviewed, compatible one (a reserved word
# given a name) is accepted with a suppression in abi/suppressions.abignore.
set -euo pipefail
S=$(cd "$(dirname "$0")/.." && pwd)
update=0
if [ "${1:-}" = --update ]; then update=1; shift; fi
[ $# -eq 1 ] || { echo "usage: $0 [--update] BUILD_DIR" >&2; exit 2; }
so=$(readlink -f "$1/libratelimit.so")
[ -f "$so" ] || { echo "abi-check: no $1/libratelimit.so (build it first)" >&2; exit 2; }
command -v abidiff >/dev/null || { echo "abi-check: abidiff missing (apt-get install abigail-tools)" >&2; exit 2; }
# Without DWARF abidiff sees no types and would pass anything.
# (grep reads the list itself: `readelf | grep -q` fails under pipefail
# when grep quits first.)
grep -q '\.debug_info' <(readelf -S "$so") ||
  { echo "abi-check: $so has no debug info (build it RelWithDebInfo or Debug): abidiff would compare nothing" >&2; exit 2; }
base="$S/abi/libratelimit.abi"
if [ $update -eq 1 ]; then
  # Paths are made relative to the tree, so that the file names no machine.
  abidw --headers-dir "$S/include" --drop-private-types --no-corpus-path \
    --no-comp-dir-path "$so" | sed "s#$S/##g" >"$base.tmp"
  mv "$base.tmp" "$base"
  echo "abi-check: wrote $base from $so"
  exit 0
fi
rc=0
abidiff --headers-dir2 "$S/include" --drop-private-types --no-added-syms \
  --suppressions "$S/abi/suppressions.abignore" "$base" "$so" >"$1/abidiff.txt" 2>&1 || rc=$?
if [ $rc -ne 0 ]; then
  cat "$1/abidiff.txt"
  echo "abi-check: the ABI differs from abi/libratelimit.abi (abidiff exit $rc): see docs/design.md, \"A stable ABI\"" >&2
  exit 1
fi
echo "abi-check: $(basename "$so") keeps the ABI of abi/libratelimit.abi"
