#!/usr/bin/env bash
# interop-venv.sh DIR - a Python environment with the real safetensors reader and TensorBoard's
# event reader (PyPI) for the interop test, built on the system Python so that Debian's python3-torch, when installed, is
# visible too. Best effort: without network the interop test reports itself skipped.
set -u
dir="$1"
[ -x "$dir/bin/python" ] && "$dir/bin/python" -c "import safetensors, numpy, tensorboard" 2>/dev/null && exit 0
/usr/bin/python3 -m venv --system-site-packages "$dir" &&
    "$dir/bin/pip" install -q --disable-pip-version-check safetensors numpy tensorboard ||
    echo "interop: could not set up $dir (offline?); the interop test will be skipped"
exit 0
