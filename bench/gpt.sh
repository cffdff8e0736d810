#!/usr/bin/env bash
# bench/gpt.sh - shakespeare-gpt (nanoGPT's shakespeare-char CPU run) against its PyTorch peer
# (bench/torch_gpt.py: nanoGPT's model and recipe, eager; PyTorch's current release from PyPI,
# bench/torch-venv.sh; PEER_PYTHON overrides), all in this one run: ms a step on 1 device against
# 1 thread, and on 2 devices and on 1 device of 2 cores (1x2) against 2 threads (loom: the mean of
# steps 111-220, after an evaluation; PyTorch: steps 21-120), then the whole 2000-step run of
# each on 2 cores for three seeds, PyTorch from loom's initial weights on loom's batches, with
# the final validation losses (both exact: the whole split in non-overlapping windows), their
# difference, the run's time and peak RSS.
# REPEAT=N (default 1) times each step time N times, loom and PyTorch alternating, and reports
# the medians with every run (this machine's speed moves 10-30% between runs). LARGE=1 times the
# step of nanoGPT's GPU recipe with a CPU's batch (6 layers, 6 heads, width 384, context 256,
# batch 8; loom: the mean of steps 21-40) and skips the whole runs. Not a test.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"
[ -x build/loom ] || { echo "build first: make build"; exit 1; }
py=${PEER_PYTHON:-$(bash bench/torch-venv.sh)}
echo "peer: PyTorch $("$py" -c 'import torch; print(torch.__version__)'); CPU: $(lscpu | sed -n 's/^Model name: *//p')"
loom_ms() { # DEVICES, or 1x2: one device of 2 cores
    local opts="--devices $1"
    [ "$1" = 1x2 ] && opts="--devices 1 --cores-per-device 2"
    local last=220 run="--steps 220 --eval-interval 110"
    [ -n "${LARGE:-}" ] && last=40 run="--steps 40 --eval-interval 20 --warmup-steps 10 --layers 6 --heads 6 --width 384 --context 256 --batch 8"
    # shellcheck disable=SC2086
    build/loom train shakespeare-gpt $run $opts |
        sed -n "s/^step $last: .*, \([0-9.]*\) ms a step$/\1/p"; }
torch_ms() {
    local shape=64,4,4,128,12 steps=120
    [ -n "${LARGE:-}" ] && shape=256,6,6,384,8 steps=40
    GPT_SHAPE=$shape "$py" bench/torch_gpt.py $steps "$1" --no-eval | sed -n 's/^ms\/step //p'; }
printf '%-10s %10s %10s %8s\n' devices loom_ms torch_ms speedup
for n in 1 2 1x2; do
    ls=() ts=()
    for _ in $(seq "${REPEAT:-1}"); do ls+=("$(loom_ms $n)") ts+=("$(torch_ms "${n#1x}")"); done
    l=$(median "${ls[@]}") t=$(median "${ts[@]}")
    runs=""
    [ "${REPEAT:-1}" -gt 1 ] && runs="   (loom ${ls[*]}; PyTorch ${ts[*]})"
    printf '%-10s %10s %10s %7.2fx%s\n' "$n" "$l" "$t" "$(echo "$t / $l" | bc -l)" "$runs"
done
[ -z "${LARGE:-}" ] || exit 0
# The whole default run (2000 steps) on 2 cores for each of SEEDS (default 0 1 2): loom on 2
# devices, and PyTorch on 2 threads from loom's initial weights on loom's batches (INIT and
# LOOM_SEED, bench/torch_gpt.py), so that the two differ only in their arithmetic.
init=/tmp/loom-gpt-init.$$.safetensors
printf '%-5s %9s %9s %11s %7s %8s %12s %12s\n' seed loom_val torch_val difference loom_s torch_s loom_rss_MB torch_rss_MB
for seed in ${SEEDS:-0 1 2}; do
    build/loom train shakespeare-gpt --seed "$seed" --steps 1 --lr 1e-30 --min-lr 1e-30 \
        --eval-interval 1000000 --save "$init" >/dev/null # the initial weights: 1e-30 moves none
    /usr/bin/time -f "peak RSS %M KB" build/loom train shakespeare-gpt --devices 2 --seed "$seed" >/tmp/loom-gpt.$$ 2>&1
    INIT=$init LOOM_SEED=$seed /usr/bin/time -f "peak RSS %M KB" "$py" bench/torch_gpt.py 2000 2 >/tmp/torch-gpt.$$ 2>&1
    lv=$(sed -n 's/^val loss: //p' /tmp/loom-gpt.$$) tv=$(sed -n 's/^val loss //p' /tmp/torch-gpt.$$)
    printf '%-5s %9s %9s %+11.4f %7s %8s %12d %12d\n' "$seed" "$lv" "$tv" "$(echo "$lv - $tv" | bc -l)" \
        "$(sed -n 's/^[0-9]* steps in \([0-9.]*\) s.*/\1/p' /tmp/loom-gpt.$$)" \
        "$(sed -n 's/^run s //p' /tmp/torch-gpt.$$)" \
        "$(($(sed -n 's/^peak RSS \([0-9]*\) KB$/\1/p' /tmp/loom-gpt.$$) / 1024))" \
        "$(($(sed -n 's/^peak RSS \([0-9]*\) KB$/\1/p' /tmp/torch-gpt.$$) / 1024))"
done
rm -f /tmp/loom-gpt.$$ /tmp/torch-gpt.$$ "$init"
