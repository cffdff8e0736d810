#!/usr/bin/env bash
# test_cache.sh LOOM - the kernel cache across processes: two processes compiling the same
# programs at once into an empty cache both succeed; a third compiles nothing (all disk hits);
# LOOM_DUMP writes the generated C; a truncated, emptied or random entry is rebuilt; without a C
# compiler the run warns once and interprets; with loom's own matmul the CNN's schedule has no im2col (UNFOLD) kernel, its input gradient's fold
# computes its product, its pool gradients read argmax codes and conv1's feeds its gradients,
# conv1's pooling computes conv1 (its product and bias) plane by plane, and conv2's fold
# makes conv2's pool gradient a block at a time for its product and conv2's weight and bias
# gradients.
set -u
loom="$1"
tmp="${LOOM_TEST_TMP:-/tmp}/cache.$$"
rm -rf "$tmp"; mkdir -p "$tmp"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
run() { XDG_CACHE_HOME="$tmp/cache" "$loom" train fmnist-mlp --steps 3 --devices 1 --limit-eval 250 "$@"; }

run >"$tmp/a" 2>&1 & pa=$!
run >"$tmp/b" 2>&1 & pb=$!
wait $pa || fail "first concurrent process: $(tail -2 "$tmp/a")"
wait $pb || fail "second concurrent process: $(tail -2 "$tmp/b")"
[ "$(grep -c 'test accuracy' "$tmp/a")" -ge 1 ] && [ "$(grep -c 'test accuracy' "$tmp/b")" -ge 1 ] &&
    echo "ok   two processes compiling at once both succeed"

LOOM_DUMP="$tmp/dump" run >"$tmp/c" 2>&1 || fail "third process: $(tail -2 "$tmp/c")"
if grep -q "compiles 0 (0.00 s), disk cache hits [1-9]" "$tmp/c"; then
    echo "ok   a later process compiles nothing: $(grep -o 'compiles 0.*disk cache hits [0-9]*' "$tmp/c")"
else
    fail "third process compiled: $(grep 'metrics: graphs' "$tmp/c")"
