#!/usr/bin/env bash
# test_gpt_cli.sh LOOM - `loom train shakespeare-gpt` and `loom sample shakespeare-gpt` as a user
# runs them, on a small model: training prints the train and validation loss at each evaluation
# and the final validation loss on a line of its own, saves weights (nanoGPT's names, lm_head
# tied) that --init reads back; 2 devices give the 1-device run's losses; sampling is the same
# text for the same seed and starts with --start. Every bad input is one line and a non-zero
# exit: an empty file, one distinct character, bytes that are not UTF-8, a context longer than
# the split, weights of another shape (naming the tensor), characters of --start outside the
# vocabulary, a dropout of 1.
set -u
loom="$1"
tmp="${LOOM_TEST_TMP:-/tmp}/gptcli.$$"
mkdir -p "$tmp"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

. "$(dirname "$0")/cli_lib.sh"

small="--layers 1 --heads 2 --width 16 --context 16 --batch 8 --steps 30 --eval-interval 15 --warmup-steps 5"
text="$tmp/text.txt"
gzip -dc "$(dirname "$0")/../data/tinyshakespeare.txt.gz" | head -c 200000 >"$text"

for dev in 1 2 1x2; do # 1x2: a device of 2 cores
    opts="--devices $dev"
    [ "$dev" = 1x2 ] && opts="--devices 1 --cores-per-device 2"
    if "$loom" train shakespeare-gpt --data "$text" $small $opts --save "$tmp/w$dev.st" \
        >"$tmp/train$dev.out" 2>"$tmp/train$dev.err"; then
        echo "ok   train on $dev device(s): $(grep '^val loss' "$tmp/train$dev.out")"
    else
        fail "train on $dev device(s): $(cat "$tmp/train$dev.err")"
    fi
done
# the cores of a device split its kernels' outputs: the weights of a device of one core
grep -q "1 device(s) of 2 cores" "$tmp/train1x2.out" || fail "no '1 device(s) of 2 cores' banner"
if cmp -s "$tmp/w1.st" "$tmp/w1x2.st"; then
    echo "ok   1 device of 2 cores gives 1 device's weights"
else
    fail "1 device of 2 cores differs from 1 device of 1 core"
fi
# --devices auto times each split on the first steps, says which it took, and trains as that
# split given by hand does, bit for bit
if "$loom" train shakespeare-gpt --data "$text" $small --devices auto --save "$tmp/wauto.st" \
    >"$tmp/auto.out" 2>"$tmp/auto.err"; then
    split=$(sed -n 's/^loom: --devices auto: .*; \(--devices [0-9]* --cores-per-device [0-9]*\) repeats this run)$/\1/p' "$tmp/auto.out")
    # shellcheck disable=SC2086
    if [ "$(nproc)" -lt 2 ]; then
        echo "skip --devices auto: one CPU, nothing to choose"
    elif [ -z "$split" ]; then
        fail "--devices auto: no choice line: $(head -3 "$tmp/auto.out")"
    elif "$loom" train shakespeare-gpt --data "$text" $small $split --save "$tmp/wsplit.st" >/dev/null 2>&1 &&
        cmp -s "$tmp/wauto.st" "$tmp/wsplit.st"; then
        echo "ok   --devices auto chose '$split' and trained to that split's weights"
    else
        fail "--devices auto ($split) differs from the split given by hand"
    fi
else
    fail "--devices auto: $(cat "$tmp/auto.err")"
fi
grep -q '^step 15: train loss [0-9.]*, val loss [0-9.]*' "$tmp/train1.out" ||
    fail "no evaluation line at step 15: $(cat "$tmp/train1.out")"
grep -q '^val loss: [0-9]\.[0-9]\{4\}$' "$tmp/train1.out" || fail "no final 'val loss: X' line"
v1=$(sed -n 's/^val loss: //p' "$tmp/train1.out") v2=$(sed -n 's/^val loss: //p' "$tmp/train2.out")
first=$(sed -n 's/^step 15: train loss \([0-9.]*\).*/\1/p' "$tmp/train1.out")
if [ -n "$v1" ] && [ "$v1" = "$v2" ] && [ "$(echo "$v1 < $first" | bc)" = 1 ]; then
    echo "ok   2 devices give 1 device's validation loss ($v1), below the training loss at step 15 ($first)"
else
    fail "validation loss on 1 device $v1, on 2 $v2 (train loss at step 15: $first)"
fi
python3 - "$tmp/w1.st" <<'EOF' || fail "the weights file does not hold nanoGPT's names"
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
need = ["transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight",
        "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_proj.weight",
        "transformer.h.0.ln_2.weight", "transformer.h.0.mlp.c_fc.weight",
        "transformer.h.0.mlp.c_proj.weight", "transformer.ln_f.weight", "lm_head.weight"]
missing = [k for k in need if k not in h]
assert not missing, missing
assert h["lm_head.weight"]["shape"] == h["transformer.wte.weight"]["shape"]
print("ok   the weights hold nanoGPT's names, lm_head.weight tied:", h["transformer.wte.weight"]["shape"])
EOF

sample() { "$loom" sample shakespeare-gpt --data "$text" --layers 1 --heads 2 --width 16 --context 16 \
    --init "$tmp/w1.st" --tokens 80 "$@"; }
if sample --seed 1 >"$tmp/s1" 2>"$tmp/serr" && sample --seed 1 >"$tmp/s1b" 2>>"$tmp/serr" &&
    sample --seed 2 >"$tmp/s2" 2>>"$tmp/serr" && sample --seed 1 --start "ROMEO:" >"$tmp/s3" 2>>"$tmp/serr"; then
    if cmp -s "$tmp/s1" "$tmp/s1b" && ! cmp -s "$tmp/s1" "$tmp/s2" && head -c 6 "$tmp/s3" | grep -q '^ROMEO:'; then
        echo "ok   sample: the same seed the same text, another seed another, --start first"
    else
        fail "sample: $(head -c 200 "$tmp/s1") / $(head -c 200 "$tmp/s2") / $(head -c 200 "$tmp/s3")"
    fi
else
    fail "sample: $(cat "$tmp/serr")"
fi

: >"$tmp/empty.txt"
printf 'aaaaaaaaaaaaaaaaaaaa' >"$tmp/one.txt"
printf 'ab\xff\xfecd' >"$tmp/bad.txt"
expect_fail "empty: expected text to train on" train shakespeare-gpt --data "$tmp/empty.txt"
expect_fail "one distinct character in 20" train shakespeare-gpt --data "$tmp/one.txt"
expect_fail "byte 2 (0xff) is not UTF-8 text" train shakespeare-gpt --data "$tmp/bad.txt"
expect_fail "--context: 60000 tokens, longer than the text's training split" train shakespeare-gpt \
    --data "$text" --context 60000
expect_fail "--width: 32 here, but $tmp/w1.st was trained with --width 16" sample \
    shakespeare-gpt --data "$text" --layers 1 --heads 2 --width 32 --context 16 --init "$tmp/w1.st"
expect_fail "--start: character 2 of the text (U+00E9" sample shakespeare-gpt --data "$text" \
    --layers 1 --heads 2 --width 16 --context 16 --init "$tmp/w1.st" --start "ab$(printf '\xc3\xa9')"
expect_fail "--dropout: expected a number below 1, got 1" train shakespeare-gpt --dropout 1
expect_fail "sample: expected --init FILE" sample shakespeare-gpt
expect_fail "--heads: 3 do not divide --width 16" train shakespeare-gpt --heads 3 --width 16

rm -rf "$tmp"
[ "$fails" -eq 0 ]
