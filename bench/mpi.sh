#!/usr/bin/env bash
# bench/mpi.sh - the cost of crossing processes, all from one run: loom's training rate with
# 2 processes x 1 device (mpirun, shared memory) against 1 process x 2 devices on both recipes
# (steady state after 20 warm-up steps, as bench/run.sh; median of three), loom's cross-process
# all-reduce against OpenMPI's MPI_Allreduce at bucket sizes (build/bench_allreduce), and
# PyTorch DistributedDataParallel (gloo, 2 processes x 1 thread; PyTorch's current release from
# PyPI, bench/torch-venv.sh, as bench/run.sh; PEER_PYTHON overrides). Not a test.
set -euo pipefail
cd "$(dirname "$0")/.."
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader \
    OMPI_MCA_btl_vader_single_copy_mechanism=none
loom=build/loom
[ -x "$loom" ] && [ -x build/bench_allreduce ] || { echo "build first (with MPI): make build"; exit 1; }
py=${PEER_PYTHON:-$(bash bench/torch-venv.sh)}
echo "peer: PyTorch $("$py" -c 'import torch; print(torch.__version__)')"
rate() { "$@" 2>/dev/null | sed -n 's/.* samples\/s training, \([0-9]*\) after 20 warm-up steps.*/\1/p'; }
median3() { printf '%s\n' "$("$@")" "$("$@")" "$("$@")" | sort -g | sed -n 2p; }
printf '%-11s %6s %12s %12s %8s %12s %10s\n' recipe steps loom_1x2 loom_2x1 2x1/1x2 torch_ddp2 vs_ddp2
for spec in fmnist-mlp:400 fmnist-cnn:150; do
    recipe=${spec%%:*} steps=${spec##*:}
    n=$((steps + 20))
    "$loom" train "$recipe" --steps 3 --devices 2 >/dev/null 2>&1 # warm the kernel cache
    one=$(median3 rate "$loom" train "$recipe" --steps $n --devices 2)
    two=$(median3 rate mpirun -np 2 "$loom" train "$recipe" --steps $n --devices 1)
    ddp=$("$py" bench/torch_peer.py "$recipe" "$steps" 2 | sed -n 's/^samples\/s //p')
    printf '%-11s %6s %12s %12s %7.2fx %12s %9.2fx\n' "$recipe" "$steps" "$one" "$two" \
        "$(echo "$two / $one" | bc -l)" "$ddp" "$(echo "$two / $ddp" | bc -l)"
done
mpirun -np 2 build/bench_allreduce
mpirun --oversubscribe -np 3 build/bench_allreduce
