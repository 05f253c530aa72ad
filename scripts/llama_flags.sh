#!/usr/bin/env bash
# Prints the CMake flags llama.cpp is built with on this machine: one place,
# read by scripts/setup.sh (llama-cpp-python), bench/vs_llama_server.py
# (llama-server) and scripts/build_llama_aarch64.sh (the Pi builds tested
# under emulation), so every build of llama.cpp gets the same flags.
#
#   bash scripts/llama_flags.sh                  this machine
#   bash scripts/llama_flags.sh --cpu cortex-a76 what a Pi 5 gets (cortex-a53, -a72, -a76)
#
# x86-64 names the CPU's features itself (SSE, AVX2, AVX-512: everything
# -march=native would use except AMX, whose Q4/Q2 matmuls segfault on these
# CPUs). The Raspberry Pi cores are named by their architecture and the
# features ggml reads, exactly what GGML_NATIVE=ON's -mcpu=native and
# feature probes give there (same __ARM_FEATURE_* macros, so the same code):
# Cortex-A53 (Pi 3, Zero 2) and A72 (Pi 4, 400, CM4) are ARMv8-A with NEON
# and no dot product; the A76 (Pi 5, CM5) is ARMv8.2-A with dotprod and FP16
# arithmetic. Named, the flags also key setup.sh's wheel cache, so a cache
# shared by a Pi 5 and a Pi 4 (a moved SD card, an NFS home) never hands the
# Pi 4 a wheel with instructions it lacks (SIGILL). Other aarch64 CPUs keep
# GGML_NATIVE=ON. Every platform gets -DGGML_RPC=ON (a target split over
# several boards).
set -euo pipefail
common="-DLLAVA_BUILD=OFF -DGGML_RPC=ON"

arm_flags() {  # $1: cortex-a53 | cortex-a72 | cortex-a76 | anything else (native)
  case "$1" in
    cortex-a53|cortex-a72) echo "-DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=armv8-a+crc $common" ;;
    cortex-a76) echo "-DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16 $common" ;;
    *) echo "-DGGML_NATIVE=ON $common" ;;
  esac
}

if [ "${1:-}" = "--cpu" ]; then
  [ -n "${2:-}" ] || { echo "usage: llama_flags.sh [--cpu cortex-a53|cortex-a72|cortex-a76]" >&2; exit 2; }
  arm_flags "$2"
  exit 0
fi

case "$(uname -m)" in
  x86_64|amd64)
    flags="-DGGML_NATIVE=OFF $common"
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
  aarch64|arm64)
    # ARM's part numbers (the "CPU part" line of /proc/cpuinfo; all cores of a Pi are alike).
    part=$(sed -n 's/^CPU part[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo 2>/dev/null | head -1)
    case "$part" in
      0xd03) cpu=cortex-a53 ;;
      0xd08) cpu=cortex-a72 ;;
      0xd0b) cpu=cortex-a76 ;;
      *) cpu=native ;;
    esac
    flags=$(arm_flags "$cpu") ;;
  *) flags="-DGGML_NATIVE=ON $common" ;;
esac
echo "$flags"
