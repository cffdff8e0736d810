#!/usr/bin/env bash
# bench/bitwise.sh BUILD [STEPS] - a digest of the parameters after STEPS (default 30) training
# steps of every model of the matrix (bench_matrix --digest) on 1 and 2 devices, and of the GPT's
# saved weights after a few steps on 1 and 2 devices: one line per case. Two builds give the same
# lines when a change keeps every result bitwise (a refactor of the compiler, say):
#   diff <(bash bench/bitwise.sh /tmp/before/build) <(bash bench/bitwise.sh build)
# Not a test: it takes a few minutes.
set -euo pipefail
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"
[ $# -ge 1 ] || { echo "usage: $0 BUILD [STEPS]"; exit 2; }
build=$1 steps=${2:-30}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for model in $("$build/bench_matrix" --list | awk '{print $1}'); do
    for dev in 1 2; do
        echo "$model ${dev}dev $("$build/bench_matrix" "$model" "$dev" "$steps" --digest | sed -n 's/^params //p')"
    done
done
for dev in 1 2; do
    "$build/loom" train shakespeare-gpt --steps 6 --devices "$dev" --eval-interval 1000 --quiet \
        --save "$tmp/gpt$dev.safetensors" >/dev/null
    echo "shakespeare-gpt ${dev}dev $(sha256sum <"$tmp/gpt$dev.safetensors" | cut -c1-16)"
done
