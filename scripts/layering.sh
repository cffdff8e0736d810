#!/usr/bin/env bash
# scripts/layering.sh OBJDIR SRCDIR - fails when a folder of src/ reaches a folder above it: a
# call (an undefined symbol of one folder's objects that another folder's objects define, read
# with nm from OBJDIR/FOLDER/**/*.c.o) or an include ("../FOLDER/..." in SRCDIR/FOLDER/**). Each folder
# may use only those listed after it below, the layering the README's Layout section shows.
#   scripts/layering.sh build/CMakeFiles/loom_objects.dir/src src
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 OBJDIR SRCDIR" >&2; exit 2; }
objdir=$1 srcdir=$2
declare -A may=(
    [core]=""
    [graph]="core"
    [backend]="core graph"
    [compile]="core graph backend"
    [dist]="core graph backend compile"
    [data]="core"
    [optim]="core graph"
    [nn]="core graph"
    [train]="core graph backend compile dist data optim nn"
)
allowed() { [ "$1" = "$2" ] || [[ " ${may[$1]-} " == *" $2 "* ]]; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bad=0
shopt -s nullglob
for dir in "$objdir"/*/; do
    f=$(basename "$dir")
    [ -n "${may[$f]+x}" ] || { echo "layering: folder src/$f is not in scripts/layering.sh's table"; bad=1; continue; }
    while read -r o; do
        name=${o#"$dir"}
        name=${name%.c.o}
        nm --defined-only "$o" | awk -v w="$f/$name" '$2 ~ /^[TDBRVW]$/ {print $3, w}' >>"$tmp/defs"
        nm -u "$o" | awk -v w="$f/$name" '{print $NF, w}' >>"$tmp/uses"
    done < <(find "$dir" -name '*.c.o')
done
[ -s "$tmp/defs" ] || { echo "layering: no objects under $objdir"; exit 1; }
sort -o "$tmp/defs" "$tmp/defs"
sort -o "$tmp/uses" "$tmp/uses"
while read -r sym user owner; do
    if ! allowed "${user%%/*}" "${owner%%/*}"; then
        echo "layering: src/$user.c calls $sym, defined in src/$owner.c: ${user%%/*}/ may use only ${may[${user%%/*}]:-nothing}"
        bad=1
    fi
done < <(join "$tmp/uses" "$tmp/defs")
src_abs=$(realpath "$srcdir")
while read -r file; do
    rel=${file#"$srcdir"/}
    f=${rel%%/*}
    while read -r inc; do
        to=$(realpath -m "$(dirname "$file")/$inc")
        to=${to#"$src_abs"/}
        to=${to%%/*}
        if ! allowed "$f" "$to"; then
            echo "layering: ${file#"$srcdir"/} includes \"$inc\": $f/ may use only ${may[$f]:-nothing}"
            bad=1
        fi
    done < <(sed -n 's/^#include "\(\.\.\/[^"]*\)".*/\1/p' "$file")
done < <(find "$srcdir" -mindepth 2 -name '*.[ch]')
[ $bad -eq 0 ] && echo "layering: clean"
exit $bad
