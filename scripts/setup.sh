#!/usr/bin/env bash
# One-step set-up: a virtualenv in .venv with llama-cpp-python built with the
# right flags for this CPU and llama.cpp's RPC backend, llama.cpp's rpc-server
# built from the same source, specgguf itself (its C++ core built by pip), the
# test extras, and the default model pair. Idempotent: a second run only
# checks.
#
# Why not plain `pip install llama-cpp-python`: on x86-64 its default
# -march=native build crashes on CPUs with AMX (Q4/Q2 matmuls segfault in
# ggml_backend_amx_mul_mat), so x86 names the CPU's features itself (SSE,
# AVX2, AVX-512: everything native would use except AMX);
# on aarch64 boards the native build is what makes llama.cpp fast, so it
# keeps GGML_NATIVE=ON. Every platform gets -DGGML_RPC=ON (a target split
# over several boards; see the README). The sdist is fetched once and checked
# against a pinned sha256; the built wheel is kept in a cache keyed by the
# flags, because pip's own wheel cache ignores CMAKE_ARGS.
#
# The sdist is patched before it is built (scripts/patches/*.patch, applied in
# name order and part of the cache key): llama-batch-invariant.patch lets a
# forward of fewer than N tokens compute each token's row exactly as a one-token
# forward does (ggml_cpu_set_batch_invariant; specgguf turns it on when it loads
# a model), so verification reproduces plain decoding bit for bit. See
# scripts/patches/README.md.
#
# rpc-server is compiled from the sdist's tools/rpc/rpc-server.cpp against the
# libggml this venv's llama-cpp-python ships, so the workers and the client
# speak exactly the same protocol version.
#
# Env: SPECGGUF_VENV (default .venv), SPECGGUF_PYTHON (default python3),
#      SPECGGUF_SKIP_MODELS=1 to skip fetching models.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_VERSION=0.3.36
LLAMA_SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
VENV=${SPECGGUF_VENV:-.venv}
PY=${SPECGGUF_PYTHON:-python3}
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/specgguf"
# A compiler job on llama.cpp's largest files peaks near 500 MB (measured
# cross-building it for aarch64): a 1-2 GB board building on all four cores
# would swap or be killed, so jobs are capped by the memory available.
if [ -z "${CMAKE_BUILD_PARALLEL_LEVEL:-}" ]; then
  mem_mb=$(awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo 2>/dev/null || echo 0)
  jobs=$(nproc)
  if [ "${mem_mb:-0}" -gt 0 ] && [ $((mem_mb / 600)) -lt "$jobs" ]; then
    jobs=$(( mem_mb / 600 > 0 ? mem_mb / 600 : 1 ))
    echo "setup: $mem_mb MB of memory available: building with $jobs job(s) (set CMAKE_BUILD_PARALLEL_LEVEL to override)"
  fi
  export CMAKE_BUILD_PARALLEL_LEVEL=$jobs
fi

flags=$(bash scripts/llama_flags.sh)  # the CPU flags, chosen in one place

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
"$VPY" -m pip install -q --upgrade pip

# The pinned sdist: the source of both the Python bindings and rpc-server.
sdist="$CACHE/llama-src/llama_cpp_python-$LLAMA_VERSION.tar.gz"
if ! echo "$LLAMA_SDIST_SHA256  $sdist" | sha256sum -c --status 2>/dev/null; then
  echo "setup: fetching the llama-cpp-python $LLAMA_VERSION sdist from PyPI"
  mkdir -p "$(dirname "$sdist")"
  "$VPY" - "$sdist" "$LLAMA_VERSION" <<'PYEOF'
import re, sys, urllib.request
out, version = sys.argv[1], sys.argv[2]
name = f"llama_cpp_python-{version}.tar.gz"
index = urllib.request.urlopen("https://pypi.org/simple/llama-cpp-python/", timeout=60).read().decode()
m = re.search(r'href="([^"#]*/' + re.escape(name) + r')#', index)
if not m:
    sys.exit(f"setup: {name} is not on PyPI's simple index")
urllib.request.urlretrieve(m.group(1), out + ".part")
PYEOF
  mv "$sdist.part" "$sdist"
  echo "$LLAMA_SDIST_SHA256  $sdist" | sha256sum -c --status || {
    rm -f "$sdist"; echo "setup: the sdist does not match its pinned sha256" >&2; exit 1; }
fi

patches=$(cat scripts/patches/*.patch | sha256sum | cut -c1-16)
key=$(printf '%s %s %s %s' "$LLAMA_VERSION" "$flags" "$("$VPY" -c 'import sys; print(sys.version_info[:2])')" "$patches" | sha256sum | cut -c1-16)
stamp="$VENV/.specgguf-llama-build"
if [ "$(cat "$stamp" 2>/dev/null)" != "$key" ] || ! "$VPY" -c "import llama_cpp" 2>/dev/null; then
  wheels="$CACHE/llama-wheels/$key"
  if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "setup: building llama-cpp-python $LLAMA_VERSION with: $flags (several minutes)"
    "$VPY" -m pip install -q scikit-build-core cmake ninja
    rm -rf "$wheels.tmp"
    tree=$(mktemp -d)
    tar -xzf "$sdist" -C "$tree"
    for p in scripts/patches/*.patch; do
      patch -s -p1 -d "$tree/llama_cpp_python-$LLAMA_VERSION" < "$p"
    done
    CMAKE_ARGS="$flags" "$VPY" -m pip wheel -q --no-cache-dir --no-deps -w "$wheels.tmp" "$tree/llama_cpp_python-$LLAMA_VERSION"
    rm -rf "$tree"
    rm -rf "$wheels" && mv "$wheels.tmp" "$wheels"
  fi
  "$VPY" -m pip install -q --force-reinstall --no-deps "$wheels"/llama_cpp_python-*.whl
  "$VPY" -m pip install -q "llama-cpp-python==$LLAMA_VERSION"  # its dependencies
  echo "$key" > "$stamp"
  rm -f "$VENV/bin/ggml-rpc-server"  # built against the old libggml
fi

# rpc-server, from the same sdist, linked against this venv's libggml.
rpc="$VENV/bin/ggml-rpc-server"
if [ ! -x "$rpc" ]; then
  echo "setup: building llama.cpp's rpc-server"
  lib=$("$VPY" -c "import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent / 'lib')")
  src=$(mktemp -d)
  tar -xzf "$sdist" -C "$src" "llama_cpp_python-$LLAMA_VERSION/vendor/llama.cpp/tools/rpc" \
    "llama_cpp_python-$LLAMA_VERSION/vendor/llama.cpp/ggml/include"
  root="$src/llama_cpp_python-$LLAMA_VERSION/vendor/llama.cpp"
  ${CXX:-g++} -O2 -std=c++17 -I"$root/ggml/include" "$root/tools/rpc/rpc-server.cpp" -o "$rpc.tmp" \
    -L"$lib" -lggml -lggml-base -Wl,-rpath,"$lib" -pthread
  mv "$rpc.tmp" "$rpc"
  rm -rf "$src"
fi

"$VPY" -m pip install -q ".[test]"

if [ "${SPECGGUF_SKIP_MODELS:-0}" != 1 ] && "$VPY" -c "import specgguf.llama.models" 2>/dev/null; then
  "$VPY" -m specgguf models fetch default poor-draft  # the pairs README, tests and benchmarks use
fi
echo "setup: done. Python: $VPY"
