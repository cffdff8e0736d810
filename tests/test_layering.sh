#!/usr/bin/env bash
# tests/test_layering.sh OBJDIR SRCDIR - src/'s folders call and include only folders below them
# (scripts/layering.sh over the library's objects and sources); first, that the check fails on a
# made-up tree with an upward call and an upward include, naming both.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
check="$here/../scripts/layering.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/obj/graph" "$tmp/obj/compile" "$tmp/src/graph" "$tmp/src/compile"
echo 'int loom__planned(void) { return 1; }' >"$tmp/src/compile/plan.c"
printf '#include "../compile/internal.h"\nint loom__planned(void);\nint loom__node(void) { return loom__planned(); }\n' \
    >"$tmp/src/graph/graph.c"
touch "$tmp/src/compile/internal.h"
cc -c "$tmp/src/compile/plan.c" -o "$tmp/obj/compile/plan.c.o"
cc -c -I"$tmp/src/graph" "$tmp/src/graph/graph.c" -o "$tmp/obj/graph/graph.c.o"
if bash "$check" "$tmp/obj" "$tmp/src" >"$tmp/out" 2>&1; then
    echo "FAIL: an upward call and include passed the check"; cat "$tmp/out"; exit 1
fi
grep -q "src/graph/graph.c calls loom__planned, defined in src/compile/plan.c" "$tmp/out" ||
    { echo "FAIL: the upward call is not named"; cat "$tmp/out"; exit 1; }
grep -q 'graph/graph.c includes "../compile/internal.h"' "$tmp/out" ||
    { echo "FAIL: the upward include is not named"; cat "$tmp/out"; exit 1; }
echo "ok: the check fails on an upward call and include"
bash "$check" "$1" "$2"
