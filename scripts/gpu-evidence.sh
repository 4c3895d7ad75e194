#!/usr/bin/env bash
# The first GPU evidence: engine step costs of real model shapes on the lent GPU, and the
# embedder's throughput there. Run from the repository root on the GPU machine (no network;
# Python 3.12 with torch, onnxruntime, transformers; CUDA toolchain), with .gpu-carry/ made
# by scripts/gpu-evidence-pack.sh carried along. Every figure goes to $OUT as JSON.
#
#   scripts/gpu-evidence.sh          # on the GPU: llama.cpp built for sm_90, 0.5B and 8B shapes
#   scripts/gpu-evidence.sh --cpu    # the rehearsal on a CPU: the same steps, tiny shapes
#
# The models have random weights (scripts/random-gguf.py): step times do not depend on the
# values, and the figures say they are random-weight timings.
set -euo pipefail
OUT=${OUT:-gpu-evidence}
PYTHON=${PYTHON:-python3}
mode=gpu
[[ "${1:-}" == "--cpu" ]] && mode=cpu
carry=.gpu-carry
[[ -d "${carry}" ]] || { echo "no ${carry}/: run scripts/gpu-evidence-pack.sh first" >&2; exit 2; }
mkdir -p "${OUT}"
work=$(mktemp -d)
site="${work}/site"
trap 'rm -rf "${work}"' EXIT
stamp() { echo "[$(date +%T)] $*"; }

stamp "environment"
{
    echo "mode: ${mode}"
    "${PYTHON}" --version
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
    nvcc --version 2>/dev/null | tail -1 || true
    nproc
} > "${OUT}/environment.txt"
cat "${OUT}/environment.txt"

stamp "wheels the machine lacks"
"${PYTHON}" -m pip install -q --no-index --no-deps --target "${site}" "${carry}"/wheels/*.whl
export PYTHONPATH="${site}:${PWD}/addon"

stamp "llama.cpp from the pinned llama-cpp-python sources (${mode})"
tar xzf "${carry}/llama_cpp_python-0.3.36-trimmed.tar.gz" -C "${work}"
if [[ "${mode}" == gpu ]]; then
    cmake_args="-DGGML_CUDA=on -DGGML_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAVA_BUILD=OFF"
    cmake_args+=" -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--exclude-libs,ALL"  # see engines/native.py
else
    cmake_args="-DLLAVA_BUILD=OFF"
fi
start=$(date +%s)
CMAKE_ARGS="${cmake_args}" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    "${PYTHON}" -m pip install -q --no-index --no-deps --no-build-isolation \
    --target "${site}" "${work}/llama_cpp_python-0.3.36" > "${OUT}/build.log" 2>&1
echo "{\"build_s\": $(( $(date +%s) - start )), \"cmake_args\": \"${cmake_args}\"}" \
    > "${OUT}/build.json"
cat "${OUT}/build.json"
# The start-up crash's check: no library of the build exports a C++ runtime of its own.
"${PYTHON}" - <<'PY' | tee "${OUT}/runtime-copies.txt"
from fairlane.engines import native
copies = native.runtime_copies(native.llama_cpp_lib_dir())
print("\n".join(c.describe() for c in copies) or "no library exports a C++ runtime of its own")
PY

# The 8B shape only (the 0.5B one was measured on 2026-12-04), now with decodes beside held KV
# cells (--occupancy), the term the first run could not fit.
if [[ "${mode}" == gpu ]]; then
    shape=llama-3.1-8b
    layers=999
    sizes=(--prefill-sizes 64 128 256 512 1024 2048 --decode-sizes 1 2 4 8 16 32 64
           --context-sizes 256 1024 4096 8192 --occupancy 2x1024 4x2048 8x2048 8x4096)
    e2e=(--chats 8 --background 6 --rounds 2 --profile h200)
    host=(--streams 8 32 --rounds 1 --duration 15)
else
    shape=tiny
    layers=0
    sizes=(--prefill-sizes 64 256 --decode-sizes 1 2 --context-sizes 256 --occupancy 2x256)
    e2e=(--chats 3 --background 2 --rounds 1)
    host=(--streams 8 --rounds 1 --duration 5)
fi
model="${work}/${shape}.gguf"
stamp "random-weight model: ${shape}"
"${PYTHON}" scripts/random-gguf.py --shape "${shape}" --tokenizer "${carry}/tokenizer.json.gz" \
    "${model}"
stamp "engine step costs: ${shape}"
"${PYTHON}" -m fairlane bench engine --model "${model}" --gpu-layers "${layers}" \
    "${sizes[@]}" --json "${OUT}/engine-${shape}.json"

# The server end to end: chat turns under a flood of unique background prompts, fairlane then
# fcfs, rounds alternating; each round's /v1/stats (the cost model's error, host time per
# step) in the JSON; the GPU's utilisation sampled beside it.
util=""
if [[ "${mode}" == gpu ]] && command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader \
        -lms 500 > "${OUT}/gpu-utilisation.csv" 2>/dev/null &
    util=$!
fi
stamp "end to end: chat under a background flood (${shape})"
"${PYTHON}" -m fairlane bench interference --model "${model}" --gpu-layers "${layers}" \
    "${e2e[@]}" --json "${OUT}/e2e-interference.json"
stamp "host time per step (${shape})"
"${PYTHON}" -m fairlane bench host --model "${model}" --gpu-layers "${layers}" \
    "${host[@]}" --max-tokens 64 --json "${OUT}/host.json"
[[ -n "${util}" ]] && kill "${util}"
rm -f "${model}"

stamp "embeddings: the default embedder's shape (MiniLM-L6), random weights, texts/s by batch"
"${PYTHON}" - "${mode}" "${OUT}/embeddings.json" <<'PY'
import json, sys, time
import torch
from transformers import BertConfig, BertModel

mode, out = sys.argv[1], sys.argv[2]
device = "cuda" if mode == "gpu" and torch.cuda.is_available() else "cpu"
config = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                    num_attention_heads=12, intermediate_size=1536)
model = BertModel(config).to(device).eval()
results = {"device": device, "tokens_per_text": 64, "texts_per_s": {}}
batches = (8, 32, 128, 512) if mode == "gpu" else (8, 32)
for dtype in ((torch.float32, torch.float16) if device == "cuda" else (torch.float32,)):
    model = model.to(dtype)
    name = str(dtype).removeprefix("torch.")
    results["texts_per_s"][name] = {}
    for batch in batches:
        ids = torch.randint(0, 30522, (batch, 64), device=device)
        mask = torch.ones_like(ids)
        times = []
        with torch.inference_mode():
            for _ in range(8):
                if device == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                model(input_ids=ids, attention_mask=mask)
                if device == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
        median = sorted(times[2:])[len(times[2:]) // 2]
        results["texts_per_s"][name][batch] = round(batch / median, 1)
        print(f"  {name} batch {batch:>4}: {batch / median:,.0f} texts/s")
json.dump(results, open(out, "w"), indent=1)
PY
stamp "done: $(ls "${OUT}")"
