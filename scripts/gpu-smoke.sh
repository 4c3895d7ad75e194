#!/usr/bin/env bash
# Run once on a machine with an NVIDIA GPU, after building the CUDA image (or a virtual
# environment with the CUDA builds): does each engine really run on the GPU?
#
#   scripts/gpu-smoke.sh                      # `fairlane` on PATH (a venv), GPU settings
#   FAIRLANE="docker run --rm --gpus all --network host --entrypoint fairlane fairlane:cuda" scripts/gpu-smoke.sh
#   scripts/gpu-smoke.sh --cpu                # rehearsal on a machine without a GPU
#
# It starts the server with every engine on the GPU, prints each engine's device (asked for,
# obtained, and how that was found out), runs one chat turn, one sentence spoken and
# transcribed back, and one embeddings call, then `fairlane bench engine` with the model on
# the GPU. It exits 1 when an engine did not get its GPU. Writes $OUT (default ./gpu-smoke).
set -euo pipefail

FAIRLANE=${FAIRLANE:-fairlane}
PORT=${PORT:-18844}
OUT=${OUT:-gpu-smoke}
URL="http://127.0.0.1:${PORT}"
mkdir -p "${OUT}"

gpu=(--set llm.gpu_layers=999 --set stt.device=cuda --set stt.compute_type=float16
     --set embed.device=cuda --set embed.backend=onnx --set tts.device=cuda)
layers=999
if [[ "${1:-}" == "--cpu" ]]; then
    gpu=()
    layers=0
fi

data=$(mktemp -d)
# shellcheck disable=SC2086  # FAIRLANE may be a whole docker command
${FAIRLANE} serve --port "${PORT}" --set "server.data_dir=${data}" --set wyoming.port=0 \
    "${gpu[@]}" > "${OUT}/serve.log" 2>&1 &
server=$!
trap 'kill "${server}" 2>/dev/null || true; wait "${server}" 2>/dev/null || true' EXIT

for _ in $(seq 1 600); do
    curl -fsS "${URL}/health" > "${OUT}/health.json" 2>/dev/null && break
    kill -0 "${server}" 2>/dev/null || { tail -20 "${OUT}/serve.log"; exit 1; }
    sleep 1
done

echo "== devices (asked → obtained)"
python3 - "${OUT}/health.json" <<'PY'
import json, sys
health = json.load(open(sys.argv[1]))
for name, d in health["devices"].items():
    print(f"  {name:6} {d['asked']:>4} → {d['got']:<4} {'ok' if d['ok'] else 'NOT OBTAINED'}  {d['detail']}")
print("  status:", health["status"])
PY

post() { curl -fsS -H 'Content-Type: application/json' "${URL}$1" -d "$2"; }

echo "== one chat turn"
post /v1/chat/completions '{"messages": [{"role": "user", "content": "Say hello in five words."}],
  "max_tokens": 24, "temperature": 0}' > "${OUT}/chat.json"
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('  ', r['choices'][0]['message']['content'].strip(), r['usage'])" "${OUT}/chat.json"

echo "== one sentence spoken, then transcribed"
post /v1/audio/speech '{"input": "Turn on the kitchen light.", "response_format": "wav"}' \
    > "${OUT}/speech.wav"
curl -fsS "${URL}/v1/audio/transcriptions" -F "file=@${OUT}/speech.wav;type=audio/wav" \
    > "${OUT}/transcription.json"
python3 -c "import json,sys; print('  ', json.load(open(sys.argv[1]))['text'])" "${OUT}/transcription.json"

echo "== one embeddings call"
post /v1/embeddings '{"input": ["boiler service", "bin collection", "school trip"]}' \
    > "${OUT}/embeddings.json"
python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['data']; print('  ', len(d), 'vectors of', len(d[0]['embedding']))" "${OUT}/embeddings.json"

kill "${server}"; wait "${server}" 2>/dev/null || true
trap - EXIT

echo "== engine step costs, the model on the GPU"
# shellcheck disable=SC2086
${FAIRLANE} bench engine --gpu-layers "${layers}" --json "${OUT}/engine.json" | tail -20

python3 -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))['status'] == 'ok' else 1)" \
    "${OUT}/health.json"
