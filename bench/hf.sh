#!/usr/bin/env bash
# bench/hf.sh - Hugging Face models fine-tuned by loom (`loom train hf`) against transformers in
# PyTorch eager (bench/torch_hf.py; PyTorch's current release from PyPI, bench/torch-venv.sh;
# PEER_PYTHON overrides), all in this one run, on 2 cores: GPT-2 small's configuration (12
# layers, width 768, vocabulary 50257) and a Llama of ~125M parameters (12 layers, width 768, 12
# heads sharing 4 key and value heads, MLP 2048, vocabulary 32000, untied head), random weights,
# batches of 4 x 128 tokens; loom on 2 devices and on 1 device of 2 cores (SPLITS="2 1x2").
# ms a step (loom: the mean of steps 4-6, after an evaluation; PyTorch: of steps 3-8 on 2
# threads) and peak RSS. REPEAT=N (default 1) runs each N times,
# loom and PyTorch alternating, and reports the medians with every run. The folders are made
# once in bench/.hf. Not a test.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"
[ -x build/loom ] || { echo "build first: make build"; exit 1; }
py=${PEER_PYTHON:-$(bash bench/torch-venv.sh)}
"$py" -c "import transformers, tokenizers" 2>/dev/null ||
    "$(dirname "$py")/pip" install -q --disable-pip-version-check transformers >&2
mkdir -p bench/.hf
text=bench/.hf/text.txt
[ -f "$text" ] || gzip -dc data/tinyshakespeare.txt.gz | head -c 30000 >"$text"
echo "peer: PyTorch $("$py" -c 'import torch; print(torch.__version__)'), transformers $("$py" -c 'import transformers; print(transformers.__version__)'); CPU: $(lscpu | sed -n 's/^Model name: *//p')"
printf '%-8s %-6s %10s %10s %8s %14s %14s\n' model loom loom_ms torch_ms speedup loom_rss_MB torch_rss_MB
for kind in gpt2 llama; do
    dir=bench/.hf/$kind
    [ -f "$dir/config.json" ] || "$py" bench/torch_hf.py make "$dir" "$kind" "$text" >&2
    ts=() tr=0
    declare -A ls=() lr=()
    for _ in $(seq "${REPEAT:-1}"); do
        for split in ${SPLITS:-2 1x2}; do # 2 devices, or 1x2: 1 device of 2 cores
            opts="--devices $split"
            [ "$split" = 1x2 ] && opts="--devices 1 --cores-per-device 2"
            # shellcheck disable=SC2086
            /usr/bin/time -f "peak RSS %M KB" build/loom train hf --init "$dir" --data "$text" \
                --steps 6 --eval-interval 3 --batch 4 --context 128 $opts --quiet >/tmp/loom-hf.$$ 2>&1
            ls[$split]+="$(sed -n 's/^step 6: .*, \([0-9.]*\) ms a step$/\1/p' /tmp/loom-hf.$$) "
            lr[$split]=$(sed -n 's/^peak RSS \([0-9]*\) KB$/\1/p' /tmp/loom-hf.$$)
        done
        "$py" bench/torch_hf.py run "$dir" 8 2 >/tmp/torch-hf.$$ 2>&1
        ts+=("$(sed -n 's/^ms\/step //p' /tmp/torch-hf.$$)")
        tr=$(sed -n 's/^peak RSS \([0-9]*\) KB$/\1/p' /tmp/torch-hf.$$)
    done
    t=$(median "${ts[@]}")
    for split in ${SPLITS:-2 1x2}; do
        # shellcheck disable=SC2086
        l=$(median ${ls[$split]}) runs=""
        [ "${REPEAT:-1}" -gt 1 ] && runs="   (loom ${ls[$split]% }; PyTorch ${ts[*]})"
        printf '%-8s %-6s %10s %10s %7.2fx %14d %14d%s\n' "$kind" "$split" "$l" "$t" \
            "$(echo "$t / $l" | bc -l)" "$((lr[$split] / 1024))" "$((tr / 1024))" "$runs"
    done
    unset ls lr
done
rm -f /tmp/loom-hf.$$ /tmp/torch-hf.$$
