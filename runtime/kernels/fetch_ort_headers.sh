#!/usr/bin/env bash
# onnxruntime's C/C++ API headers, which specrt's kernel library (runtime/kernels) compiles against.
# PyPI's onnxruntime ships no headers; Debian 13 (trixie) packages them as libonnxruntime-dev
# (1.21, API version 21, 85 KB). This script downloads that package with apt's own client, without
# touching the machine's apt sources, and unpacks it into a cache folder:
#
#     bash runtime/kernels/fetch_ort_headers.sh [DIR]
#
# DIR defaults to ${XDG_CACHE_HOME:-~/.cache}/specrt/onnxruntime-headers, where setup.py looks.
# Does nothing when the headers are already there, or when the build will find them elsewhere
# (ORT_INCLUDE_DIR, pkg-config libonnxruntime, /usr/include/onnxruntime).
set -euo pipefail
dest=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/specrt/onnxruntime-headers}
header=onnxruntime_cxx_api.h
for have in "${ORT_INCLUDE_DIR:-}" /usr/include/onnxruntime "$dest/usr/include/onnxruntime"; do
    if [ -n "$have" ] && [ -f "$have/$header" ]; then
        echo "onnxruntime headers: $have"
        exit 0
    fi
done
if pkg-config --exists libonnxruntime 2>/dev/null; then
    echo "onnxruntime headers: pkg-config libonnxruntime"
    exit 0
fi
if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
    echo "fetch_ort_headers: no apt-get/dpkg-deb here. Get onnxruntime's headers (onnxruntime_cxx_api.h and" \
         "its siblings, version >= 1.21) from https://github.com/microsoft/onnxruntime/releases and set" \
         "ORT_INCLUDE_DIR to their folder" >&2
    exit 1
fi
bash "$(dirname "$0")/fetch_debian_package.sh" libonnxruntime-dev "$dest"
if [ ! -f "$dest/usr/include/onnxruntime/$header" ]; then
    echo "fetch_ort_headers: libonnxruntime-dev did not hold $header" >&2
    exit 1
fi
echo "onnxruntime headers: $dest/usr/include/onnxruntime"
