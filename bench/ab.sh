#!/usr/bin/env bash
# bench/ab.sh ROUNDS LOOM... - the steady-state training rate of several builds of the loom
# command, in alternating runs (this VM's speed drifts 5-15% within minutes, so builds compared
# one after the other would measure the drift): for each round, each recipe and 1 and 2 devices,
# every build in turn, its "samples/s after 20 warm-up steps" (400 MLP steps, 150 CNN steps, as
# bench/run.sh). One line per round and case, the builds' rates in the order given; then each
# build's median per case. Not a test. Example, the last commit against the one before:
#   git worktree add /tmp/before HEAD~1 && cmake -S /tmp/before -B /tmp/before/build -G Ninja \
#       -DCMAKE_BUILD_TYPE=Release && cmake --build /tmp/before/build &&
#   bash bench/ab.sh 5 /tmp/before/build/loom build/loom
set -euo pipefail
. "$(dirname "$0")/lib.sh"
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"
[ $# -ge 2 ] || { echo "usage: $0 ROUNDS LOOM..."; exit 2; }
rounds=$1
shift
rate() { "$1" train "$2" --steps $(($3 + 20)) --devices "$4" 2>/dev/null |
    sed -n 's/.* samples\/s training, \([0-9]*\) after 20 warm-up steps.*/\1/p'; }
for b in "$@"; do rate "$b" fmnist-mlp 3 1 >/dev/null; rate "$b" fmnist-cnn 3 2 >/dev/null; done
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for round in $(seq "$rounds"); do
    for spec in fmnist-mlp:400:1 fmnist-mlp:400:2 fmnist-cnn:150:1 fmnist-cnn:150:2; do
        IFS=: read -r recipe steps dev <<<"$spec"
        line="$recipe ${dev}dev"
        for b in "$@"; do line="$line $(rate "$b" "$recipe" "$steps" "$dev")"; done
        echo "round $round: $line" | tee -a "$out"
    done
done
echo "medians over $rounds rounds (builds in the order given: $*):"
for case in "fmnist-mlp 1dev" "fmnist-mlp 2dev" "fmnist-cnn 1dev" "fmnist-cnn 2dev"; do
    line="$case"
    for i in $(seq $#); do
        line="$line $(median $(grep " $case " "$out" | awk -v c=$((i + 4)) '{print $c}'))"
    done
    echo "$line"
done