fi
if ls "$tmp"/dump/*.c >/dev/null 2>&1 && grep -q "void loom_k" "$tmp"/dump/*.c &&
   grep -q "generated loom_k.*fusing" "$tmp"/dump/*.schedule; then
    echo "ok   LOOM_DUMP wrote $(ls "$tmp"/dump/*.c | wc -l) sources and $(ls "$tmp"/dump/*.schedule | wc -l) schedules"
else
    fail "LOOM_DUMP wrote nothing"
fi

# damaged entries (truncated: dlopen of a short ELF file dies of SIGBUS; emptied; random bytes)
# are found by their trailer before dlopen, rebuilt with a warning, and then hit again; the
# temporary files of a build that was killed (here beside the truncated ones) go with the rebuild
sh -c 'exit 0' & dead=$!
wait $dead
for damage in truncate empty random; do
    for so in "$tmp"/cache/loom/*.so; do
        case $damage in
        truncate) truncate -s 8000 "$so" && : >"$so.tmp.$dead.1f" && : >"${so%.so}.c.tmp.$dead.1f.c" ;;
        empty) : >"$so" ;;
        random) head -c 20000 /dev/urandom >"$so" ;;
        esac
    done
    run >"$tmp/t" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && grep -q "is damaged: rebuilding it" "$tmp/t" && grep -q "compiles [1-9]" "$tmp/t" &&
       run 2>&1 | grep -q "compiles 0 (0.00 s), disk cache hits [1-9]" &&
       ! ls "$tmp"/cache/loom/*.tmp.* >/dev/null 2>&1; then
        echo "ok   a $damage kernel cache entry is rebuilt"
    else
        fail "$damage entry: exit $rc; $(grep -v '^epoch' "$tmp/t" | tail -3)"
    fi
done

if "$loom" info | grep -q "matmul: loom's AVX-512"; then
    LOOM_DUMP="$tmp/dump-cnn" XDG_CACHE_HOME="$tmp/cache" "$loom" train fmnist-cnn --steps 2 --limit-eval 250 \
        --devices 1 >"$tmp/e" 2>&1 || fail "cnn: $(tail -2 "$tmp/e")"
    train=$(grep -l "POOLGRAD" "$tmp"/dump-cnn/*.schedule)
    if [ -n "$train" ] && ! grep -q "UNFOLD" $train && grep -q "FOLD .*computing MATMUL" $train; then
        echo "ok   the CNN's step has no im2col kernel; its fold computes the product"
    else
        fail "cnn schedule: $(grep -h "FOLD" "$tmp"/dump-cnn/*.schedule)"
    fi
    # both poolings write their ReLU; both pool gradients read their pooling's argmax codes (and
    # the ReLU's backward's mask in them);
    # conv1's feeds its bias and weight gradients (its windows into a SUM and a MATMUL), so that
    # its output gradient is never made; conv2's is made a block at a time inside its fold,
    # which computes conv2's weight and bias gradients from each block as well, so that it is
    # never written; each pooling computes its convolution, whose output is never written; fc1
    # adds its bias and applies its ReLU as it stores its values, and fc2's input gradient the
    # ReLU's backward, summing it into fc1's bias gradient
    if [ "$(grep -c "argmax codes of POOLMAX" $train)" = 2 ] &&
        grep -q "MATMUL (128,128) .*into RELU#[0-9]* as it stores (bias, ReLU in registers)" $train &&
        grep -q "MATMUL (128,128) .*into WHERE#[0-9]* as it stores (where node [0-9]* > 0 in registers), summing its columns into SUM#" $train &&
        [ "$(grep -c "POOLMAX.*computing RELU" $train)" = 2 ] &&
        [ "$(grep -c "the ReLU's backward" $train)" = 2 ] &&
        grep -q "POOLGRAD (32,128,26,26).*windows into SUM#[0-9]* MATMUL#" $train &&
        grep -q "FOLD (128,32,13,13).*computing POOLGRAD#[0-9]*, computing SUM#[0-9]*, computing MATMUL#[0-9]*, computing MATMUL#[0-9]*, making POOLGRAD#[0-9]*'s rows a block at a time" $train &&
        grep -q "POOLMAX (32,128,13,13).*its product MATMUL#[0-9]* made plane by plane with its epilogue loom_k[0-9]*" $train &&
        grep -q "POOLMAX (64,128,5,5).*its product MATMUL#[0-9]* made plane by plane with its epilogue loom_k[0-9]*" $train; then
        echo "ok   the CNN's poolings compute their ReLUs and keep argmax codes for their gradients; conv1's computes conv1 and feeds its weight gradients; conv2's backward runs in its fold; conv2's pooling computes conv2; fc1's bias and ReLU and their backward in registers"
    else
        fail "cnn schedule: $(grep -h "POOL\|FOLD" $train)"
    fi
fi

CC=/nonexistent/cc XDG_CACHE_HOME="$tmp/cache2" "$loom" train fmnist-mlp --steps 3 --devices 1 --limit-eval 250 >"$tmp/d" 2>&1 ||
    fail "without a compiler: $(tail -2 "$tmp/d")"
if [ "$(grep -c 'no C compiler' "$tmp/d")" -eq 1 ] && grep -q "compiles 0" "$tmp/d" &&
   grep -q '^test accuracy' "$tmp/d"; then
    echo "ok   without a compiler: warned once, interpreted"
else
    fail "without a compiler: $(grep -c 'no C compiler' "$tmp/d") warnings; $(tail -3 "$tmp/d")"
fi
# loom cache clear removes the kernels; the next run compiles again
out=$(XDG_CACHE_HOME="$tmp/cache" LOOM_DATA_CACHE=off "$loom" cache clear) || fail "cache clear: $out"
if echo "$out" | grep -q "^removed [1-9][0-9]* cached files" && ! ls "$tmp"/cache/loom/*.so >/dev/null 2>&1 &&
   run 2>&1 | grep -q "compiles [1-9]"; then
    echo "ok   loom cache clear: $out"
else
    fail "cache clear: $out; $(ls "$tmp/cache/loom" | head -3)"
fi

rm -rf "$tmp"
[ "$fails" -eq 0 ]
