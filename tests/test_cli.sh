#!/usr/bin/env bash
# test_cli.sh LOOM - the command line: every bad input gets exactly one line on stderr naming what
# was wrong, a non-zero exit, and no crash; a short run writes metrics.csv and a weights file that
# a second run reads back with --init.
set -u
loom="$1"
tmp="${LOOM_TEST_TMP:-/tmp}/cli.$$"
mkdir -p "$tmp"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok   $*"; }

. "$(dirname "$0")/cli_lib.sh"

if "$loom" info >"$tmp/info" 2>&1 && grep -q "^loom [0-9]" "$tmp/info" && grep -q "^blas: OpenBLAS" "$tmp/info" &&
   grep -q "^devices: [1-9]" "$tmp/info" && grep -q "^backends: interp" "$tmp/info"; then
    echo "ok   loom info"
else
    echo "FAIL: loom info: $(cat "$tmp/info")"; fails=$((fails + 1))
fi
expect_fail "unknown command 'frob'" frob
expect_fail "expected a recipe" train
expect_fail "unknown recipe 'fmnist-foo'" train fmnist-foo
expect_fail "--epochs: expected an integer from 1 to 1099511627776, got 'abc'" train fmnist-mlp --epochs abc
expect_fail "--epochs: expected an integer from 1 to 1099511627776, got '0'" train fmnist-mlp --epochs 0
expect_fail "--batch: expected an integer from 1 to 16777216, got ''" train fmnist-mlp --batch
expect_fail "--lr: expected a number" train fmnist-mlp --lr -1
expect_fail "--momentum: expected a number from 0 to 1e+30, got 'x1'" train fmnist-mlp --momentum x1
expect_fail "--optimizer: expected sgd or adamw, got 'rmsprop'" train fmnist-mlp --optimizer rmsprop
expect_fail "unknown option '--bogus'" train fmnist-mlp --bogus
expect_fail "--beta2: expected a number < 1, got 1" train fmnist-mlp --optimizer adamw --beta2 1
expect_fail "--clip-norm: expected a number" train fmnist-mlp --clip-norm -1
expect_fail "--warmup-steps: expected an integer from 0 to 1099511627776, got 'x'" train fmnist-mlp --warmup-steps x
expect_fail "--decay-steps: expected more than --warmup-steps (10), got 5" train fmnist-mlp --warmup-steps 10 --decay-steps 5
expect_fail "unexpected argument 'extra'" train fmnist-mlp extra
expect_fail "apt-get install dataset-fashion-mnist" train fmnist-mlp --data /nonexistent
expect_fail "--init: /nonexistent.safetensors: cannot open" train fmnist-mlp --steps 1 --init /nonexistent.safetensors
expect_fail "--devices: expected an integer from 1 to 256, got 'two'" train fmnist-mlp --devices two
expect_fail "--devices: expected an integer from 1 to 256, got '0'" train fmnist-mlp --devices 0
expect_fail "--cores-per-device: expected an integer from 1 to 64, got '0'" train fmnist-mlp --cores-per-device 0
expect_fail "--cores-per-device: expected an integer from 1 to 64, got '65'" train fmnist-mlp --cores-per-device 65
expect_fail "--cores-per-device: expected an integer from 1 to 64, got 'two'" train fmnist-mlp --cores-per-device two
expect_fail "--timeout: expected a number" train fmnist-mlp --timeout -3
expect_fail "--dist: expected auto, local or mpi, got 'grpc'" train fmnist-mlp --dist grpc
printf 'garbage' >"$tmp/bad.safetensors"
expect_fail "truncated" train fmnist-mlp --steps 1 --init "$tmp/bad.safetensors"

# A short run that saves and logs; the saved file initialises another run of the same recipe and
# is refused by the other recipe with the tensor named.
if "$loom" train fmnist-mlp --steps 3 --save "$tmp/w.safetensors" --log-dir "$tmp/logs" >"$tmp/out" 2>&1 &&
   grep -q '^test accuracy: 0\.[0-9]*$' "$tmp/out" &&
   [ "$(head -1 "$tmp/logs/metrics.csv")" = "step,epoch,loss,lr,samples_per_s,test_accuracy,test_loss" ] &&
   [ "$(grep -c '^[0-9]' "$tmp/logs/metrics.csv")" -eq 4 ] &&
   "$loom" train fmnist-mlp --steps 1 --init "$tmp/w.safetensors" >/dev/null 2>&1; then
    echo "ok   save, log and init"
