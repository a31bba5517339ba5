#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Which headers each part of the library may include (docs/design.md,
# "Layers"): a part above the core reads the public headers (include/),
# its own folder's files and the internal headers listed for it below, and
# nothing else of the tree; the core (the files at the top of src/) is not
# held.  Every `#include "..."` of every C file and header of a part is
# checked; a generated header (the Redis scripts' NAME_lua.h) counts as
# its folder's own.
#
# usage: part_includes_test.sh SOURCE_DIR
set -u

src=$1
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# check PART_DIR FILE_PATTERN ALLOWED...: each quoted include of the part's
# files is a public header, a file of PART_DIR (no ".."), a generated
# script header, or one of ALLOWED (spelled as the file spells it).
check() {
    local dir=$1 pattern=$2
    shift 2
    local f inc ok a n=0 before=$fails
    while IFS= read -r f; do
        n=$((n + 1))
        while IFS= read -r inc; do
            ok=0
            case $inc in
                ratelimit*.h) [ -f "$src/include/$inc" ] && ok=1 ;;
                *_lua.h) [ "$dir" = src/store/redis ] && ok=1 ;;
                */* | ..*) ;;
                *) [ -f "$src/$dir/$inc" ] && ok=1 ;;
            esac
            for a in "$@"; do [ "$inc" = "$a" ] && ok=1; done
            [ $ok = 1 ] ||
                fail "${f#"$src"/} includes \"$inc\", which $dir may not"
        done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
    done < <(find "$src/$dir" -maxdepth 1 -name "$pattern" \( -name '*.c' -o -name '*.h' \) | sort)
    [ $n -gt 0 ] || fail "$dir: no files matching $pattern"
    [ $fails -gt "$before" ] || echo "ok: $dir/$pattern"
}

# The algorithms: the kit alone.
check src/algo '*' ../kit.h
# The plain stores: the public store contract alone (store_public also
# compiles them apart and checks their symbols).
check src/store 'memory.c'
check src/store 'shm.c'
# The stores that keep a state's bytes over a network: the kit and the
# call scope (one deadline per call).
check src/store 'dynamodb.c' ../call.h ../kit.h
check src/store/redis '*' ../../call.h ../../kit.h
# The layers built on the public headers.
check src/fair '*'
check src/http '*'
check src/synced '*'
check src/lease '*'
# The Redis module: the step and the fair and lease steps, through the
# step's include path (ratelimit_step), never a relative path.
check redis-module '*' step.h kit.h fair/step.h lease/lease.h rm_api.h

if [ "$fails" -ne 0 ]; then
    echo "$fails failure(s)"
    exit 1
fi
