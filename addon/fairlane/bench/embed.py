"""`fairlane bench embed`: the background lane's embedding throughput.

- direct: `SentenceTransformer.encode` on sentence-transformers' own ONNX int8 backend at batch
  8/16/32/64 (its best is the baseline; it runs in its own environment from
  scripts/install-baselines.sh, as a user would install it), and Fairlane's engine with the
  configured backend called directly;
- server: one bulk `POST /v1/embeddings` (class background) through HTTP, the policy and the
  device loop;
- interference: the same bulk request while a chat stream runs, against alone, with the chat's
  ITL beside it.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from fairlane.bench.servers import fairlane_server, stream_chat
from fairlane.engines import models
from fairlane.runtime.metrics import percentile

NOTES = [
    "The dishwasher's eco programme washes at 45 degrees and takes three hours.",
    "The school trip to the museum is on Friday; children need a packed lunch.",
    "Banana bread: mash three ripe bananas, add flour and sugar, bake for an hour.",
    "The boiler was serviced in March and the next service is due next spring.",
    "Car insurance renews on the first of June; compare quotes before then.",
    "Water the tomatoes every evening in July unless it has rained.",
]


def sentence_transformers_onnx_int8(corpus: list[str], threads: int) -> dict[int, float]:
    """Texts/s of `SentenceTransformer.encode` on its ONNX backend, int8, at batch 8–64, in the
    baseline's own virtual environment (its dependencies conflict with Fairlane's)."""
    import subprocess

    from fairlane.bench.family_targets import BASELINES, embedding_model_copy

    python = BASELINES / "embedding-server/bin/python"
    if not python.is_file():
        raise ValueError(f"no {python}: run scripts/install-baselines.sh first")
    script = (
        "import json, sys, time\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "import embedding_server\n"
        "corpus = json.load(sys.stdin)\n"
        "model = embedding_server.load(sys.argv[2], int(sys.argv[3]))\n"
        "model.encode(corpus[:64], batch_size=32)\n"
        "out = {}\n"
        "for batch in (8, 16, 32, 64):\n"
        "    start = time.perf_counter()\n"
        "    model.encode(corpus, batch_size=batch)\n"
        "    out[batch] = len(corpus) / (time.perf_counter() - start)\n"
        "print(json.dumps(out))\n"
    )
    folder = str(Path(__file__).parent)
    done = subprocess.run(
        [str(python), "-c", script, folder, str(embedding_model_copy()), str(threads)],
        input=json.dumps(corpus),
        capture_output=True,
        text=True,
        check=True,
    )
    return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def texts(count: int) -> list[str]:
    return [f"Note {i}: {NOTES[i % len(NOTES)]}" for i in range(count)]


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{url}/v1/embeddings",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return dict(json.loads(response.read()))


def embed_bench(threads: int, count: int, backend: str) -> dict[str, Any]:
    from fairlane.engines.embed import EmbedConfig, EmbeddingEngine
    from fairlane.policy import EmbedPlan, Priority

    corpus = texts(count)
    direct = sentence_transformers_onnx_int8(corpus, threads)
    best_batch = max(direct, key=lambda b: direct[b])

    engine = EmbeddingEngine(
        EmbedConfig(models.resolve_embedder(models.DEFAULT_EMBED), backend=backend, threads=threads)
    )
    tokens = engine.tokenize(corpus)
    start = time.perf_counter()
    for offset in range(0, count, 32):
        ids = [f"e{i}" for i in range(offset, min(offset + 32, count))]
        for rid, t in zip(ids, tokens[offset : offset + 32], strict=True):
            engine.add(rid, t)
        engine.execute(EmbedPlan(tuple(ids), Priority.BACKGROUND, 0, 0.0))
    engine_rate = count / (time.perf_counter() - start)

    extra = {"embed": {"backend": backend, "threads": threads}, "stt": {"enabled": False}}
    with fairlane_server("fairlane", threads, 8, extra) as server:
        _post(server.url, {"input": corpus[:32]})  # warm-up
        start = time.perf_counter()
        _post(server.url, {"input": corpus})
        alone = count / (time.perf_counter() - start)

        stop = threading.Event()
        gaps: list[float] = []

        def chat() -> None:
            while not stop.is_set():
                timing = stream_chat(
                    server.url,
                    [{"role": "user", "content": "Tell me a short story about a cat."}],
                    48,
                    {"fairlane_class": "chat"},
                )
                gaps.extend(timing.gaps)

        chatter = threading.Thread(target=chat)
        chatter.start()
        time.sleep(2.0)
        start = time.perf_counter()
        _post(server.url, {"input": corpus})
        with_chat = count / (time.perf_counter() - start)
        stop.set()
        chatter.join()
    result = {
        "texts": count,
        "direct_sentence_transformers_onnx_int8_texts_s": {
            b: round(r, 1) for b, r in direct.items()
        },
        "direct_best_batch": best_batch,
        f"direct_engine_{backend}_texts_s": round(engine_rate, 1),
        "server_texts_s": round(alone, 1),
        "server_with_chat_texts_s": round(with_chat, 1),
        "server_vs_sentence_transformers": round(alone / direct[best_batch], 2),
        "server_vs_engine": round(alone / engine_rate, 2),
        "with_chat_vs_alone": round(with_chat / alone, 2),
        "chat_itl_p50_ms": round((percentile(gaps, 50) or 0) * 1000, 1),
        "chat_itl_p95_ms": round((percentile(gaps, 95) or 0) * 1000, 1),
    }
    print(json.dumps(result, indent=2))
    return result


def search_latency(sizes: list[int], dimensions: int = 384, queries: int = 50) -> dict[str, Any]:
    """`DocumentStore.search` over N stored chunks (random unit vectors), in ms per query."""
    import sqlite3
    import tempfile
    from pathlib import Path

    import numpy as np

    from fairlane.documents.store import DocumentStore

    rng = np.random.default_rng(0)
    out: dict[str, Any] = {}
    for size in sizes:
        folder = Path(tempfile.mkdtemp(prefix="fairlane-search-"))
        DocumentStore(folder / "index.sqlite").close()  # create the schema
        vectors = rng.standard_normal((size, dimensions)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        with sqlite3.connect(folder / "index.sqlite") as db:
            db.execute(
                "INSERT INTO documents VALUES ('doc', 'x', 'bench', NULL, '[]', "
                "'text/plain', 0, ?)",
                (size,),
            )
            db.executemany(
                "INSERT INTO chunks (document_id, seq, text, tokens, vector, indexed_at) "
                "VALUES ('doc', ?, 'chunk', '[]', ?, 0)",
                ((i, vectors[i].tobytes()) for i in range(size)),
            )
        store = DocumentStore(folder / "index.sqlite")
        times = []
        for q in range(queries):
            start = time.perf_counter()
            store.search(vectors[q], 5)
            times.append(time.perf_counter() - start)
        store.close()
        out[str(size)] = {
            "p50_ms": round((percentile(times, 50) or 0) * 1000, 2),
            "p95_ms": round((percentile(times, 95) or 0) * 1000, 2),
        }
        print(
            f"  search over {size:>7} chunks: p50 {out[str(size)]['p50_ms']} ms, "
            f"p95 {out[str(size)]['p95_ms']} ms",
            flush=True,
        )
    return out
