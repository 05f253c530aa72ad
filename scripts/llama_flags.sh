#!/usr/bin/env bash
# Prints the CMake flags llama.cpp is built with on this machine: one place,
# read by scripts/setup.sh (llama-cpp-python) and bench/vs_llama_server.py
# (llama-server), so the peer is built exactly like the library we run.
#
# x86-64 names the CPU's features itself (SSE, AVX2, AVX-512: everything
# -march=native would use except AMX, whose Q4/Q2 matmuls segfault on these
# CPUs); aarch64 boards and everything else keep GGML_NATIVE=ON, which is
# what makes llama.cpp fast there (NEON, dotprod where present). Every
# platform gets -DGGML_RPC=ON (a target split over several boards).
set -euo pipefail
case "$(uname -m)" in
  x86_64|amd64)
    flags="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DGGML_RPC=ON"
    has() { grep -qw "$1" /proc/cpuinfo; }
    if has avx2; then
      flags="$flags -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
      # Batched F32 forwards (the target's verification) run about 10% faster
      # with AVX-512 where the CPU has it.
      if has avx512f && has avx512cd && has avx512vl && has avx512dq && has avx512bw; then
        flags="$flags -DGGML_AVX512=ON"
        if has avx512vbmi; then flags="$flags -DGGML_AVX512_VBMI=ON"; fi
        if has avx512_vnni; then flags="$flags -DGGML_AVX512_VNNI=ON"; fi
      fi
    fi ;;
  *) flags="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DGGML_RPC=ON" ;;
esac
echo "$flags"
