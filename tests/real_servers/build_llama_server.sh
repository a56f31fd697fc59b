#!/usr/bin/env bash
# Build llama.cpp's llama-server from the PyPI sdist of llama-cpp-python (which vendors
# llama.cpp), once, into a cache folder that later runs reuse. The real-server tests use it.
#   usage: build_llama_server.sh            -> prints the binary's path
# Cache: $TOKENBENCH_CACHE (default ~/.cache/tokenbench). Needs cmake, a C++ compiler, pip.
set -euo pipefail
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
cache="${TOKENBENCH_CACHE:-$HOME/.cache/tokenbench}/llama-server-$version"
bin="$cache/bin/llama-server"
if [ -x "$bin" ] && [ -d "$cache/gguf-py" ]; then echo "$bin"; exit 0; fi

mkdir -p "$cache"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
  "llama-cpp-python==$version" -d "$work" >&2
tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
src=$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$work/build" --target llama-server -j "$(nproc)" >&2
mkdir -p "$cache/bin"
cp "$work/build/bin/llama-server" "$bin.tmp" && mv "$bin.tmp" "$bin"
# The vendored gguf writer and the real Llama vocabulary, to make tiny models locally.
rm -rf "$cache/gguf-py" && cp -r "$src/gguf-py" "$cache/gguf-py"
cp "$src/models/ggml-vocab-llama-spm.gguf" "$cache/"
echo "$bin"
