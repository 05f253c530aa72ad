#!/usr/bin/env bash
# Builds llama.cpp's llama-server, the peer server the benchmarks compare
# against, from the same pinned llama-cpp-python sdist that scripts/setup.sh
# builds the library from, with the same CPU flags (scripts/llama_flags.sh).
# Bench only: nothing in specgguf runs it. About 4 minutes on 2 cores, then
# cached by the sdist version and the flags. Prints the binary's path.
#
# No web UI (its assets are downloaded at build time, and the machine may be
# offline), no curl, no OpenSSL: the benchmark talks to it over loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMA_VERSION=$(sed -n 's/^LLAMA_VERSION=//p' scripts/setup.sh)
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/specgguf"
sdist="$CACHE/llama-src/llama_cpp_python-$LLAMA_VERSION.tar.gz"
[ -f "$sdist" ] || { echo "build_llama_server: $sdist is missing; run scripts/setup.sh first" >&2; exit 1; }
flags=$(bash scripts/llama_flags.sh)
key=$(printf '%s %s server' "$LLAMA_VERSION" "$flags" | sha256sum | cut -c1-16)
bin="$CACHE/llama-server/$key/llama-server"
if [ ! -x "$bin" ]; then
  echo "build_llama_server: building llama-server $LLAMA_VERSION with: $flags (about 4 minutes on 2 cores)" >&2
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  tar -xzf "$sdist" -C "$work" "llama_cpp_python-$LLAMA_VERSION/vendor/llama.cpp"
  src="$work/llama_cpp_python-$LLAMA_VERSION/vendor/llama.cpp"
  # shellcheck disable=SC2086  # $flags is a list of words
  cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release $flags -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF >&2
  cmake --build "$work/build" -j "${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" --target llama-server >&2
  mkdir -p "$(dirname "$bin")"
  cp "$work/build/bin/llama-server" "$bin.tmp"
  mv "$bin.tmp" "$bin"
fi
echo "$bin"