else
    echo "FAIL: save/log/init run:"; cat "$tmp/out"; fails=$((fails + 1))
fi
# the closing metrics describe a training step (its ~200 nodes), not the evaluation that ran last
nodes=$(sed -n 's/^metrics: graphs built.* nodes \([0-9]*\), kernels\/step \([0-9]*\).*/\1/p' "$tmp/out")
if [ -n "$nodes" ] && [ "$nodes" -gt 100 ]; then
    echo "ok   the closing metrics describe a training step ($nodes nodes)"
else
    echo "FAIL: closing metrics: $(grep '^metrics: graphs' "$tmp/out")"; fails=$((fails + 1))
fi
# A small Fashion-MNIST (the first 3000 training and 500 test samples) for the runs of whole
# epochs below: what they check does not need the whole set.
tiny="$tmp/tiny"
python3 - "${LOOM_DATA:-/usr/share/datasets/fashion-mnist}" "$tiny" <<'EOF'
import gzip, os, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
for split, n in (("train", 3000), ("t10k", 500)):
    for kind, head, size in (("images-idx3", 16, 784), ("labels-idx1", 8, 1)):
        name = f"{split}-{kind}-ubyte.gz"
        raw = gzip.open(os.path.join(src, name)).read()
        out = bytearray(raw[:head + n * size])
        out[4:8] = n.to_bytes(4, "big")
        gzip.open(os.path.join(dst, name), "wb").write(bytes(out))
EOF
# A whole epoch keeps one training program: the short last batch (3000 = 23 x 128 + 56) is
# padded to the batch's rows (padding weighs nothing), so no step builds a new one.
"$loom" train fmnist-mlp --data "$tiny" --epochs 1 >"$tmp/epoch" 2>&1
if grep -q '^test accuracy: 0\.[0-9]*$' "$tmp/epoch" && ! grep -q 'built a new program' "$tmp/epoch" &&
   grep -q '^metrics: graphs built .*, programs built 2,' "$tmp/epoch"; then
    ok "an epoch with a short last batch runs one training program"
else
    fail "the short last batch: $(grep -E 'built|programs built' "$tmp/epoch")"
fi
# Progress: on a terminal a bar redrawn in place (carriage returns, the line cleared), with the
# share of the FMA peak and the time left, cleared for the evaluation's line; through a pipe a
# plain line every 100 steps; --quiet neither; a summary at the end either way.
python3 "$(dirname "$0")/pty_run.py" "$tmp/tty" "$loom" train fmnist-mlp --batch 32 --steps 101 >/dev/null 2>&1
bars=$(tr '\r' '\n' <"$tmp/tty" | grep -c '^epoch 1/1 \[[#.]*\] [0-9]*/1875 [0-9]* samples/s .* loss [0-9.]* ETA [0-9]*:[0-9][0-9]')
if [ "$bars" -ge 2 ] && grep -q "$(printf '\033')\[K" "$tmp/tty" && grep -aq '% of peak' "$tmp/tty" &&
   tr '\r' '\n' <"$tmp/tty" | grep -aq "^$(printf '\033')\[Kepoch 1 done: " && ! grep -aq 'step 100/1875' "$tmp/tty" &&
   grep -aq '^summary: 101 steps in ' "$tmp/tty"; then
    ok "on a terminal: a progress bar redrawn $bars times, cleared for the evaluation, a summary"
else
    fail "progress bar: $(tr '\r' '\n' <"$tmp/tty" | tail -5)"
