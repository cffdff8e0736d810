#!/usr/bin/env bash
# bench/run.sh - training throughput of both recipes, loom on 1 and 2 devices and PyTorch
# (its current release from PyPI, bench/torch-venv.sh; PEER_PYTHON overrides) on 1 thread and with DistributedDataParallel (gloo, 2 processes x
# 1 thread), all measured in this one run: same model, global batch 128, SGD momentum 0.9.
# Both figures are steady state, STEPS steps after 20 warm-up steps (on one device, the median of
# three runs): loom's is its own "samples/s ... after 20 warm-up steps" (the training steps' time,
# evaluation excluded) with its kernel cache warm; the cold compile time (an empty cache, all the
# run's programs) and the start-up to the first step are reported apart. Not a test.
set -euo pipefail
cd "$(dirname "$0")/.."
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"
loom=build/loom
[ -x "$loom" ] && [ -x build/bench_peak ] || { echo "build first: make build"; exit 1; }
py=${PEER_PYTHON:-$(bash bench/torch-venv.sh)}
echo "peer: PyTorch $("$py" -c 'import torch; print(torch.__version__)')"
# loom's steady state as the peer measures PyTorch's: STEPS steps after 20 warm-up steps
rate() { "$loom" train "$1" --steps $(($2 + 20)) --devices "$3" 2>/dev/null |
    sed -n 's/.* samples\/s training, \([0-9]*\) after 20 warm-up steps.*/\1/p'; }
cold=$(mktemp -d)
trap 'rm -rf "$cold"' EXIT
cold_compile() { XDG_CACHE_HOME="$cold/$1.$2" "$loom" train "$1" --steps 3 --devices "$2" 2>/dev/null |
    sed -n 's/.*compiles \([0-9]*\) (\([0-9.]*\) s).*/\1 programs in \2 s/p'; }
torch() { "$py" bench/torch_peer.py "$@" | sed -n 's/^samples\/s //p'; }
# start-up to the end of the first step (warm kernel cache) and peak RSS, loom then PyTorch
startup() { "$loom" train "$1" --steps 3 --devices 1 2>/dev/null | sed -n 's/^start-up to the end of the first step \([0-9.]*\) s; peak RSS \([0-9]*\) MiB$/\1 s, \2 MiB/p'; }
torch_startup() { "$py" bench/torch_peer.py "$1" 3 | awk '/^startup/ {s=$2} /^maxrss/ {m=$2} END {print s " s, " m " MiB"}'; }
# FLOP per training sample (forward + weight gradients + the input gradients that are needed)
flop() { [ "$1" = fmnist-mlp ] && echo 1211392 || echo 15403776; }
# ... of which loom performs: conv2's forward skips the 21 of 121 positions of each plane that no
# pooling window reads (2 x 64 x 288 x 21 = 774144 a sample)
flop_done() { [ "$1" = fmnist-mlp ] && echo 1211392 || echo 14629632; }
# The median of three runs (this VM's speed moves 5-15% within minutes): loom and PyTorch on one
# device alike, and the FMA peak.
median3() { printf '%s\n' "$("$@")" "$("$@")" "$("$@")" | sort -g | sed -n 2p; }
# this core's FMA peak, measured now (bench/peak.c); the brief's figure for this machine is 275
peak=$(median3 build/bench_peak)
compile_note=""
printf '%-11s %6s %10s %10s %8s %10s %10s %10s %10s\n' recipe steps loom_1dev loom_2dev scaling \
    torch_1thr torch_ddp2 vs_1thr vs_ddp2
for spec in fmnist-mlp:400 fmnist-cnn:150; do
    recipe=${spec%%:*} steps=${spec##*:}
    rate "$recipe" 3 1 >/dev/null; rate "$recipe" 3 2 >/dev/null   # warm the kernel cache
    compile_note="$compile_note
$recipe cold compile: 1 device $(cold_compile "$recipe" 1); 2 devices $(cold_compile "$recipe" 2)
$recipe start-up to first step and peak RSS: loom $(startup "$recipe"); torch $(torch_startup "$recipe")"
    l1=$(median3 rate "$recipe" "$steps" 1)
    l2=$(rate "$recipe" "$steps" 2)
    t1=$(median3 torch "$recipe" "$steps")
    t2=$(torch "$recipe" "$steps" 2)
    printf '%-11s %6s %10s %10s %7.2fx %10s %10s %9.2fx %9.2fx\n' "$recipe" "$steps" "$l1" "$l2" \
        "$(echo "$l2 / $l1" | bc -l)" "$t1" "$t2" "$(echo "$l1 / $t1" | bc -l)" \
        "$(echo "$l2 / $t2" | bc -l)"
    compile_note="$compile_note
$recipe 1 device: $(echo "$l1 * $(flop "$recipe") / 1000000000" | bc -l | xargs printf '%.1f') GFLOP/s = $(echo "100 * $l1 * $(flop "$recipe") / ($peak * 1000000000)" | bc -l | xargs printf '%.0f')% of one core's measured FMA peak ($peak GFLOP/s), $(echo "100 * $l1 * $(flop "$recipe") / 275000000000" | bc -l | xargs printf '%.0f')% of the brief's 275; the FLOPs loom performs: $(echo "100 * $l1 * $(flop_done "$recipe") / ($peak * 1000000000)" | bc -l | xargs printf '%.0f')% of the peak"
done
echo "$compile_note" | sed '/^$/d'
