#!/usr/bin/env bash
# One-step set-up: a virtualenv in .venv with llama-cpp-python built with the
# right flags for this CPU, specgguf itself (its C++ core built by pip), the
# test extras, and the default model pair.
#
# Why not plain `pip install llama-cpp-python`: on x86-64 its default
# -march=native build crashes on CPUs with AMX (Q4/Q2 matmuls segfault in
# ggml_backend_amx_mul_mat), so x86 names the CPU's features itself (SSE,
# AVX2, AVX-512: everything native would use except AMX);
# on aarch64 boards the native build is what makes llama.cpp fast, so it
# keeps GGML_NATIVE=ON. The built wheel is kept in a cache keyed by the
# flags, because pip's own wheel cache ignores CMAKE_ARGS.
#
# Env: SPECGGUF_VENV (default .venv), SPECGGUF_PYTHON (default python3),
#      SPECGGUF_SKIP_MODELS=1 to skip fetching models.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_VERSION=0.3.36
VENV=${SPECGGUF_VENV:-.venv}
PY=${SPECGGUF_PYTHON:-python3}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}

case "$(uname -m)" in
  x86_64|amd64)
    flags="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"
    has() { grep -qw "$1" /proc/cpuinfo; }
    if has avx2; then
      flags="$flags -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
      # What -march=native would add, minus AMX: batched F32 forwards (the
      # target's verification) run about 10% faster with AVX-512 here.
      if has avx512f && has avx512cd && has avx512vl && has avx512dq && has avx512bw; then
        flags="$flags -DGGML_AVX512=ON"
        if has avx512vbmi; then flags="$flags -DGGML_AVX512_VBMI=ON"; fi
        if has avx512_vnni; then flags="$flags -DGGML_AVX512_VNNI=ON"; fi
      fi
    fi ;;
  *)  # aarch64 boards and everything else: native is right (NEON, dotprod where present)
    flags="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF" ;;
esac

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
"$VPY" -m pip install -q --upgrade pip

if ! "$VPY" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$LLAMA_VERSION')" 2>/dev/null; then
  key=$(printf '%s %s %s' "$LLAMA_VERSION" "$flags" "$("$VPY" -c 'import sys; print(sys.version_info[:2])')" | sha256sum | cut -c1-16)
  cache="${XDG_CACHE_HOME:-$HOME/.cache}/specgguf/llama-wheels/$key"
  if ! ls "$cache"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "setup: building llama-cpp-python $LLAMA_VERSION with: $flags (several minutes)"
    "$VPY" -m pip install -q scikit-build-core cmake ninja
    CMAKE_ARGS="$flags" "$VPY" -m pip wheel -q --no-cache-dir --no-deps -w "$cache.tmp" \
      "llama-cpp-python==$LLAMA_VERSION"
    mv "$cache.tmp" "$cache"
  fi
  "$VPY" -m pip install -q "$cache"/llama_cpp_python-*.whl
fi

"$VPY" -m pip install -q ".[test]"

if [ "${SPECGGUF_SKIP_MODELS:-0}" != 1 ] && "$VPY" -c "import specgguf.models" 2>/dev/null; then
  "$VPY" -m specgguf models fetch default
fi
echo "setup: done. Python: $VPY"
