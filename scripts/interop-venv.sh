#!/usr/bin/env bash
# interop-venv.sh DIR - a Python environment with the real safetensors reader, TensorBoard's
# event reader, and Hugging Face's transformers and tokenizers (PyPI) for the interop tests, built
# on the system Python so that Debian's python3-torch, when installed, is visible too.
# transformers is pinned to 4.46.3, which runs on that PyTorch (1.13); 5.x asks for 2.6.
# Best effort: without network the interop tests report themselves skipped.
set -u
dir="$1"
[ -x "$dir/bin/python" ] && "$dir/bin/python" -c "import safetensors, numpy, tensorboard, transformers, tokenizers" 2>/dev/null && exit 0
/usr/bin/python3 -m venv --system-site-packages "$dir" &&
    "$dir/bin/pip" install -q --disable-pip-version-check safetensors numpy tensorboard \
        "transformers==4.46.3" ||
    echo "interop: could not set up $dir (offline?); the interop test will be skipped"
exit 0
