#!/usr/bin/env bash
# test_hostile.sh LOOM - input as a hostile user gives it, through the command line: sizes whose
# products wrap, a deadline past time_t, a cache path with a quote in it (no shell: nothing runs),
# gzip'd text cut short or followed by garbage, a log or weights file on a full disk, a text too
# large or of one character, bad LOOM_* values, every subcommand's --help, the GPT's signals,
# and the bounds of --devices, --min-lr and --clip-norm. Each is one line and a non-zero exit (or
# the documented success), never a crash, a hang or a silent loss.
set -u
loom="$1"
tmp="${LOOM_TEST_TMP:-/tmp}/hostile.$$"
mkdir -p "$tmp"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok   $*"; }

. "$(dirname "$0")/cli_lib.sh"

text="$tmp/text.txt"
gz="$(dirname "$0")/../data/tinyshakespeare.txt.gz"
gzip -dc "$gz" | head -c 100000 >"$text"
gpt="--data $text --layers 1 --heads 2 --width 16 --context 16 --batch 4"
tiny="train shakespeare-gpt --data $text --layers 1 --heads 1 --width 8 --context 8 --batch 4 --steps 1"

# 1. sizes from user input: bounded one by one, their products checked before any allocation
expect_fail "--batch: expected an integer from 1 to 16777216, got '72057594037927936'" \
    train shakespeare-gpt --batch 72057594037927936
expect_fail "--batch: expected an integer from 1 to 16777216, got '72057594037927936'" \
    eval shakespeare-gpt --init "$tmp/none" --batch 72057594037927936
expect_fail "--batch x --context: 16777216 x 64 is more than 268435456" \
    train shakespeare-gpt --batch 16777216
expect_fail "--tokens: expected an integer from 1 to 1073741824, got '4611686018427387903'" \
    sample shakespeare-gpt --init "$tmp/none" --tokens 4611686018427387903
expect_fail "--layers x 12 --width^2 (parameters): 1000 x 805306368 is more than 2147483648" \
    train shakespeare-gpt --width 8192 --heads 1 --layers 1000
expect_fail "--layers x 12 --width^2 (parameters): 1000 x 805306368 is more than 2147483648" \
    train shakespeare-gpt --width 8192 --heads 1 --layers 1000 --init "$tmp/none"
expect_fail "--batch: expected an integer from 1 to 16777216" train fmnist-mlp --batch 9223372036854775807

# 2. a deadline past time_t's range is refused, not waited on for ever
expect_fail "--timeout: expected a number from 0.001 to 1e+06, got '1e19'" train fmnist-mlp --timeout 1e19
expect_fail "--timeout: expected a number from 0.001 to 1e+06, got '1e19'" train shakespeare-gpt --timeout 1e19

