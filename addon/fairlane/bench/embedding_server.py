"""A stand-in for the embedding server a household runs beside llama-server (Text Embeddings
Inference, Infinity, or Ollama's embeddings): sentence-transformers with its own ONNX int8
backend behind a plain HTTP server, one request at a time, answering OpenAI's
`POST /v1/embeddings`.

It is a stand-in and says so in every table it appears in. It runs in its own virtual
environment (scripts/install-baselines.sh), so it imports nothing from Fairlane:

    python embedding_server.py MODEL_DIR PORT THREADS
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any


def load(model_dir: str, threads: int) -> Any:
    """The model on sentence-transformers' ONNX backend, dynamically quantised to int8 once
    (its own `export_dynamic_quantized_onnx_model`, AVX2 configuration)."""
    from pathlib import Path

    import onnxruntime
    from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    kwargs: dict[str, Any] = {"provider": "CPUExecutionProvider", "session_options": options}
    found = sorted(Path(model_dir, "onnx").glob("model_*int8_avx2.onnx"))
    if not found:
        model = SentenceTransformer(model_dir, backend="onnx", model_kwargs=kwargs)
        export_dynamic_quantized_onnx_model(model, "avx2", model_dir)
        found = sorted(Path(model_dir, "onnx").glob("model_*int8_avx2.onnx"))
    kwargs["file_name"] = f"onnx/{found[0].name}"
    return SentenceTransformer(model_dir, backend="onnx", model_kwargs=kwargs)


def main() -> None:
    model_dir, port, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    model = load(model_dir, threads)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._reply(200, {"status": "ok"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
            vectors = model.encode(texts, batch_size=32)
            data = [
                {"object": "embedding", "index": i, "embedding": [float(x) for x in vector]}
                for i, vector in enumerate(vectors)
            ]
            self._reply(200, {"object": "list", "data": data})

        def _reply(self, status: int, payload: dict[str, Any]) -> None:
            raw = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args: object) -> None:
            pass

    HTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
