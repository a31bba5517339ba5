#!/bin/bash
# SPDX-License-Identifier: MIT
#
# The plain back ends are written against the public store contract alone
# (include/ratelimit_store.h), as a stranger's store would be: each file is
# copied into an empty directory, so that no relative include of the
# library's own sources can be found, compiled there with only include/ on
# the path, and its object may then refer to no internal symbol (rate__*).
#
# usage: store_public_test.sh CC INCLUDE_DIR SOURCE...
set -u

cc=$1 inc=$2
shift 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
flags=(-std=c11 -D_GNU_SOURCE -fPIC -fvisibility=hidden -O2 -Wall -Wextra
       -Werror -Wconversion -Wshadow -Wstrict-prototypes -I "$inc")
read -r -a xxh <<<"$(pkg-config --cflags libxxhash)"

for src in "$@"; do
    name=$(basename "$src")
    cp "$src" "$tmp/$name"
    if ! (cd "$tmp" && "$cc" "${flags[@]}" "${xxh[@]}" -c "$name" \
            -o "$name.o" 2>"$name.err"); then
        echo "FAIL: $name does not compile from the public headers alone:"
        sed 's/^/    /' "$tmp/$name.err" | head -20
        fails=$((fails + 1))
        continue
    fi
    internal=$(nm -u "$tmp/$name.o" | awk '{print $NF}' |
               grep -E '^(rate__|RATE__)' || true)
    if [ -n "$internal" ]; then
        echo "FAIL: $name refers to internal symbols:" $internal
        fails=$((fails + 1))
        continue
    fi
    echo "ok: $name uses the public contract only"
done
exit $((fails > 0))
