#!/usr/bin/env bash
# interop-venv.sh DIR - a Python environment with the real safetensors reader, TensorBoard's
# event reader, and Hugging Face's transformers and tokenizers (PyPI) for the interop tests, built
# on the system Python so that Debian's python3-torch, when installed, is visible too.
# transformers is pinned to 4.46.3, which runs on that PyTorch (1.13); 5.x asks for 2.6.
# The environment is made once under $XDG_CACHE_HOME/loom (or ~/.cache/loom), named by what it
# holds, and DIR links to it: a clean clone's `make test` does not make it again (17 s here).
# Best effort: without network the interop tests report themselves skipped.
set -u
dir="$1"
pkgs=(safetensors numpy tensorboard "transformers==4.46.3")
cache="${XDG_CACHE_HOME:-$HOME/.cache}/loom/interop-venv-$(echo "${pkgs[*]}" | cksum | cut -d' ' -f1)"
works() { [ -x "$1/bin/python" ] && "$1/bin/python" -c "import safetensors, numpy, tensorboard, transformers, tokenizers" 2>/dev/null; }
works "$dir" && exit 0
if ! works "$cache"; then
    tmp="$cache.tmp.$$" # (made aside, then renamed: a concurrent or killed maker leaves no half)
    rm -rf "$tmp"
    mkdir -p "$(dirname "$cache")"
    if /usr/bin/python3 -m venv --system-site-packages "$tmp" &&
        "$tmp/bin/pip" install -q --disable-pip-version-check "${pkgs[@]}" && works "$tmp"; then
        rm -rf "$cache" && mv "$tmp" "$cache"
    else
        rm -rf "$tmp"
        echo "interop: could not set up $dir (offline?); the interop tests will be skipped"
        exit 0
    fi
fi
rm -rf "$dir" && ln -s "$cache" "$dir"
exit 0
