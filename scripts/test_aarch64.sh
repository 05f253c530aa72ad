#!/usr/bin/env bash
# The NEON path on an x86-64 machine: cross-compile with g++-aarch64-linux-gnu
# and run under qemu-aarch64 pinned to a Cortex-A72 (a Pi 4; qemu's default CPU
# has SVE/dotprod, which would hide a dependence on newer instructions).
#  1. cpp/test_kernels: every path vs scalar, bit for bit (no Python).
#  2. the real extension, cross-built against an arm64 Debian Python, running
#     the op and decoder tests under emulation.
# Also runs the x86 kernel test under qemu -cpu Nehalem (no AVX2): the
# dispatch must fall back to scalar without an illegal instruction.
set -euo pipefail
cd "$(dirname "$0")/.."
CXXFLAGS="-O3 -std=c++17 -ffp-contract=off -Icpp"

source scripts/kernel_objs.sh
WORK=${SPECGGUF_ARM_WORK:-/tmp/specgguf-aarch64}
SUITE=bookworm
MIRROR=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
MIRROR=${MIRROR:-http://deb.debian.org/debian}

need=()
command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
mkdir -p "$WORK"

echo "== x86-64 without AVX2 (qemu -cpu Nehalem): scalar fallback"
kernel_objs g++ "$WORK/obj_x86" x86 -O3
g++ $CXXFLAGS cpp/test_kernels.cpp "$WORK"/obj_x86/*.o -o "$WORK/tk_x86"
qemu-x86_64 -cpu Nehalem "$WORK/tk_x86" | tail -2

echo "== aarch64 kernels (qemu -cpu cortex-a72): NEON vs scalar"
kernel_objs aarch64-linux-gnu-g++ "$WORK/obj_arm" arm -O3
aarch64-linux-gnu-g++ $CXXFLAGS -static cpp/test_kernels.cpp "$WORK"/obj_arm/*.o -o "$WORK/tk_arm"
qemu-aarch64 -cpu cortex-a72 "$WORK/tk_arm" | tail -2

echo "== aarch64 extension: op and decoder tests under emulation"
ROOT="$WORK/sysroot"
if [ ! -x "$ROOT/usr/bin/python3" ]; then
  rm -rf "$ROOT"
  mmdebstrap --quiet --arch=arm64 --variant=extract \
    --include=python3,python3-numpy,python3-pytest,python3-dev,python3-pybind11,python3-hypothesis,python3-scipy,libstdc++6 \
    "$SUITE" "$ROOT" "$MIRROR"
fi
PYV=$(cd "$ROOT/usr/include" && ls -d python3.* | grep -m1 -E "^python3\.[0-9]+$")
PKG="$WORK/pkg/specgguf"
rm -rf "$WORK/pkg" && mkdir -p "$PKG"
cp -r src/specgguf/. "$PKG/" && find "$PKG" -name __pycache__ -prune -exec rm -rf {} +  # the package, folders and all
aarch64-linux-gnu-g++ $CXXFLAGS -shared -fPIC -static-libstdc++ \
  -I"$ROOT/usr/include/$PYV" -idirafter "$ROOT/usr/include" \
  cpp/bindings.cpp "$WORK"/obj_arm/*.o -o "$PKG/_core.cpython-$(echo "${PYV#python}" | tr -d .)-aarch64-linux-gnu.so"
QEMU_LD_PREFIX="$ROOT" \
LD_LIBRARY_PATH="$ROOT/usr/lib/aarch64-linux-gnu/blas:$ROOT/usr/lib/aarch64-linux-gnu/lapack" \
PYTHONPATH="$WORK/pkg" \
  qemu-aarch64 -cpu cortex-a72 "$ROOT/usr/bin/python3" -m pytest -q -p no:cacheprovider \
  tests/test_verify_exact.py tests/test_verify_errors.py tests/test_verify_law.py tests/test_decoder.py \
  tests/test_sampling.py tests/test_policy.py tests/test_ngram.py tests/test_config.py tests/test_invariant.py
