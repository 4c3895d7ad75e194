#!/usr/bin/env bash
# Pack what scripts/gpu-evidence.sh needs on a lent GPU machine that has no network, into
# .gpu-carry/ (carried to the machine with the working tree; 64 MiB at most in all):
#   - llama-cpp-python's pinned sources, trimmed (no bundled models, docs, tests, or the
#     GPU backends other than CUDA), to be built there with CUDA for that GPU;
#   - the default model's tokenizer (scripts/random-gguf.py writes the models there);
#   - the few pure-Python wheels the machine's Python lacks.
# Usage: scripts/gpu-evidence-pack.sh   (on this machine, with .venv made by `make install`)
set -euo pipefail
cd "$(dirname "$0")/.."
carry=.gpu-carry
rm -rf "${carry}"
mkdir -p "${carry}/wheels"
work=$(mktemp -d)
trap 'rm -rf "${work}"' EXIT

.venv/bin/pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "${work}"
tar xzf "${work}/llama_cpp_python-0.3.36.tar.gz" -C "${work}"
src="${work}/llama_cpp_python-0.3.36"
vendor="${src}/vendor/llama.cpp"
rm -rf "${vendor:?}/models" "${vendor}/docs" "${vendor}/tests" "${vendor}/benches" \
    "${vendor:?}/media" "${vendor:?}/.github" "${src}/examples" "${src}/docs" "${src}/.git"
for backend in metal sycl vulkan opencl hexagon et cann musa webgpu zdnn openvino rpc; do
    rm -rf "${vendor:?}/ggml/src/ggml-${backend}"
done
tar czf "${carry}/llama_cpp_python-0.3.36-trimmed.tar.gz" -C "${work}" llama_cpp_python-0.3.36

.venv/bin/python scripts/random-gguf.py --export-tokenizer "${carry}/tokenizer.json.gz" \
    --from "$(.venv/bin/python -c 'from fairlane.engines import models; print(models.resolve_llm(models.DEFAULT_LLM))')"

# Pure-Python wheels for the machine's Python 3.12: building llama-cpp-python without
# network (scikit-build-core and its needs), and what Fairlane's engine and bench import.
.venv/bin/pip download -q --no-deps --only-binary :all: --python-version 3.12 \
    --platform manylinux2014_x86_64 -d "${carry}/wheels" \
    scikit-build-core==0.11.6 pathspec==0.12.1 diskcache==5.6.3 voluptuous==0.16.0 \
    gguf==0.19.0 prometheus-client==0.26.0
du -sh "${carry}" "${carry}"/*