fi
"$loom" train fmnist-mlp --batch 32 --steps 101 >"$tmp/pipe" 2>&1
"$loom" train fmnist-mlp --batch 32 --steps 101 --quiet >"$tmp/quiet" 2>&1
if ! grep -q "$(printf '\r')" "$tmp/pipe" && grep -q '^epoch 1/1 step 100/1875 loss [0-9.]* [0-9]* samples/s$' "$tmp/pipe" &&
   ! grep -q 'step 100/1875' "$tmp/quiet" && ! grep -q "$(printf '\r')" "$tmp/quiet" &&
   grep -q '^summary: ' "$tmp/quiet" && grep -q '^epoch 1 done: ' "$tmp/quiet"; then
    ok "through a pipe: a plain line every 100 steps; --quiet: none"
else
    fail "plain progress: $(cat "$tmp/pipe" | head -5) / quiet: $(head -5 "$tmp/quiet")"
fi
python3 "$(dirname "$0")/pty_run.py" "$tmp/gtty" "$loom" train shakespeare-gpt --layers 1 --heads 2 --width 16 \
    --context 16 --batch 4 --steps 40 --eval-interval 20 >/dev/null 2>&1
if tr '\r' '\n' <"$tmp/gtty" | grep -aq '^step \[[#.]*\] [0-9]*/40 [0-9]* tokens/s .* ETA ' &&
   tr '\r' '\n' <"$tmp/gtty" | grep -aq "^$(printf '\033')\[Kstep 20: train loss "; then
    ok "shakespeare-gpt on a terminal: a bar of tokens a second, cleared for its evaluations"
else
    fail "GPT progress bar: $(tr '\r' '\n' <"$tmp/gtty" | tail -4)"
fi
# A weights file names its recipe: loom eval and --init need no recipe then.
if "$loom" eval --init "$tmp/w.safetensors" >"$tmp/ev" 2>&1 && grep -q '^test accuracy: 0\.' "$tmp/ev"; then
    ok "loom eval --init FILE takes the recipe the file records"
else
    fail "eval without a recipe: $(cat "$tmp/ev")"
fi
# loom plot: the log's series as polylines of one point per logged value, rendered by a real SVG
# renderer (rsvg-convert); bad logs are one line each.
"$loom" train fmnist-mlp --data "$tiny" --epochs 2 --batch 300 --log-dir "$tmp/plot" --quiet >/dev/null 2>&1
steps=$(awk -F, 'NR > 1 && $5 != ""' "$tmp/plot/metrics.csv" | wc -l)
evals=$(awk -F, 'NR > 1 && $7 != ""' "$tmp/plot/metrics.csv" | wc -l)
points() { sed -n "s/.*<polyline id='$1'[^>]* points='\([^']*\)'.*/\1/p" "$2" | tr ' ' '\n' | grep -c ,; }
if "$loom" plot "$tmp/plot" >"$tmp/plotout" 2>&1 && [ "$steps" = 20 ] && [ "$evals" = 2 ] &&
   [ "$(points train_loss "$tmp/plot/metrics.svg")" = "$steps" ] &&
   [ "$(points val_loss "$tmp/plot/metrics.svg")" = "$evals" ] &&
   [ "$(points val_accuracy "$tmp/plot/metrics.svg")" = "$evals" ] &&
   "$loom" plot "$tmp/plot" -o "$tmp/log.svg" --log-scale >/dev/null 2>&1 && grep -q 'loss (log scale)' "$tmp/log.svg" &&
   rsvg-convert "$tmp/plot/metrics.svg" -o "$tmp/plot.png" && rsvg-convert "$tmp/log.svg" -o "$tmp/log.png" &&
   [ "$(head -c 4 "$tmp/plot.png" | od -An -c | tr -d ' ')" = '211PNG' ]; then
    ok "loom plot: $(cat "$tmp/plotout"), rendered to PNG"
else
    fail "loom plot: $(cat "$tmp/plotout"); $steps steps, $evals evaluations; $(points train_loss "$tmp/plot/metrics.svg") points"
