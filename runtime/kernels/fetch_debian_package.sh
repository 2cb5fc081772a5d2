#!/usr/bin/env bash
# One package from Debian 13 (trixie), unpacked into a folder, with apt's own client and a
# throw-away sources list: the machine's apt configuration is left as it was.
#
#     bash runtime/kernels/fetch_debian_package.sh PACKAGE DIR
#
# Used for onnxruntime's C API headers (fetch_ort_headers.sh) and, by the tests, SIMDe's portable
# AVX-512 headers (tests/runtime/test_kernels_emulated.py).
set -euo pipefail
package=$1
dest=$2
if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
    echo "fetch_debian_package: no apt-get/dpkg-deb here to fetch $package" >&2
    exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
echo "deb http://deb.debian.org/debian trixie main" > "$work/sources.list"
apt_options=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
             -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o APT::Sandbox::User=root)
apt-get "${apt_options[@]}" -qq update
(cd "$work" && apt-get "${apt_options[@]}" -qq download "$package")
mkdir -p "$dest"
dpkg-deb -x "$work/${package}"_*.deb "$dest"
