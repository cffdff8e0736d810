#!/usr/bin/env bash
# bench/torch-venv.sh [DIR] - the speed peer: PyTorch's current release from PyPI (MKL and
# oneDNN inside) in its own virtual environment, DIR (default bench/.venv), made once (several
# GB); prints the environment's python. Never run by the tests or CI.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-bench/.venv}"
# (safetensors: bench/gpt.sh's PyTorch run starts from loom's initial weights)
if ! [ -x "$dir/bin/python" ] || ! "$dir/bin/python" -c "import torch, numpy, safetensors" 2>/dev/null; then
    /usr/bin/python3 -m venv "$dir" >&2
    "$dir/bin/pip" install -q --disable-pip-version-check torch numpy safetensors >&2
fi
echo "$dir/bin/python"
