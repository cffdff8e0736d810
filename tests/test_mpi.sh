#!/usr/bin/env bash
# test_mpi.sh MPIEXEC TEST_MPI - the MPI process group across processes: test_mpi's collectives
# on 1, 2, 3 and 4 processes; then the faults: a rank that never reaches a collective, and a rank
# that aborts the group, must each end the whole job, non-zero, within its 1 s deadline plus the
# launcher's teardown, with one line naming the rank (host, pid) and the collective or reason
# (for the hang: the rank that never reached it, found by asking the other ranks' watchdogs).
set -u
mpiexec="$1" bin="$2"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# shared memory and loopback only: the test stays on this machine
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
tmp="${LOOM_TEST_TMP:-/tmp}/mpi.$$"
mkdir -p "$tmp"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
for np in 1 2 3 4; do
    if timeout 120 "$mpiexec" -np $np "$bin" >"$tmp/out" 2>&1; then
        echo "ok   $np process(es): $(grep -c '^ok' "$tmp/out") ranks passed"
    else
        fail "$np processes: $(tail -5 "$tmp/out")"
    fi
done
if timeout 60 "$mpiexec" -np 2 "$bin" leave >"$tmp/out" 2>&1; then
    echo "ok   exiting with a group and devices alive: exit 0"
else
    fail "exiting with a group and devices alive: $(head -5 "$tmp/out")"
fi
for fault in hang abort; do
    t0=$(date +%s.%N)
    timeout 60 "$mpiexec" -np 3 "$bin" $fault >"$tmp/out" 2>&1
    rc=$?
    dt=$(echo "$(date +%s.%N) - $t0" | bc)
    want=$([ $fault = hang ] && echo "watchdog: waited 1.0 s in collective #1 (all-reduce).*not reached by rank 1 (at #0)" ||
        echo "rank 1 (host .*, pid [0-9]*): fault injected by test_mpi abort")
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "$want" "$tmp/out" && [ "$(echo "$dt < 20" | bc)" = 1 ]; then
        echo "ok   $fault: the job ended in ${dt%???????} s, exit $rc: $(grep -m1 "$want" "$tmp/out")"
    else
        fail "$fault: exit $rc after $dt s: $(head -5 "$tmp/out")"
    fi
done
rm -rf "$tmp"
[ "$fails" -eq 0 ]
