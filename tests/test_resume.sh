#!/usr/bin/env bash
# test_resume.sh LOOM [MPIRUN] - runs killed and resumed through the command line: a run killed
# (SIGKILL) at a random step, stopped by SIGTERM, or killed halfway through writing a checkpoint
# (LOOM_FAULT_WRITE) is resumed from its checkpoint directory and must end with bitwise the
# parameters of the same run never interrupted: Fashion-MNIST's MLP (AdamW, across an epoch's
# end) and CNN (SGD with momentum), shakespeare-gpt with and without dropout, and under
# `mpirun -np 2`; on another device count, within float rounding. Then checkpoints that are cut
# short, corrupt, of another model or of other options, an empty or missing directory, and a full
# disk: one line each, nothing lost.
set -u
loom="$1"
mpirun="${2:-}"
tmp="${LOOM_TEST_TMP:-/tmp}/resume.$$"
rm -rf "$tmp" && mkdir -p "$tmp"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok   $*"; }
here="$(dirname "$0")"
. "$here/cli_lib.sh"
equal() { python3 "$here/st_equal.py" "$@"; }

text="$tmp/text.txt"
gzip -dc "$here/../data/tinyshakespeare.txt.gz" | head -c 200000 >"$text"

# The newest step the index of checkpoint directory $1 lists (0: none).
newest() { awk -F'\t' '/^step-/ { s = $2 } END { print s + 0 }' "$1/index.tsv" 2>/dev/null || echo 0; }

# kill_at SIGNAL STEP DIR cmd...: runs `loom cmd...` in the background and sends SIGNAL once
# DIR's index lists a checkpoint of STEP or later (and a random few milliseconds more, so that
# the signal lands anywhere in the steps that follow); the exit code into $rc.
kill_at() {
    local sig="$1" at="$2" dir="$3"; shift 3
    "$loom" "$@" >"$tmp/out" 2>"$tmp/err" &
    local pid=$! n=0
    while [ "$(newest "$dir")" -lt "$at" ] && kill -0 "$pid" 2>/dev/null && [ $n -lt 3000 ]; do
        sleep 0.01; n=$((n + 1))
    done
    sleep "0.0$((RANDOM % 10))"
    kill "-$sig" "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null; rc=$?
}

# resume_case NAME SIGNAL EVERY "ARGS": the uninterrupted run of ARGS against one sent SIGNAL at a
# random step past the first checkpoint and resumed (twice if need be) from its directory.
resume_case() {
    local name="$1" sig="$2" every="$3" args="$4" d="$tmp/$1.ck"
    # shellcheck disable=SC2086
    "$loom" $args --save "$tmp/$name.ref" >/dev/null 2>&1 || { fail "$name: the reference run"; return; }
    local at=$((every + RANDOM % (2 * every)))
    # shellcheck disable=SC2086
    kill_at "$sig" "$at" "$d" $args --checkpoint-dir "$d" --checkpoint-every "$every"
    local want=$((sig == 9 ? 137 : 143)) killed_at; killed_at=$(newest "$d")
    if [ "$rc" -ne "$want" ]; then
        fail "$name: the run killed by signal $sig exited $rc, expected $want: $(tail -2 "$tmp/err")"; return
    fi
    if [ "$sig" = 15 ]; then
        grep -q "stopped by SIGTERM after step [0-9]*: checkpoint .* written; continue with --resume $d" "$tmp/err" ||
            { fail "$name: SIGTERM's line: $(cat "$tmp/err")"; return; }
    fi
    # shellcheck disable=SC2086
    if ! "$loom" $args --checkpoint-dir "$d" --checkpoint-every "$every" --resume "$d" \
        --save "$tmp/$name.res" >"$tmp/out" 2>"$tmp/err"; then
        fail "$name: the resumed run: $(cat "$tmp/err")"; return
    fi
    local from; from=$(sed -n 's/^loom: resuming from .*: step \([0-9]*\).*/\1/p' "$tmp/out")
    if out=$(equal "$tmp/$name.ref" "$tmp/$name.res"); then
        ok "$name: signal $sig near step $killed_at, resumed from step $from: $out"
    else
        fail "$name: resumed from step $from: $out"
    fi
}

mlp="train fmnist-mlp --epochs 2 --batch 1000 --optimizer adamw --seed 3 --limit-eval 1000"
resume_case mlp-kill 9 7 "$mlp"
resume_case cnn-kill 9 4 "train fmnist-cnn --steps 24 --batch 128 --seed 5 --limit-eval 500"
gpt="train shakespeare-gpt --data $text --layers 2 --heads 2 --width 32 --context 32 --batch 8 --steps 60 --eval-interval 25"
resume_case gpt-kill 9 5 "$gpt"
resume_case gpt-dropout-kill 9 5 "$gpt --dropout 0.2"
resume_case gpt-dropout-term 15 5 "$gpt --dropout 0.2 --seed 9"
resume_case mlp-term 15 7 "$mlp"

