#!/usr/bin/env bash
# The NEON path on an x86-64 machine: cross-compile with g++-aarch64-linux-gnu
# and run under qemu-aarch64 pinned to a Cortex-A72 (a Pi 4; qemu's default CPU
# has SVE/dotprod, which would hide a dependence on newer instructions).
#  1. cpp/test_kernels: every path vs scalar, bit for bit (no Python).
#  2. the real extension, cross-built against an arm64 Debian Python, running
#     the op, decoder and drafter tests under emulation (the tests of pure
#     Python, such as the policy's, and the Markov-chain laws run on x86;
#     hypothesis draws a quarter of its examples: SPECGGUF_EMULATED=1; step
#     3 runs the whole pipeline on ARM).
#  3. the whole pipeline, for a Pi 4 (-cpu cortex-a72) and a Pi 5 (-cpu
#     cortex-a76): llama.cpp cross-built from the pinned sdist with the flags
#     each board's set-up uses (scripts/build_llama_aarch64.sh, cached),
#     llama-cpp-python's Python package over it, and specgguf on the default
#     pair: greedy speculation is the target's own greedy output, seeded
#     drafter-invariant sampling equals k=0 (scripts/aarch64_e2e.py); the
#     RPC worker built for each starts.
#     SPECGGUF_ARM_CORPUS=1 adds batches of 2 and 9 and three prompts of the
#     exactness corpus per core (about 15 minutes a core under qemu).
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
# llama-cpp-python's own imports (jinja2, diskcache, typing-extensions) and
# llama.cpp's OpenMP (libgomp1) are there for step 3.
PKGS=python3,python3-numpy,python3-pytest,python3-dev,python3-pybind11,python3-hypothesis,python3-scipy,libstdc++6
PKGS=$PKGS,python3-jinja2,python3-diskcache,python3-typing-extensions,libgomp1
if [ ! -x "$ROOT/usr/bin/python3" ] || [ "$(cat "$ROOT/.specgguf-packages" 2>/dev/null)" != "$PKGS" ]; then
  rm -rf "$ROOT"
  mmdebstrap --quiet --arch=arm64 --variant=extract --include="$PKGS" "$SUITE" "$ROOT" "$MIRROR"
  echo "$PKGS" > "$ROOT/.specgguf-packages"
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
PYTHONPATH="$WORK/pkg" SPECGGUF_EMULATED=1 \
  qemu-aarch64 -cpu cortex-a72 "$ROOT/usr/bin/python3" -m pytest -q -p no:cacheprovider \
  -k "not markov" \
  tests/test_verify_exact.py tests/test_verify_errors.py tests/test_verify_law.py tests/test_decoder.py \
  tests/test_sampling.py tests/test_invariant.py

echo "== the whole pipeline on aarch64: llama.cpp for a Pi 4 and a Pi 5, the default pair"
LLAMA_VERSION=$(sed -n 's/^LLAMA_VERSION=//p' scripts/setup.sh)
sdist="${XDG_CACHE_HOME:-$HOME/.cache}/specgguf/llama-src/llama_cpp_python-$LLAMA_VERSION.tar.gz"
models=$(.venv/bin/python -m specgguf models fetch default poor-draft)  # paths: target, draft, poor draft
for cpu in cortex-a72 cortex-a76; do
  built=$(bash scripts/build_llama_aarch64.sh "$cpu")
  echo "-- $cpu: $(cat "$built/flags")"
  # The Pi 5's build uses the dot product (sdot), the Pi 4's must not: it would die of SIGILL there.
  sdot=$(aarch64-linux-gnu-objdump -d "$built/lib/libggml-cpu.so" | grep -c $'\tsdot\t' || true)
  case "$cpu" in
    cortex-a72) [ "$sdot" -eq 0 ] || { echo "aarch64 e2e: the $cpu build has $sdot sdot instructions" >&2; exit 1; } ;;
    cortex-a76) [ "$sdot" -gt 0 ] || { echo "aarch64 e2e: the $cpu build does not use the dot product" >&2; exit 1; } ;;
  esac
  echo "aarch64 e2e: the $cpu build's dot product instructions: $sdot: ok"
  py="$WORK/llama-py-$cpu"
  rm -rf "$py" && mkdir -p "$py"
  tar -xzf "$sdist" -C "$py" --strip-components=1 "llama_cpp_python-$LLAMA_VERSION/llama_cpp"
  mkdir -p "$py/llama_cpp/lib" && cp -a "$built"/lib/. "$py/llama_cpp/lib/"
  usage=$(QEMU_LD_PREFIX="$ROOT" qemu-aarch64 -cpu "$cpu" "$built/bin/rpc-server" --help 2>&1 || true)
  [[ $usage == *--port* ]] || { echo "aarch64 e2e: the rpc-server built for $cpu does not start: $usage" >&2; exit 1; }
  echo "aarch64 e2e: the rpc-server built for $cpu starts: ok"
  # shellcheck disable=SC2086  # $models is three paths
  QEMU_LD_PREFIX="$ROOT" \
  LD_LIBRARY_PATH="$ROOT/usr/lib/aarch64-linux-gnu/blas:$ROOT/usr/lib/aarch64-linux-gnu/lapack" \
  PYTHONPATH="$WORK/pkg:$py" SPECGGUF_STATE="$(mktemp -d)" \
    qemu-aarch64 -cpu "$cpu" "$ROOT/usr/bin/python3" scripts/aarch64_e2e.py $models
done
