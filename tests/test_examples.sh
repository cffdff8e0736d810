#!/usr/bin/env bash
# test_examples.sh BUILD_DIR - the three data-parallel examples (process group, accelerator,
# trainer) each train the CNN for 8 steps on 1 and on 2 devices, unchanged: the last losses agree
# to float rounding (amplified a little by training) and the test accuracies nearly agree.
set -u
build="$1"
fails=0
for ex in cnn_low cnn_mid cnn_high; do
    declare -A loss acc
    for d in 1 2; do
        out=$("$build/example_$ex" "$d" 8 2>&1) || { echo "FAIL: $ex on $d devices: $out"; fails=$((fails + 1)); continue; }
        loss[$d]=$(echo "$out" | sed -n 's/.*last loss \([0-9.]*\).*/\1/p')
        acc[$d]=$(echo "$out" | sed -n 's/^test accuracy: \([0-9.]*\)$/\1/p')
    done
    if [ -n "${loss[1]:-}" ] && [ -n "${loss[2]:-}" ] &&
       awk -v a="${loss[1]}" -v b="${loss[2]}" -v p="${acc[1]}" -v q="${acc[2]}" \
           'BEGIN { d = a - b; e = p - q; exit !(d < 1e-3 && d > -1e-3 && e < 0.01 && e > -0.01 && a > 0) }'; then
        echo "ok   $ex: 1 device loss ${loss[1]} accuracy ${acc[1]}; 2 devices loss ${loss[2]} accuracy ${acc[2]}"
    else
        echo "FAIL: $ex: 1 device loss ${loss[1]:-?} accuracy ${acc[1]:-?}; 2 devices loss ${loss[2]:-?} accuracy ${acc[2]:-?}"
        fails=$((fails + 1))
    fi
    unset loss acc
done
[ "$fails" -eq 0 ]
