#!/usr/bin/env bash
# Build llama.cpp's llama-server from the PyPI sdist of llama-cpp-python (which vendors
# llama.cpp), once, into a cache folder that later runs reuse. The real-server tests use it.
#   usage: build_llama_server.sh            -> prints the binary's path on stdout
# Cache: $TOKENBENCH_CACHE (default ~/.cache/tokenbench). Needs cmake, a C++ compiler, pip.
# A build takes minutes, so it says so on stderr before it starts, then shows progress (every
# 10% compiled, and a line at least once a minute); the compiler's own output goes to
# build.log in the cache folder, whose tail is printed if the build fails.
set -euo pipefail
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
cache="${TOKENBENCH_CACHE:-$HOME/.cache/tokenbench}/llama-server-$version"
bin="$cache/bin/llama-server"
if [ -x "$bin" ] && [ -d "$cache/gguf-py" ]; then echo "$bin"; exit 0; fi

# The expected time, as measured (README "Tests against a real server"): keep them in step.
expected="about 12 minutes on 2 busy cores, up to ~35 on a busier machine"
start=$SECONDS
say() { echo "build_llama_server: $*" >&2; }
elapsed() { printf '%d min %02d s' $(((SECONDS - start) / 60)) $(((SECONDS - start) % 60)); }
mkdir -p "$cache"
log="$cache/build.log"
: >"$log"
failed() {
  say "FAILED after $(elapsed) while $1; the last lines of $log:"
  tail -n 30 "$log" >&2
  exit 1
}

# Ninja's "[N/M]" step lines -> one line per 10% compiled, and one a minute when quiet.
progress() {
  local shown=-1 quiet=0 line n=0 m=0 pct
  while true; do
    if IFS= read -r -t 60 line; then
      printf '%s\n' "$line" >>"$log"
      if [[ $line =~ ^\[([0-9]+)/([0-9]+)\] ]]; then
        n=${BASH_REMATCH[1]} m=${BASH_REMATCH[2]}
        pct=$((n * 100 / m / 10 * 10))
        if ((pct > shown)); then
          shown=$pct quiet=$SECONDS
          say "compiled $pct% ($n of $m steps), $(elapsed)"
        fi
      fi
    elif (($? <= 128)); then # end of output (over 128: a minute passed without a line)
      break
    fi
    if ((SECONDS - quiet >= 60)); then
      quiet=$SECONDS
      say "still compiling ($n of $m steps), $(elapsed)"
    fi
  done
}

say "building llama.cpp's llama-server (llama-cpp-python $version sdist) into $cache"
say "this takes $expected; later runs reuse it"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download --no-deps --no-binary llama-cpp-python \
  "llama-cpp-python==$version" -d "$work" >>"$log" 2>&1 || failed "downloading the sdist"
tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work" || failed "unpacking the sdist"
src=$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)
say "configuring (cmake), $(elapsed)"
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF >>"$log" 2>&1 ||
  failed "configuring"
if ! cmake --build "$work/build" --target llama-server -j "$(nproc)" 2>&1 | progress; then
  failed "compiling"
fi
mkdir -p "$cache/bin"
cp "$work/build/bin/llama-server" "$bin.tmp" && mv "$bin.tmp" "$bin"
# The vendored gguf writer and the real Llama vocabulary, to make tiny models locally.
rm -rf "$cache/gguf-py" && cp -r "$src/gguf-py" "$cache/gguf-py"
cp "$src/models/ggml-vocab-llama-spm.gguf" "$cache/"
say "built in $(elapsed): $bin"
echo "$bin"
