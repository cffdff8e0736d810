#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS] [TARGET...] - a fuzzing campaign: builds the libFuzzer targets
# (tests/fuzz, ASan+UBSan, clang) and runs each TARGET (default: all) for SECONDS (default 600)
# on every core (-fork), starting from its committed corpus. New inputs that add coverage are
# merged into tests/fuzz/corpus/<target> (commit them); a crash is kept there as
# regression-<hash> and reported, and the script exits non-zero. Prints each target's executions.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(safetensors idx kernel_cache args gpt_args text)
build=${FUZZ_BUILD:-build-fuzz}
cmake -S . -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DLOOM_SANITIZE=address -DLOOM_FUZZ=ON >/dev/null
cmake --build "$build" >/dev/null
jobs=$(nproc)
status=0
for t in "${targets[@]}"; do
    corpus=tests/fuzz/corpus/$t
    work=$(mktemp -d)
    log=$work/log
    tmpdir=$( [ -d /dev/shm ] && mktemp -d /dev/shm/loom-fuzz.XXXXXX || mktemp -d) # inputs go to files
    set +e
    TMPDIR=$tmpdir XDG_CACHE_HOME=$work/cache "$build/tests/fuzz/fuzz_$t" -fork="$jobs" -ignore_crashes=1 -max_total_time="$seconds" \
        -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$work/" "$work" "$corpus" >"$log" 2>&1
    set -e
    runs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#' || true)
    rate=$((${runs:-0} / seconds))
    crashes=$(ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* 2>/dev/null | wc -l || true)
    for c in "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-*; do
        [ -e "$c" ] && cp "$c" "$corpus/regression-$(sha1sum "$c" | cut -c1-16)"
    done
    # keep what adds coverage (merged: the corpus stays small)
    TMPDIR=$tmpdir "$build/tests/fuzz/fuzz_$t" -merge=1 "$corpus" "$work" >/dev/null 2>&1 || true
    echo "$t: ${runs:-0} executions in $seconds s (${rate:-?} a second), $crashes crash(es); corpus $(ls "$corpus" | wc -l) inputs"
    [ "$crashes" -eq 0 ] || { status=1; grep -m3 "ERROR\|SUMMARY" "$log" || true; }
    rm -rf "$work" "$tmpdir"
done
exit $status
