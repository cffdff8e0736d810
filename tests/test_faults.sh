#!/usr/bin/env bash
# test_faults.sh LOOM - hostile files and faults through the command, as a user meets them: each
# gets one clear line and a non-zero exit, never a crash, a hang or a lost or damaged file.
#   --init on a 10 GB sparse file, a FIFO and a directory: refused at once, nothing read whole;
#   --save: a directory or a path that cannot be written fails before any training; stale
#     temporary files of a killed writer of the same path are removed by the next save;
#   a diverging run (--lr 1e6) stops at the step whose loss is not finite, naming the step and
#     the device, and saves nothing;
#   --seed -1: one line about --seed;
#   SIGTERM and SIGINT mid-training: one line, exit 143 / 130, metrics.csv of whole rows ending
#     with the last step that ended.
set -u
loom="$1"
tmp="${LOOM_TEST_TMP:-/tmp}/faults.$$"
rm -rf "$tmp"; mkdir -p "$tmp"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect_fail SECONDS "expected text" args...: within SECONDS, a non-zero exit below 128 and one
# stderr line holding the text.
expect_fail() {
    local limit="$1" want="$2"; shift 2
    local t0; t0=$(date +%s.%N)
    timeout "$limit" "$loom" "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$? lines; lines=$(wc -l <"$tmp/err")
    local dt; dt=$(echo "$(date +%s.%N) - $t0" | bc)
    if [ "$rc" -eq 124 ]; then
        fail "loom $* did not end within $limit s"
    elif [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ] || [ "$lines" -ne 1 ] || ! grep -qF -- "$want" "$tmp/err"; then
        fail "loom $* -> exit $rc, $lines stderr lines: $(cat "$tmp/err")"
    else
        echo "ok   loom $* -> $(cat "$tmp/err") (${dt%???????} s)"
    fi
}

truncate -s 10G "$tmp/sparse.safetensors"
expect_fail 10 "--init: $tmp/sparse.safetensors: malformed safetensors header" \
    train fmnist-mlp --steps 1 --init "$tmp/sparse.safetensors"
mkfifo "$tmp/fifo.safetensors"
expect_fail 10 "is a FIFO, expected a regular file" train fmnist-mlp --steps 1 --init "$tmp/fifo.safetensors"
mkdir "$tmp/dir.safetensors"
expect_fail 10 "is a directory, expected a regular file" train fmnist-mlp --steps 1 --init "$tmp/dir.safetensors"

# output paths are checked before training: no step runs (nothing on stdout)
expect_fail 10 "--save: cannot write '/nonexistent/x'" train fmnist-mlp --save /nonexistent/x
[ -s "$tmp/out" ] && fail "--save /nonexistent/x trained first: $(head -2 "$tmp/out")"
expect_fail 10 "--save: '$tmp/dir.safetensors' is a directory" train fmnist-mlp --save "$tmp/dir.safetensors"
expect_fail 10 "--log-dir: cannot" train fmnist-mlp --log-dir /nonexistent/logs
[ -s "$tmp/out" ] && fail "--log-dir /nonexistent/logs trained first"

expect_fail 10 "--seed: expected an integer from 0 to 9223372036854775807, got '-1'" train fmnist-mlp --seed -1

# a diverging run stops and saves nothing
expect_fail 60 "the loss is NaN on device" train fmnist-mlp --lr 1e6 --devices 2 --save "$tmp/nan.safetensors"
grep -q "^loom: step [0-9]*: the loss is NaN on device [01]" "$tmp/err" || fail "no step named: $(cat "$tmp/err")"
[ -e "$tmp/nan.safetensors" ] && fail "a diverged run saved $tmp/nan.safetensors"

# a killed writer's temporary files go with the next save of that path (a live writer's stay)
sh -c 'exit 0' & dead=$!
wait $dead
head -c 1000000 /dev/zero >"$tmp/w.safetensors.tmp.$dead"
head -c 10 /dev/zero >"$tmp/w.safetensors.tmp.$$"
if "$loom" train fmnist-mlp --steps 2 --save "$tmp/w.safetensors" >"$tmp/out" 2>&1 &&
   [ -s "$tmp/w.safetensors" ] && [ ! -e "$tmp/w.safetensors.tmp.$dead" ] && [ -e "$tmp/w.safetensors.tmp.$$" ]; then
    echo "ok   a save removes the temporary file of a killed writer (pid $dead), keeps a live one's"
else
    fail "stale temporary files: $(ls "$tmp" | grep tmp); $(tail -2 "$tmp/out")"
fi

# SIGTERM and SIGINT mid-training: the step running ends, files stay whole, one line, 128 + signal
for sig in TERM INT; do
    want=$([ $sig = TERM ] && echo 143 || echo 130)
    rm -rf "$tmp/logs"
    "$loom" train fmnist-cnn --epochs 3 --devices 2 --log-dir "$tmp/logs" --save "$tmp/sig.safetensors" \
        >"$tmp/out" 2>"$tmp/err" &
    pid=$!
    for _ in $(seq 300); do # until a few steps have been logged
        rows=$(grep -c '^[0-9]' "$tmp/logs/metrics.csv" 2>/dev/null || true)
        [ "${rows:-0}" -ge 3 ] && break
        sleep 0.1
    done
    kill -$sig $pid
    wait $pid
    rc=$?
    last=$(tail -n 1 "$tmp/logs/metrics.csv")
    if [ "$rc" -eq "$want" ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] &&
       grep -q "^loom: stopped by SIG$sig after step [0-9]*: metrics.csv ends with that step" "$tmp/err" &&
       [ -z "$(tail -c 1 "$tmp/logs/metrics.csv")" ] &&
       ! awk -F, 'NR > 1 && NF != 7 {bad = 1} END {exit !bad}' "$tmp/logs/metrics.csv" &&
       [ "${last%%,*}" = "$(sed -n 's/.*after step \([0-9]*\):.*/\1/p' "$tmp/err")" ] &&
       [ ! -e "$tmp/sig.safetensors" ]; then
        echo "ok   SIG$sig: exit $rc, $(cat "$tmp/err"); metrics.csv ends '$last'"
    else
        fail "SIG$sig: exit $rc (want $want), stderr: $(cat "$tmp/err"); metrics.csv ends '$last'"
    fi
done

rm -rf "$tmp"
[ "$fails" -eq 0 ]
