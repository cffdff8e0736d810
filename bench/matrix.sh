#!/usr/bin/env bash
# bench/matrix.sh [MODEL...] - the model matrix (bench/matrix.h: the two recipes and eleven more
# built through the public API), each model against PyTorch with the same model and batch, all in
# this one run: loom on 1 device against PyTorch's best on one thread (eager or torch.compile),
# and loom's best on 2 cores (2 devices, or 1 device of 2 cores: loom1x2) against PyTorch's best
# on 2 cores (2 threads eager or compiled, or DDP with 2 processes x 1 thread). Steady state: loom's trainer and PyTorch each STEPS steps after 20
# warm-up steps, STEPS sized from the model's FLOP for about 2 s of loom. Also the share of the
# FMA peak (build/bench_peak, measured now; 2 devices: of twice it) and 2-device scaling.
# PyTorch is its current release from PyPI (bench/torch-venv.sh; PEER_PYTHON overrides);
# NO_COMPILE=1 leaves torch.compile out (it compiles for ~40 s a model and mode). REPEAT=N
# (default 1) measures each figure N times, loom's and PyTorch's in turn, and reports the
# medians (this machine's speed moves 10-30% between runs). Not a test.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"
[ -x build/bench_matrix ] && [ -x build/bench_peak ] || { echo "build first: make build"; exit 1; }
py=${PEER_PYTHON:-$(bash bench/torch-venv.sh)}
echo "peer: PyTorch $("$py" -c 'import torch; print(torch.__version__)'); CPU: $(lscpu | sed -n 's/^Model name: *//p')"
peak=$(build/bench_peak)
echo "FMA peak of one core: $peak GFLOP/s"
models=("$@")
[ ${#models[@]} -gt 0 ] || mapfile -t models < <(build/bench_matrix --list | cut -d' ' -f1)
rate() { sed -n 's/^samples\/s //p'; }
# A PyTorch figure: its run again where it fails (DDP over gloo aborts now and then here:
# "terminate called without an active exception"), nothing after a third failure (that figure
# then has fewer samples, or reads 0)
peer() {
    local r
    for _ in 1 2 3; do
        r=$("$py" bench/torch_matrix.py "$@" 2>/dev/null | rate) && [ -n "$r" ] && { echo "$r"; return; }
        echo "matrix.sh: PyTorch's $* failed; again" >&2
    done
}
best() { printf '%s\n' "$@" | sort -g | tail -1; }
printf '%-15s %5s %6s %9s %9s %9s %9s %7s %7s %9s %9s %9s %9s %9s %7s %7s %6s\n' model batch \
    steps loom1 eager1 compile1 torch1 vs1 peak1 loom2 loom1x2 eager2 compile2 ddp2 vs2 peak2 scale
for m in "${models[@]}"; do
    read -r _ batch _ flop _ < <(build/bench_matrix --list | grep "^$m ")
    # about 2 s of loom at 60 GFLOP/s, 20 to 2000 steps
    steps=$(echo "s = 2 * 60000000000 / ($flop * $batch); if (s < 20) s = 20; if (s > 2000) s = 2000; scale = 0; s / 1" | bc)
    L1=() L2=() L12=() E1=() E2=() D2=()
    for _ in $(seq "${REPEAT:-1}"); do
        L1+=("$(build/bench_matrix "$m" 1 "$steps" | rate)")
        E1+=($(peer "$m" eager1 "$steps"))
        L2+=("$(build/bench_matrix "$m" 2 "$steps" | rate)")
        L12+=("$(build/bench_matrix "$m" 1x2 "$steps" | rate)")
        E2+=($(peer "$m" eager2 "$steps"))
        D2+=($(peer "$m" ddp2 "$steps"))
    done
    l1=$(median "${L1[@]}") l2=$(median "${L2[@]}") l12=$(median "${L12[@]}") e1=$(median "${E1[@]}")
    e2=$(median "${E2[@]}") d2=$(median "${D2[@]}")
    c1=0 c2=0
    if [ "${NO_COMPILE:-0}" != 1 ]; then
        c1=$("$py" bench/torch_matrix.py "$m" compile1 "$steps" 2>/dev/null | rate)
        c2=$("$py" bench/torch_matrix.py "$m" compile2 "$steps" 2>/dev/null | rate)
    fi
    t1=$(best "$e1" "${c1:-0}") t2=$(best "$e2" "${c2:-0}" "$d2") b2=$(best "$l2" "$l12")
    printf '%-15s %5s %6s %9s %9s %9s %9s %6.2fx %6.1f%% %9s %9s %9s %9s %9s %6.2fx %6.1f%% %5.2fx\n' \
        "$m" "$batch" "$steps" "$l1" "$e1" "${c1:-0}" "$t1" "$(echo "$l1 / $t1" | bc -l)" \
        "$(echo "100 * $l1 * $flop / ($peak * 1000000000)" | bc -l)" "$l2" "$l12" "$e2" "${c2:-0}" \
        "$d2" "$(echo "$b2 / $t2" | bc -l)" "$(echo "100 * $b2 * $flop / (2 * $peak * 1000000000)" | bc -l)" \
        "$(echo "$b2 / $l1" | bc -l)"
done