# Gradient accumulation: 4 micro-batches of 128 on one device are bitwise 4 devices' batch of
# 512 (the same sums), within float rounding of 2 devices' batch of 512 over 30 steps, with the
# gradients all-reduced once a step (the same bytes as without accumulation); killed and
# resumed, bitwise.
acc="train fmnist-mlp --steps 30 --quiet"
# shellcheck disable=SC2086
"$loom" $acc --batch 128 --accumulate 4 --devices 1 --save "$tmp/acc4.st" >/dev/null 2>&1
# shellcheck disable=SC2086
"$loom" $acc --batch 512 --devices 4 --save "$tmp/dev4.st" >/dev/null 2>&1
# shellcheck disable=SC2086
"$loom" $acc --batch 512 --devices 2 --save "$tmp/b512.st" >"$tmp/b512.out" 2>&1
# shellcheck disable=SC2086
"$loom" $acc --batch 128 --accumulate 4 --devices 2 --save "$tmp/acc4d2.st" >"$tmp/acc4.out" 2>&1
bytes() { sed -n 's/.*all-reduced \([0-9.]* MiB\).*/\1/p' "$1"; }
if out1=$(equal "$tmp/dev4.st" "$tmp/acc4.st") && out2=$(equal "$tmp/b512.st" "$tmp/acc4d2.st" 1e-6) &&
   [ -n "$(bytes "$tmp/b512.out")" ] && [ "$(bytes "$tmp/b512.out")" = "$(bytes "$tmp/acc4.out")" ]; then
    ok "--accumulate 4 x 128: as 4 devices' 512 ($out1), as 512 on 2 devices ($out2), all-reduced $(bytes "$tmp/acc4.out") either way"
else
    fail "--accumulate: ${out1:-} ${out2:-}; all-reduced $(bytes "$tmp/b512.out") vs $(bytes "$tmp/acc4.out")"
fi
resume_case accumulate-kill 9 5 "train fmnist-mlp --batch 250 --accumulate 4 --steps 45 --optimizer adamw"
resume_case gpt-accumulate-kill 9 5 "$gpt --accumulate 2 --dropout 0.1"

# Killed halfway through its third file (step 7's checkpoint, the index, step 14's checkpoint):
# the index still names step 7, whole, and the resumed run ends as the uninterrupted one.
d="$tmp/fault.ck"
# shellcheck disable=SC2086
LOOM_FAULT_WRITE=3 "$loom" $mlp --checkpoint-dir "$d" --checkpoint-every 7 >/dev/null 2>&1
rc=$?
tmps=$(ls "$d" | grep -c '\.tmp\.')
# shellcheck disable=SC2086
if [ "$rc" = 137 ] && [ "$(newest "$d")" = 7 ] && [ "$tmps" = 1 ] &&
   "$loom" $mlp --checkpoint-dir "$d" --checkpoint-every 7 --resume "$d" --save "$tmp/fault.res" >/dev/null 2>"$tmp/err" &&
   out=$(equal "$tmp/mlp-kill.ref" "$tmp/fault.res") && [ "$(ls "$d" | grep -c '\.tmp\.')" = 0 ]; then
    ok "killed while writing step 14's checkpoint: step 7's and the index intact, resumed: $out"
else
    fail "killed mid-write: exit $rc, newest $(newest "$d"), $tmps temporaries, $(cat "$tmp/err") ${out:-}"
fi

# The same run resumed on one device instead of two (its steps 15 to 28): the same samples in
# each step, summed in another order: within float rounding of the two-device run's step 28,
# normwise (measured: 3.5e-6 with OpenBLAS on an AVX2 CPU, where one step moves each tensor by
# 7e-3 to 2e-2). Elementwise it is not rounding: AdamW moves an element whose gradient is rounding
# noise (its terms cancel) by up to a share of lr whichever way the noise falls, and one such
# element took 0.weight's largest difference from 2.4e-7 of its largest magnitude to 3.4e-5 in
# one step here.
# shellcheck disable=SC2086
if "$loom" $mlp --devices 1 --steps 28 --resume "$tmp/mlp-kill.ck/step-000014.safetensors" \
    --save "$tmp/one.res" >/dev/null 2>"$tmp/err" &&
   out=$(equal "$tmp/one.res" "$tmp/mlp-kill.ck/step-000028.safetensors" 1e-5 norm); then
    ok "resumed on 1 device instead of 2: $out"