# 3. no shell: a cache path with a quote and a command in it compiles, and runs nothing
cache="$tmp/cache';touch PWNED;'"
if (cd "$tmp" && XDG_CACHE_HOME="$cache" LOOM_METRICS=1 "$loom" $tiny >"$tmp/out" 2>&1) && [ ! -e "$tmp/PWNED" ] && grep -q "compiles [1-9]" "$tmp/out" &&
    ls "$cache"/loom/*.so >/dev/null 2>&1; then
    ok "a cache path with a quote in it: kernels compiled there, nothing else ran"
else
    fail "cache path with a quote: $(grep -i 'compil\|error' "$tmp/out" | head -3); PWNED: $(ls "$tmp"/PWNED 2>&1)"
fi
# $CC with arguments is split on blanks, as make splits it
if XDG_CACHE_HOME="$tmp/cc2" CC="cc -O2" LOOM_METRICS=1 "$loom" $tiny >"$tmp/out" 2>&1 &&
    grep -q "compiles [1-9]" "$tmp/out" && ! grep -q "interpreted" "$tmp/out"; then
    ok "CC='cc -O2' compiles the kernels"
else
    fail "CC='cc -O2': $(grep -i 'compil' "$tmp/out" | head -3)"
fi

# 10. `loom cache clear` while a compile runs leaves its files alone; a build whose files went
# anyway is tried once more
printf '#!/bin/sh\ncase "$*" in *--version*) ;; *) sleep 3;; esac\nexec cc "$@"\n' >"$tmp/slowcc"
printf '#!/bin/sh\ncase "$*" in *--version*) ;; *) [ -e "%s/lost" ] || { touch "%s/lost"; for a; do case "$a" in *.c) rm -f "$a";; esac; done; };; esac\nexec cc "$@"\n' "$tmp" "$tmp" >"$tmp/losecc"
chmod +x "$tmp/slowcc" "$tmp/losecc"
XDG_CACHE_HOME="$tmp/cc3" CC="$tmp/slowcc" LOOM_METRICS=1 "$loom" $tiny >"$tmp/out" 2>&1 &
pid=$!
sleep 1.5
XDG_CACHE_HOME="$tmp/cc3" LOOM_DATA_CACHE=off "$loom" cache clear >"$tmp/clear" 2>&1
wait $pid
rc=$?
if [ $rc = 0 ] && ! grep -q "interpreted" "$tmp/out" && grep -q "compiles [1-9]" "$tmp/out"; then
    ok "cache clear during a compile: the compile went on ($(cat "$tmp/clear"))"
else
    fail "cache clear during a compile: exit $rc, $(grep -i 'compil\|interp' "$tmp/out" | head -3)"
fi
if XDG_CACHE_HOME="$tmp/cc4" CC="$tmp/losecc" LOOM_METRICS=1 "$loom" $tiny >"$tmp/out" 2>&1 &&
    grep -q "went while it ran: building again" "$tmp/out" && ! grep -q "interpreted" "$tmp/out"; then
    ok "a build whose source went is built again"
else
    fail "a build whose source went: $(grep -i 'compil\|interp\|went' "$tmp/out" | head -3)"
fi

# 4. gzip'd text cut short, followed by garbage, or corrupt: an error naming the byte
head -c 300000 "$gz" >"$tmp/cut.gz"
{ cat "$gz"; echo garbage; } >"$tmp/trailing.gz"
{ head -c 100000 "$gz"; head -c 1000 /dev/urandom; tail -c +101001 "$gz"; } >"$tmp/corrupt.gz"
{ cat "$gz"; cat "$gz"; } >"$tmp/twice.gz"
expect_fail "cut.gz: the gzip stream ends early at byte 300000 (the file's end)" train shakespeare-gpt --data "$tmp/cut.gz"
expect_fail "trailing.gz: trailing data at byte $(stat -c %s "$gz") after the gzip stream" \
    train shakespeare-gpt --data "$tmp/trailing.gz"
expect_fail "corrupt.gz: corrupt gzip stream near byte" train shakespeare-gpt --data "$tmp/corrupt.gz"
if "$loom" train shakespeare-gpt --data "$tmp/twice.gz" --steps 1 --layers 1 --heads 1 --width 8 \
        --context 8 >"$tmp/out" 2>&1 && grep -q "vocabulary 65" "$tmp/out"; then
    ok "two gzip members concatenated are one text"
else
    fail "two gzip members: $(head -3 "$tmp/out")"
fi

# 5. a log or weights file on a full disk: one line, the file ends on a whole row
full="$tmp/full"
mkdir -p "$full"
if mount -t tmpfs -o size=32k tmpfs "$full" 2>/dev/null; then
    trap 'umount "$full" 2>/dev/null' EXIT # (a test killed midway leaves no mount behind)
    mkdir "$full/logs"
    head -c 20000 /dev/zero >"$full/fill" # (three 4 KiB pages left: a file each, and one more)
    # (metrics.csv or the TensorBoard file beside it: whichever finds the disk full first)
    expect_fail "No space left on device" train fmnist-mlp --steps 200 --log-dir "$full/logs"
    grep -q "^loom: --log-dir: .*$full/logs/\(metrics.csv\|events.out.tfevents.*\)'\?: .*No space" "$tmp/err" ||
        fail "the full disk's line names the log: $(cat "$tmp/err")"
    tb=$(ls "$full/logs"/events.out.tfevents.* | head -1)
    if [ -s "$full/logs/metrics.csv" ] && [ "$(tail -c 1 "$full/logs/metrics.csv" | od -An -c | tr -d ' ')" = '\n' ] &&
        awk -F, 'NR > 1 && NF != 7 { bad = 1 } END { exit bad }' "$full/logs/metrics.csv" &&
        python3 "$(dirname "$0")/tfrecords.py" "$tb" >"$tmp/tb"; then
        ok "metrics.csv on a full disk ends on a whole row ($(wc -l <"$full/logs/metrics.csv") lines), the event file on a whole record ($(cat "$tmp/tb"))"
    else
        fail "logs on a full disk: $(tail -c 80 "$full/logs/metrics.csv" | od -c | tail -3) $(cat "$tmp/tb")"
    fi
    rm -f "$full/logs"/events.out.tfevents.*
    if "$loom" train fmnist-mlp --steps 150 --log-dir "$full/logs" --log-errors warn >"$tmp/out" 2>"$tmp/err" &&
        [ "$(grep -c 'training on without the log' "$tmp/err")" = 1 ] && grep -q "^test accuracy" "$tmp/out"; then
        ok "--log-errors warn: one warning, the run trains on"
    else
        fail "--log-errors warn: $(cat "$tmp/err")"
    fi
    rm -f "$full/logs/metrics.csv" "$full/logs"/events.out.tfevents.*
    head -c 12288 /dev/zero >"$full/fill2"
    expect_fail "--save: cannot write '$full/w.st': No space left on device" train fmnist-mlp --steps 2 --save "$full/w.st"
    expect_fail "--save: cannot write '$full/w.st': No space left on device" train shakespeare-gpt --save "$full/w.st"
    umount "$full"
else
    fail "cannot mount a tmpfs to fill (run as root)"
fi

# 6. text: one character is refused after one pass, in little memory (the address space is not
# limited under the sanitizers, which reserve terabytes of it); a file past 1 GiB at once
head -c 67108864 /dev/zero | tr '\0' a >"$tmp/one.txt"
limit=$([ -n "${LOOM_TEST_QUICK:-}" ] && echo unlimited || echo 1000000)
if (ulimit -v $limit; "$loom" train shakespeare-gpt --data "$tmp/one.txt" >"$tmp/out" 2>"$tmp/err"); then
    fail "64 MiB of one character trained"
elif [ "$(wc -l <"$tmp/err")" = 1 ] && grep -q "one distinct character in 67108864" "$tmp/err"; then
    ok "64 MiB of one character refused (address space: $limit KB)"
else
    fail "64 MiB of one character: $(cat "$tmp/err")"
fi
rm -f "$tmp/one.txt"
truncate -s 1073741825 "$tmp/big.txt"
expect_fail "big.txt: 1073741825 bytes, expected at most 1073741824 (1 GiB) of text" \
    train shakespeare-gpt --data "$tmp/big.txt"
rm -f "$tmp/big.txt"
# the vocabulary past 256 characters (tokens of 2 bytes) reads back as it was written
python3 -c "
import random; random.seed(1)
print(''.join(chr(0x4e00 + random.randrange(300)) for _ in range(3000)))" >"$tmp/wide.txt"
if "$loom" train shakespeare-gpt --data "$tmp/wide.txt" --steps 2 --layers 1 --heads 1 --width 8 --context 8 \
        --save "$tmp/wide.st" >"$tmp/out" 2>&1 && grep -q "vocabulary 301" "$tmp/out" &&
    "$loom" sample shakespeare-gpt --data "$tmp/wide.txt" --layers 1 --heads 1 --width 8 --context 8 \
        --init "$tmp/wide.st" --start "$(head -c 9 "$tmp/wide.txt")" --tokens 5 >"$tmp/s" 2>&1 &&
    [ "$(head -c 9 "$tmp/s")" = "$(head -c 9 "$tmp/wide.txt")" ]; then
    ok "301 distinct characters: trained, sampled from"
else
    fail "301 distinct characters: $(head -3 "$tmp/out") / $(head -c 100 "$tmp/s")"
fi

# 8. loom's GPT weights carry their vocabulary: text of the same size of vocabulary but other
# characters is refused naming the first that differs; weights without one are taken, warned of
"$loom" train shakespeare-gpt $gpt --steps 2 --save "$tmp/v.st" >/dev/null 2>&1 || fail "train for the vocabulary"
tr 'z' '@' <"$text" >"$tmp/other.txt"
expect_fail "was trained on another vocabulary: token 11 is 'A' there, '@' in the data" \
    sample shakespeare-gpt $gpt --data "$tmp/other.txt" --init "$tmp/v.st"
expect_fail "was trained on another vocabulary: token 11 is 'A' there, '@' in the data" \
    eval shakespeare-gpt $gpt --data "$tmp/other.txt" --init "$tmp/v.st"
python3 - "$tmp/v.st" "$tmp/bare.st" <<'EOF'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
del h["__metadata__"]["vocabulary"]
t = json.dumps(h).encode()
t += b" " * (-len(t) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(t)) + t + b[8 + n:])
EOF
if "$loom" eval shakespeare-gpt $gpt --init "$tmp/bare.st" >"$tmp/out" 2>"$tmp/err" &&
    grep -q "^val loss" "$tmp/out" && [ "$(wc -l <"$tmp/err")" = 1 ] && grep -q "records no vocabulary" "$tmp/err"; then
    ok "weights without a vocabulary: taken, with one warning"
else
    fail "weights without a vocabulary: $(cat "$tmp/err")"
fi

# 9. bad LOOM_* values: one line naming the variable and the values it takes
LOOM_BACKEND=bogus expect_fail "LOOM_BACKEND='bogus': expected cpu or interp (or unset)" train fmnist-mlp --steps 1
LOOM_MATMUL=bogus expect_fail "LOOM_MATMUL='bogus': expected loom or blas (or unset)" train fmnist-mlp --steps 1
LOOM_PROFILE=garbage expect_fail "LOOM_PROFILE='garbage': expected 0 or 1 (or unset)" train shakespeare-gpt --steps 1
LOOM_METRICS=yes expect_fail "LOOM_METRICS='yes': expected 0 or 1 (or unset)" info
LOOM_FAULT=garbage expect_fail "LOOM_FAULT='garbage': expected D:S or D:S:hang, D a device from 0 to 1" \
    train fmnist-mlp --steps 1 --devices 2
LOOM_FAULT=7:2 expect_fail "LOOM_FAULT='7:2': expected D:S or D:S:hang, D a device from 0 to 1" \
    train fmnist-mlp --steps 1 --devices 2

# 11. the GPT's commands: signals, --devices, --min-lr, --clip-norm, a long context, streaming
expect_fail "--devices: expected an integer from 1 to 256, got '4294967297'" train shakespeare-gpt --devices 4294967297
expect_fail "--min-lr: expected at most --lr (0.001), got 0.01" train shakespeare-gpt --min-lr 0.01
expect_fail "--min-lr: expected at most --lr (0.05), got 0.1" train fmnist-mlp --min-lr 0.1
expect_fail "--context: 10001 tokens, longer than the text's training split (90000) or validation split (10000)" \
    train shakespeare-gpt --data "$text" --context 10001 --devices 2
if "$loom" train fmnist-mlp --steps 3 --clip-norm 0 --data "$tmp/none" 2>&1 | grep -q "apt-get install" &&
    "$loom" train shakespeare-gpt $gpt --steps 3 --clip-norm 0 >/dev/null 2>>"$tmp/err"; then
    ok "--clip-norm 0 (no clipping) for both recipes' kinds"
else
    fail "--clip-norm 0: $(cat "$tmp/err")"
fi
for sig in INT TERM; do
    "$loom" train shakespeare-gpt $gpt --steps 100000 --eval-interval 100000 --save "$tmp/w.st" \
        >"$tmp/out" 2>"$tmp/err" &
    pid=$!
    for _ in $(seq 100); do grep -q "^shakespeare-gpt:" "$tmp/out" 2>/dev/null && break; sleep 0.1; done
    sleep 1
    kill -$sig $pid
    wait $pid
    rc=$?
    want=$([ $sig = INT ] && echo 130 || echo 143)
    if [ $rc = "$want" ] && [ "$(wc -l <"$tmp/err")" = 1 ] &&
        grep -q "^loom: stopped by SIG$sig after step [1-9][0-9]*: no weights saved" "$tmp/err" && [ ! -e "$tmp/w.st" ]; then
        ok "train shakespeare-gpt stopped by SIG$sig: exit $rc, $(cat "$tmp/err")"
    else
        fail "SIG$sig: exit $rc (expected $want), stderr: $(cat "$tmp/err")"
    fi
done
"$loom" train shakespeare-gpt $gpt --steps 3 --save "$tmp/w.st" >/dev/null 2>&1 || fail "train for sampling"
"$loom" sample shakespeare-gpt $gpt --init "$tmp/w.st" --tokens 1000000 >"$tmp/s" 2>"$tmp/err" &
pid=$!
for _ in $(seq 100); do [ "$(wc -c <"$tmp/s")" -gt 20 ] && break; sleep 0.1; done
got=$(wc -c <"$tmp/s")
kill -INT $pid
wait $pid
rc=$?
if [ "$got" -gt 20 ] && [ $rc = 130 ]; then
    ok "sample streams its tokens ($got bytes before SIGINT) and stops on SIGINT (exit 130)"
else
    fail "sample streaming: $got bytes, exit $rc, $(cat "$tmp/err")"
fi

# 12. every subcommand's --help: its options on stdout, exit 0
for c in "train" "train shakespeare-gpt" "eval" "sample" "cache" "info"; do
    if $loom $c --help >"$tmp/h" 2>"$tmp/err" && [ ! -s "$tmp/err" ] && head -1 "$tmp/h" | grep -q "^usage: loom ${c%% *}"; then
        ok "loom $c --help: $(head -1 "$tmp/h" | cut -c 1-60)"
    else
        fail "loom $c --help: $(head -2 "$tmp/h") $(cat "$tmp/err")"
    fi
done
grep -q -- "--log-errors" <("$loom" train --help) || fail "train --help lacks --log-errors"
grep -q -- "--tokens" <("$loom" sample --help) || fail "sample --help lacks --tokens"

# beyond the list: no shell anywhere in loom, and no unchecked write to a log or checkpoint
src="$(dirname "$0")/.."
if grep -rn --include='*.c' -E '\b(system|popen)\(' "$src/src" "$src/tools" >"$tmp/g"; then
    fail "a shell is run: $(cat "$tmp/g")"
else
    ok "no system( or popen( in src/ or tools/"
fi
if grep -rn --include='*.c' -E '\bf(printf|write|puts)\(r(\.|->)log' "$src/tools" >"$tmp/g"; then
    fail "an unchecked write to a log: $(cat "$tmp/g")"
else
    ok "every write to a log goes through cli_log_row (checked)"
fi

rm -rf "$tmp"
[ "$fails" -eq 0 ] || { echo "$fails failed"; exit 1; }
