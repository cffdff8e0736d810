#!/usr/bin/env bash
# test_e2e.sh LOOM RECIPE MIN_ACCURACY [args...] - trains a recipe on real Fashion-MNIST and checks
# the final test accuracy printed on its own line.
set -u
loom="$1" recipe="$2" min="$3"; shift 3
out=$("$loom" train "$recipe" "$@" 2>&1) || { echo "$out"; echo "FAIL: loom exited $?"; exit 1; }
echo "$out"
acc=$(echo "$out" | sed -n 's/^test accuracy: \([0-9.]*\)$/\1/p')
[ -n "$acc" ] || { echo "FAIL: no test accuracy line"; exit 1; }
awk -v a="$acc" -v m="$min" 'BEGIN { exit !(a >= m) }' || { echo "FAIL: accuracy $acc < $min"; exit 1; }
echo "ok: $recipe test accuracy $acc >= $min"
