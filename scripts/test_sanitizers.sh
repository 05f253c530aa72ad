#!/usr/bin/env bash
# The C++ core under sanitizers (CI runs this after the test suite):
#  1. AddressSanitizer + UndefinedBehaviorSanitizer: cpp/test_kernels (every
#     path vs scalar), then the op tests through an instrumented extension.
#  2. UndefinedBehaviorSanitizer on aarch64 under qemu (-cpu cortex-a72): the
#     NEON path's kernel test (ASan's shadow memory does not fit qemu-user).
#  3. libFuzzer (clang) on the ops for a bounded time (SPECGGUF_FUZZ_SECONDS,
#     default 60), with ASan + UBSan.
# Every report is fatal (-fno-sanitize-recover, halt_on_error).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${SPECGGUF_SAN_WORK:-/tmp/specgguf-sanitizers}
FUZZ_SECONDS=${SPECGGUF_FUZZ_SECONDS:-60}
SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1"
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
mkdir -p "$WORK"

source scripts/kernel_objs.sh

echo "== ASan + UBSan: kernel test (x86-64)"
kernel_objs g++ "$WORK/x86" x86 $SAN
g++ -std=c++17 -Icpp $SAN cpp/test_kernels.cpp "$WORK"/x86/*.o -o "$WORK/test_kernels"
"$WORK/test_kernels" | tail -1

echo "== ASan + UBSan: the op tests through an instrumented extension"
PKG="$WORK/pkg/specgguf"
rm -rf "$WORK/pkg" && mkdir -p "$PKG"
cp -r src/specgguf/. "$PKG/" && find "$PKG" -name __pycache__ -prune -exec rm -rf {} +  # the package, folders and all
PY=.venv/bin/python
"$PY" -c "import pybind11" 2>/dev/null || "$PY" -m pip install -q pybind11
EXT=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
INC=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
PYBIND=$("$PY" -c "import pybind11; print(pybind11.get_include())")
g++ -std=c++17 -shared -fPIC -Icpp -I"$INC" -I"$PYBIND" $SAN cpp/bindings.cpp "$WORK"/x86/*.o -o "$PKG/_core$EXT"
LD_PRELOAD="$(g++ -print-file-name=libasan.so):$(g++ -print-file-name=libubsan.so)" PYTHONPATH="$WORK/pkg" \
  "$PY" -m pytest -q -p no:cacheprovider tests/test_verify_exact.py tests/test_verify_errors.py \
  tests/test_verify_law.py tests/test_invariant.py tests/test_fuzz.py tests/test_sampling.py

if command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null; then
  echo "== UBSan: kernel test on aarch64 (qemu -cpu cortex-a72)"
  UB="-fsanitize=undefined -fno-sanitize-recover=all -g -O1"
  kernel_objs aarch64-linux-gnu-g++ "$WORK/arm" arm $UB
  aarch64-linux-gnu-g++ -std=c++17 -static -Icpp $UB cpp/test_kernels.cpp "$WORK"/arm/*.o -o "$WORK/test_kernels_arm"
  qemu-aarch64 -cpu cortex-a72 "$WORK/test_kernels_arm" | tail -1
fi

echo "== libFuzzer on the ops, ${FUZZ_SECONDS} s"
CLANG=$(command -v clang++-14 || command -v clang++ || true)
RT=$(ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a 2>/dev/null | head -1 || true)
if { [ -z "$CLANG" ] || [ -z "$RT" ]; } && command -v apt-get >/dev/null; then
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends clang-14 libclang-rt-14-dev; } >/dev/null 2>&1 || true
  CLANG=$(command -v clang++-14 || true)
  RT=$(ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a 2>/dev/null | head -1 || true)
fi
if [ -z "$CLANG" ] || [ -z "$RT" ]; then
  echo "skipped: no clang with libFuzzer (apt-get install clang-14 libclang-rt-14-dev)"
  exit 0
fi
FZ="-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -g -O1"
kernel_objs "$CLANG" "$WORK/fuzz" x86 -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -g -O1
"$CLANG" -std=c++17 -Icpp $FZ cpp/fuzz_ops.cpp "$WORK"/fuzz/*.o -o "$WORK/fuzz_ops"
mkdir -p "$WORK/corpus"
if ! "$WORK/fuzz_ops" -max_total_time="$FUZZ_SECONDS" -max_len=4096 -print_final_stats=1 "$WORK/corpus" \
     > "$WORK/fuzz.log" 2>&1; then
  tail -40 "$WORK/fuzz.log"
  echo "fuzz_ops found a problem (the input is in $WORK/crash-*)" >&2
  exit 1
fi
grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb)|DONE" "$WORK/fuzz.log" | tail -3