else
    fail "resumed on 1 device: $(cat "$tmp/err") ${out:-}"
fi

# Under mpirun: a run resumed from a checkpoint of the middle of the reference run; and two
# processes of one device each sent SIGTERM (as a scheduler's preemption sends it to each of a
# job's processes), which stop together, and resumed.
if [ -n "$mpirun" ] && [ -x "$mpirun" ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    m="$tmp/mpi.ck"
    mp="-np 2 $loom train fmnist-mlp --devices 1 --batch 500 --optimizer adamw"
    # shellcheck disable=SC2086
    if "$mpirun" $mp --steps 40 --checkpoint-dir "$m" --checkpoint-every 10 --save "$tmp/mpi.ref" >/dev/null 2>"$tmp/err" &&
       "$mpirun" $mp --steps 40 --resume "$m/step-000020.safetensors" --save "$tmp/mpi.res" >/dev/null 2>>"$tmp/err" &&
       out=$(equal "$tmp/mpi.ref" "$tmp/mpi.res"); then
        ok "mpirun -np 2: resumed from step 20: $out"
    else
        fail "mpirun -np 2 resume: $(cat "$tmp/err") ${out:-}"
    fi
    rm -rf "$m"
    out=""
    # shellcheck disable=SC2086
    mp="$mp --epochs 3"
    "$mpirun" $mp --checkpoint-dir "$m" --checkpoint-every 10 >"$tmp/out" 2>"$tmp/err" &
    pid=$!
    n=0
    while [ "$(newest "$m")" -lt 20 ] && [ $n -lt 3000 ]; do sleep 0.01; n=$((n + 1)); done
    pkill -TERM -P $pid; wait $pid; rc=$?
    # shellcheck disable=SC2086
    if [ "$(newest "$m")" -ge 20 ] && grep -q "stopped by SIGTERM" "$tmp/err" &&
       "$mpirun" $mp --resume "$m" --save "$tmp/mpi-term.res" >/dev/null 2>"$tmp/err2" &&
       "$mpirun" $mp --save "$tmp/mpi-term.ref" >/dev/null 2>>"$tmp/err2" &&
       out=$(equal "$tmp/mpi-term.ref" "$tmp/mpi-term.res"); then
        ok "mpirun -np 2: stopped by SIGTERM (exit $rc) near step $(newest "$m"), resumed: $out"
    else
        fail "mpirun SIGTERM: exit $rc, $(cat "$tmp/err" "$tmp/err2" 2>/dev/null | tail -3) ${out:-}"
    fi
else
    echo "skip mpirun: no MPI launcher given"
fi

# Bad checkpoints and options: one line each, nothing written.
ck="$tmp/mlp-kill.ck/step-000007.safetensors"
head -c 100000 "$ck" >"$tmp/cut.st"
expect_fail "has data_offsets [0, 802816] outside the" $mlp --resume "$tmp/cut.st"
cp "$ck" "$tmp/flip.st"
printf '\x55' | dd of="$tmp/flip.st" bs=1 seek=500000 conv=notrunc status=none
expect_fail "fails its checksum: the file is corrupt" $mlp --resume "$tmp/flip.st"
expect_fail "is missing (the model needs it)" $mlp --resume "$tmp/gpt-kill.ck"
expect_fail "not a checkpoint (no optimizer state in its metadata)" $mlp --resume "$tmp/mlp-kill.ref"
mkdir -p "$tmp/empty"
expect_fail "no checkpoint to resume from" $mlp --resume "$tmp/empty"
expect_fail "no such checkpoint file or directory" $mlp --resume "$tmp/none"
expect_fail "is a run with --batch 1000, this one has 500" train fmnist-mlp --epochs 2 --batch 500 --optimizer adamw --seed 3 --resume "$ck"
expect_fail "is a run with --seed 3, this one has 4" train fmnist-mlp --epochs 2 --batch 1000 --optimizer adamw --seed 4 --resume "$ck"
expect_fail "is a run with --dropout 0, this one has 0.1" $gpt --dropout 0.1 --resume "$tmp/gpt-kill.ck"
expect_fail "drop --init" $mlp --resume "$ck" --init "$ck"
expect_fail "--keep: expected --checkpoint-dir DIR as well" $mlp --keep 2
expect_fail "--monitor: expected val_loss or val_acc, got 'loss'" $mlp --checkpoint-dir "$tmp/x" --monitor loss
expect_fail "--monitor: shakespeare-gpt's evaluation measures val_loss only" $gpt --checkpoint-dir "$tmp/x" --monitor val_acc
[ ! -e "$tmp/x" ] || fail "a refused run made its checkpoint directory"

# A directory whose newest checkpoint is corrupt: the one before it, with a warning.
cp -r "$tmp/mlp-kill.ck" "$tmp/fallback.ck"
last=$(newest "$tmp/fallback.ck")
before=$(grep '^step-' "$tmp/fallback.ck/index.tsv" | tail -2 | head -1 | cut -f2)
printf 'garbage' | dd of="$tmp/fallback.ck/$(printf 'step-%06d.safetensors' "$last")" bs=1 seek=300000 conv=notrunc status=none
# shellcheck disable=SC2086
if "$loom" $mlp --steps 30 --resume "$tmp/fallback.ck" >"$tmp/out" 2>"$tmp/err" &&
   grep -q "skipping a checkpoint that cannot be read: .*fails its checksum" "$tmp/err" &&
   grep -q "^loom: resuming from .*: step $before," "$tmp/out"; then
    ok "a corrupt newest checkpoint (step $last) is skipped: resumed from step $before"
else
    fail "fallback past a corrupt checkpoint: $(cat "$tmp/err")"
fi

# --keep 2: the index lists the newest two (and the best), and the directory holds just those.
d="$tmp/keep.ck"
# shellcheck disable=SC2086
"$loom" $gpt --steps 50 --eval-interval 10 --checkpoint-dir "$d" --keep 2 >/dev/null 2>&1
listed=$(grep -c '^step-' "$d/index.tsv" 2>/dev/null)
files=$(ls "$d" | grep -c '^step-')
if [ "$listed" -ge 2 ] && [ "$listed" -le 3 ] && [ "$files" = "$listed" ] &&
   grep -q '^step-000050.safetensors' "$d/index.tsv" && grep -q '^step-000040.safetensors' "$d/index.tsv"; then
    ok "--keep 2: $files checkpoints kept, as the index lists"
else
    fail "--keep 2: index lists $listed, directory holds $files: $(cat "$d/index.tsv")"
fi
# A checkpoint's weights start another run (--init) and are evaluated (loom eval).
if "$loom" eval fmnist-mlp --init "$ck" >"$tmp/out" 2>&1 && grep -q '^test accuracy: 0\.' "$tmp/out"; then
    ok "a checkpoint's weights evaluated by loom eval"
else
    fail "loom eval of a checkpoint: $(cat "$tmp/out")"
fi

# A GPT's weights carry its shape: loom eval and loom sample take it from the file; a shape
# option given that differs is refused naming both.
g="$tmp/gpt-kill.ref"
if "$loom" eval shakespeare-gpt --data "$text" --init "$g" >"$tmp/out" 2>&1 && grep -q '^val loss: [0-9.]*$' "$tmp/out" &&
   "$loom" sample shakespeare-gpt --data "$text" --init "$g" --tokens 5 >"$tmp/out" 2>&1; then
    ok "loom eval and sample take the model's shape from the weights file"
else
    fail "shape from the weights file: $(cat "$tmp/out")"
fi
expect_fail "--width: 64 here, but $g was trained with --width 32" eval shakespeare-gpt --data "$text" --init "$g" --width 64

# A full disk while checkpointing: the run ends with one line, the previous checkpoint whole
# and resumable, no temporary left (a 5 MiB tmpfs: one 3.2 MB checkpoint fits, not two).
full="$tmp/full"
mkdir -p "$full"
if mount -t tmpfs -o size=5m tmpfs "$full" 2>/dev/null; then
    trap 'umount "$full" 2>/dev/null' EXIT
    # shellcheck disable=SC2086
    "$loom" $mlp --checkpoint-dir "$full/ck" --checkpoint-every 7 >"$tmp/out" 2>"$tmp/err"
    rc=$?
    # shellcheck disable=SC2086
    if [ "$rc" = 1 ] && [ "$(wc -l <"$tmp/err")" = 1 ] &&
       grep -q "checkpoint after step 14: .*No space left on device" "$tmp/err" &&
       [ "$(newest "$full/ck")" = 7 ] && [ "$(ls "$full/ck" | grep -c '\.tmp\.')" = 0 ] &&
       "$loom" $mlp --resume "$full/ck" --save "$tmp/full.res" >/dev/null 2>&1 &&
       out=$(equal "$tmp/mlp-kill.ref" "$tmp/full.res"); then
        ok "a full disk at step 14's checkpoint: $(cat "$tmp/err"); step 7's resumed: $out"
    else
        fail "full disk: exit $rc, $(cat "$tmp/err"), newest $(newest "$full/ck"), $(ls "$full/ck")"
    fi
    umount "$full"
else
    fail "cannot mount a tmpfs to fill (run as root)"
fi

rm -rf "$tmp"
[ "$fails" -eq 0 ] && echo "all resume cases passed" || echo "$fails failed"
[ "$fails" -eq 0 ]
