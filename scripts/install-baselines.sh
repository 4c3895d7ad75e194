#!/usr/bin/env bash
# The stack a household runs today, for `fairlane bench family --targets separate` and
# `fairlane bench throughput`: llama.cpp's llama-server built from the pinned sources, and
# wyoming-faster-whisper, wyoming-piper and an embedding server (sentence-transformers with its
# ONNX backend) each in its own virtual environment, as separate installs would be.
# Usage: scripts/install-baselines.sh   (everything goes under .bench/; run again: no-op)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
scripts/build-llama-server.sh
if [ ! -x .bench/wyoming-faster-whisper/bin/wyoming-faster-whisper ]; then
  "$PYTHON" -m venv .bench/wyoming-faster-whisper
  .bench/wyoming-faster-whisper/bin/pip install -q wyoming-faster-whisper==3.8.1
fi
if [ ! -x .bench/wyoming-piper/bin/wyoming-piper ]; then
  # Piper's own Wyoming server (piper-tts is GPL-3.0: a benchmark baseline in its own venv,
  # never part of Fairlane's install).
  "$PYTHON" -m venv .bench/wyoming-piper
  .bench/wyoming-piper/bin/pip install -q wyoming-piper==2.5.2
fi
if [ ! -f .bench/embedding-server/.installed ]; then
  "$PYTHON" -m venv .bench/embedding-server
  # The CPU build of torch first (an open range would fetch a CUDA build), then what
  # `pip install "sentence-transformers[onnx]"` resolves to.
  .bench/embedding-server/bin/pip install -q torch==2.13.0
  .bench/embedding-server/bin/pip install -q "sentence-transformers[onnx]==5.7.0"
  touch .bench/embedding-server/.installed
fi
echo "baselines ready in .bench/"
