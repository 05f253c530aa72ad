#!/usr/bin/env bash
# Cross-builds llama.cpp for a Raspberry Pi core from the pinned sdist that
# scripts/setup.sh builds the library from, with the flags that board's
# own set-up would use (scripts/llama_flags.sh --cpu CPU): the shared
# libraries llama-cpp-python loads (libllama, libggml*) and the RPC worker
# (tools/rpc/rpc-server.cpp against those libraries, as setup.sh builds it).
# Cached by the sdist version, the flags and the compiler; prints the folder:
# lib/ (the .so files) and bin/rpc-server.
#
#   bash scripts/build_llama_aarch64.sh cortex-a72     # Pi 4
#   bash scripts/build_llama_aarch64.sh cortex-a76     # Pi 5
#
# Needs g++-aarch64-linux-gnu (scripts/test_aarch64.sh installs it) and
# cmake. Only the libraries are built (no tools, tests or examples): about
# 4 minutes on 2 cores for the first core, a minute for each other (one
# build folder, kept with the cache: only ggml-cpu differs between cores).
set -euo pipefail
cd "$(dirname "$0")/.."
cpu=${1:?usage: build_llama_aarch64.sh cortex-a53|cortex-a72|cortex-a76}
LLAMA_VERSION=$(sed -n 's/^LLAMA_VERSION=//p' scripts/setup.sh)
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/specgguf"
sdist="$CACHE/llama-src/llama_cpp_python-$LLAMA_VERSION.tar.gz"
[ -f "$sdist" ] || { echo "build_llama_aarch64: $sdist is missing; run scripts/setup.sh first" >&2; exit 1; }
flags=$(bash scripts/llama_flags.sh --cpu "$cpu")
case "$flags" in *GGML_NATIVE=ON*) echo "build_llama_aarch64: no flags known for $cpu" >&2; exit 2 ;; esac
CMAKE=${CMAKE:-$(command -v cmake || echo .venv/bin/cmake)}
patches=$(cat scripts/patches/*.patch | sha256sum | cut -c1-16)  # applied as setup.sh applies them
key=$(printf '%s %s %s 2 %s' "$LLAMA_VERSION" "$flags" "$(aarch64-linux-gnu-gcc -dumpfullversion)" "$patches" | sha256sum | cut -c1-16)
out="$CACHE/llama-aarch64/$cpu-$key"
if [ ! -f "$out/lib/libllama.so" ] || [ ! -x "$out/bin/rpc-server" ]; then
  # One build folder for every core: only ggml-cpu takes the CPU's flags, so
  # the second core rebuilds that library alone (about a minute, not four).
  base="$CACHE/llama-aarch64/build-$(printf '%s %s %s' "$LLAMA_VERSION" "$(aarch64-linux-gnu-gcc -dumpfullversion)" "$patches" | sha256sum | cut -c1-12)"
  src="$base/llama_cpp_python-$LLAMA_VERSION/vendor/llama.cpp"
  if [ ! -f "$src/CMakeLists.txt" ]; then
    rm -rf "$base" && mkdir -p "$base"
    tar -xzf "$sdist" -C "$base" "llama_cpp_python-$LLAMA_VERSION/vendor/llama.cpp"
    for p in scripts/patches/*.patch; do
      patch -s -p1 -d "$base/llama_cpp_python-$LLAMA_VERSION" < "$p"
    done
  fi
  echo "build_llama_aarch64: building llama.cpp $LLAMA_VERSION for $cpu with: $flags (about 4 minutes on 2 cores, then a minute per other core)" >&2
  # shellcheck disable=SC2086  # $flags is a list of words
  "$CMAKE" -S "$src" -B "$base/build" -G Ninja -DCMAKE_BUILD_TYPE=Release $flags \
    -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
    -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ \
    -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='$ORIGIN' \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >"$base/cmake.log" 2>&1 \
    || { tail -30 "$base/cmake.log" >&2; exit 1; }
  grep -E "Adding CPU backend variant" "$base/cmake.log" >&2 || true
  "$CMAKE" --build "$base/build" -j "${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" --target llama >&2
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/out/lib" "$work/out/bin"
  cp -a "$base"/build/bin/lib*.so* "$work/out/lib/"  # with the .so.0 names they link by
  aarch64-linux-gnu-g++ -O2 -std=c++17 -I"$src/ggml/include" "$src/tools/rpc/rpc-server.cpp" \
    -o "$work/out/bin/rpc-server" -L"$work/out/lib" -lggml -lggml-base -Wl,-rpath,'$ORIGIN/../lib' -pthread
  echo "$flags" > "$work/out/flags"
  rm -rf "$out" && mkdir -p "$(dirname "$out")" && mv "$work/out" "$out"
fi
echo "$out"
