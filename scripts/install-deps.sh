#!/usr/bin/env bash
# Installs the Debian packages loom needs to build and test, if any is missing (as root, or
# through sudo). Idempotent: with everything present it only checks. python3-torch (Debian's
# PyTorch 1.13, ~50 MB to fetch) is the reader and writer the interop tests hold loom's weights
# against (tests/interop): without it they report themselves skipped. librsvg2-bin's rsvg-convert
# renders `loom plot`'s SVG in the tests.
set -euo pipefail
pkgs=(cmake ninja-build gcc pkg-config libopenblas-dev zlib1g-dev dataset-fashion-mnist python3-venv
    clang libclang-rt-14-dev openmpi-bin libopenmpi-dev python3-torch librsvg2-bin)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