fi
expect_fail "plot: cannot read '$tmp/none/metrics.csv'" plot "$tmp/none"
mkdir -p "$tmp/badlog" && printf 'a,b\n1,2\n' >"$tmp/badlog/metrics.csv"
expect_fail "line 1: expected a metrics.csv header starting with 'step'" plot "$tmp/badlog"
printf 'step,epoch,loss\n1,1,0.5\nx,1,0.4\n' >"$tmp/badlog/metrics.csv"
expect_fail "line 3: expected a step number first" plot "$tmp/badlog"
printf 'step,epoch,loss\n1,1,0.5\n2,1,0\n' >"$tmp/badlog/metrics.csv"
expect_fail "--log-scale: the loss 0 at step 2 has no place on it" plot "$tmp/badlog" --log-scale
expect_fail "plot: expected a log directory" plot
expect_fail "tensor '0.weight' is f32 (256,784), the model expects f32 (32,1,3,3)" train fmnist-cnn --steps 1 --init "$tmp/w.safetensors"

# A device of 2 cores (they split its kernels' outputs) trains to bitwise the weights of a device
# of one.
if "$loom" train fmnist-cnn --steps 3 --devices 1 --limit-eval 64 --save "$tmp/c1.st" >/dev/null 2>&1 &&
   "$loom" train fmnist-cnn --steps 3 --devices 1 --cores-per-device 2 --limit-eval 64 --save "$tmp/c2.st" \
       >"$tmp/out" 2>&1 &&
   grep -q "on 1 device of 2 cores," "$tmp/out" && cmp -s "$tmp/c1.st" "$tmp/c2.st"; then
    echo "ok   a device of 2 cores trains the CNN to the weights of a device of 1"
else
    echo "FAIL: --cores-per-device 2: $(head -3 "$tmp/out")"; fails=$((fails + 1))
fi

# --devices auto times each split of the cores on the run's first steps, names the one it took,
# and trains as that split given by hand does, bit for bit.
if [ "$(nproc)" -ge 2 ]; then
    if "$loom" train fmnist-mlp --steps 3 --devices auto --limit-eval 64 --save "$tmp/ca.st" >"$tmp/out" 2>&1 &&
       split=$(sed -n 's/^loom: --devices auto: .*; \(--devices [0-9]* --cores-per-device [0-9]*\) repeats this run)$/\1/p' "$tmp/out") &&
       grep -q "^loom: --devices auto: .*1 device of $(nproc) cores [0-9.]* ms" "$tmp/out" &&
       # shellcheck disable=SC2086
       "$loom" train fmnist-mlp --steps 3 $split --limit-eval 64 --save "$tmp/cs.st" >/dev/null 2>&1 &&
       cmp -s "$tmp/ca.st" "$tmp/cs.st"; then
        echo "ok   --devices auto chose '$split' and trained the MLP to that split's weights"
    else
        echo "FAIL: --devices auto: $(head -3 "$tmp/out")"; fails=$((fails + 1))
    fi
fi
# a trial that fails is the run's one line, not one line per split
expect_fail "Fashion-MNIST not found in" train fmnist-mlp --devices auto --steps 2 --data "$tmp/no-such-dir"
# the default and --devices auto respect the CPU affinity; a failing device stops the run with
# one line.
if taskset -c 0 "$loom" train fmnist-mlp --steps 2 >"$tmp/out" 2>&1 && grep -q "on 1 device," "$tmp/out" &&
   taskset -c 0 "$loom" train fmnist-mlp --steps 2 --devices auto >"$tmp/out" 2>&1 &&
   grep -q "on 1 device," "$tmp/out" && ! grep -q "devices auto:" "$tmp/out"; then
    echo "ok   the default and --devices auto under taskset -c 0 use 1 device"
else
    echo "FAIL: --devices auto under taskset: $(head -3 "$tmp/out")"; fails=$((fails + 1))
fi
LOOM_FAULT=1:2 expect_fail "device 1, step 2: fault injected by LOOM_FAULT=1:2" train fmnist-mlp --devices 2 --steps 5 --timeout 5
LOOM_FAULT=0:2:hang expect_fail "watchdog" train fmnist-mlp --devices 2 --steps 5 --timeout 0.5

# LOOM_METRICS=1 reports the program cache when a graph is freed.
if LOOM_METRICS=1 "$loom" eval fmnist-mlp --init "$tmp/w.safetensors" 2>"$tmp/err" >/dev/null &&
   grep -q "metrics: graphs built 40, programs built 1, cache hits 39" "$tmp/err"; then
    echo "ok   LOOM_METRICS=1"
