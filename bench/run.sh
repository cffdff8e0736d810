#!/usr/bin/env bash
# bench/run.sh - training throughput of both recipes on one device, loom and PyTorch (Debian's
# python3-torch, 1 thread) measured in the same run, same model, batch 128, SGD momentum 0.9.
# loom's figure is its own "samples/s training" (step time, evaluation excluded) over an epoch's
# first STEPS steps; PyTorch's is steady state after 20 warm-up steps. Not a test.
set -euo pipefail
cd "$(dirname "$0")/.."
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"
loom=build/loom
[ -x "$loom" ] || { echo "build first: make build"; exit 1; }
printf '%-11s %8s %14s %14s %7s\n' recipe steps loom_samples/s torch_samples/s ratio
for spec in fmnist-mlp:400 fmnist-cnn:150; do
    recipe=${spec%%:*} steps=${spec##*:}
    l=$("$loom" train "$recipe" --steps "$steps" | sed -n 's/.*(\([0-9]*\) samples\/s training.*/\1/p')
    t=$(/usr/bin/python3 bench/torch_peer.py "$recipe" "$steps" | sed -n 's/^samples\/s //p')
    printf '%-11s %8s %14s %14s %7.2f\n' "$recipe" "$steps" "$l" "$t" "$(echo "$l / $t" | bc -l)"
done
