#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# SPDX license lines in the source files git tracks.
#   scripts/spdx.sh check   list the files without one; exit 1 if any
#   scripts/spdx.sh add     give each such file one, as its first line (after
#                           a #! line, which stays first)
# Which files and which comment:
#   *.c *.h                                       /* SPDX-License-Identifier: MIT */
#   *.sh *.cmake *.cmake.in *.pc.in CMakeLists.txt Makefile,
#   and files with a shell #! line                # SPDX-License-Identifier: MIT
#   *.lua                                         -- SPDX-License-Identifier: MIT
# A file counts as having one if its first 20 lines contain
# "SPDX-License-Identifier:".
set -euo pipefail

license=MIT
mode=${1:-}
case "$mode" in check | add) ;; *) echo "usage: $0 check|add" >&2; exit 2 ;; esac
cd "$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)"

# The comment line for a file, or nothing if it is not a source file.
line_for() {
  local f=$1 tag="SPDX-License-Identifier: $license"
  case "${f##*/}" in
    *.c | *.h) echo "/* $tag */" ;;
    *.sh | *.cmake | *.cmake.in | *.pc.in | CMakeLists.txt | Makefile) echo "# $tag" ;;
    *.lua) echo "-- $tag" ;;
    *.*) ;;
    *) grep -Eq '^#!.*\b(ba|da|k|z)?sh\b' <(head -n 1 "$f") && echo "# $tag" ;;
  esac
  return 0
}

missing=0
while IFS= read -r -d '' f; do
  [ -f "$f" ] && [ ! -L "$f" ] || continue
  line=$(line_for "$f")
  [ -n "$line" ] || continue
  grep -q 'SPDX-License-Identifier:' <(head -n 20 "$f") && continue
  if [ "$mode" = check ]; then
    echo "$f"
    missing=$((missing + 1))
    continue
  fi
  tmp=$(mktemp)
  if grep -q '^#!' <(head -n 1 "$f"); then
    { head -n 1 "$f"; echo "$line"; tail -n +2 "$f"; } >"$tmp"
  else
    { echo "$line"; cat "$f"; } >"$tmp"
  fi
  cat "$tmp" >"$f" # keeps the file's mode
  rm -f "$tmp"
  echo "spdx: added to $f"
done < <(git ls-files -z)

if [ "$mode" = check ]; then
  if [ "$missing" -gt 0 ]; then
    echo "spdx: $missing file(s) above have no SPDX-License-Identifier line (scripts/spdx.sh add gives them one)" >&2
    exit 1
  fi
  echo "spdx: every source file has an SPDX-License-Identifier line"
fi