else
    echo "FAIL: LOOM_METRICS=1: $(cat "$tmp/err")"; fails=$((fails + 1))
fi

# LOOM_PROFILE=1 prints each program's kernels, slowest first, with shares that add up to 100%
# (within their rounding to 0.1% each), and each kernel's median time, the header their sum.
LOOM_PROFILE=1 "$loom" train fmnist-mlp --steps 3 --devices 2 2>"$tmp/err" >/dev/null
rc=$? why=""
[ $rc -eq 0 ] || why="loom exited $rc"
[ -n "$why" ] ||
    grep -q "^profile: program [0-9a-f]*, 6 runs (all devices), .* (kernels' medians over the last 256 runs: [0-9.]* ms)" "$tmp/err" ||
    why="no header for the step's program of 6 runs"
[ -n "$why" ] || grep "^profile: .*% .* ms (median [0-9.]*) .* MATMUL (" "$tmp/err" | head -1 | grep -q "node" ||
    why="the first product's line names no node"
[ -n "$why" ] ||
    awk 'function off() { return m <= 0 || (m - med) ^ 2 > (0.0005 * (k + 1) + 1e-9) ^ 2 } # each
         # median and the header printed rounded to 0.001 ms
         /^profile: program/ { if (n++ && off()) bad = 1; m = k = 0; med = $(NF - 1) + 0 }
         /^profile: +[0-9.]+%/ { sub(/.*\(median /, ""); m += $1; k++ }
         END { exit bad || off() }' "$tmp/err" ||
    why="a program's kernels' medians do not add up to its header's"
[ -n "$why" ] ||
    awk 'function off() { return (s - 100) ^ 2 > (0.05 * k + 0.1) ^ 2 } # each share rounded
         /^profile: program/ { if (n++ && off()) bad = 1; s = k = 0 }
         /^profile: +[0-9.]+%/ { s += $2; k++ } END { exit bad || off() }' "$tmp/err" ||
    why="a program's shares do not add up to 100%"
if [ -z "$why" ]; then
    echo "ok   LOOM_PROFILE=1"
else
    echo "FAIL: LOOM_PROFILE=1: $why; its stderr:"; cat "$tmp/err"; fails=$((fails + 1))
fi

# LOOM_CHECK=1 runs every kernel of a small GPT (on 2 devices, a 4000-character text: a short
# validation split) and, but in the sanitizer builds (LOOM_TEST_QUICK: the reference interpreter
# is slow there), of the CNN (its evaluation on 256 test images) beside the reference interpreter:
# each program says how many values agreed, and the runs end as without the check; `loom info`
# names the executor.
gzip -dc "$(dirname "$0")/../data/tinyshakespeare.txt.gz" | head -c 4000 >"$tmp/small.txt"
agreed="^executor check: program [0-9a-f]*: [1-9][0-9]* values its kernels made in 4 runs agreed with the reference interpreter's"
if LOOM_CHECK=1 "$loom" info | grep -q "^executor: check" && "$loom" info | grep -q "^executor: cpu" &&
   LOOM_CHECK=1 "$loom" train shakespeare-gpt --data "$tmp/small.txt" --steps 2 --layers 2 --width 32 --heads 2 \
       --context 16 --batch 4 --eval-interval 1 --devices 2 2>"$tmp/err" >/dev/null &&
   grep -q "$agreed" "$tmp/err" &&
   { [ -n "${LOOM_TEST_QUICK:-}" ] ||
     { LOOM_CHECK=1 "$loom" train fmnist-cnn --steps 2 --devices 2 --limit-eval 256 2>"$tmp/err2" \
           >/dev/null &&
       grep -q "$agreed" "$tmp/err2"; }; }; then
    echo "ok   LOOM_CHECK=1"
else
    echo "FAIL: LOOM_CHECK=1: $(grep -v '^metrics' "$tmp/err" "$tmp/err2" 2>/dev/null | head -5)"; fails=$((fails + 1))
fi

rm -rf "$tmp"
[ "$fails" -eq 0 ] || { echo "$fails failed"; exit 1; }
