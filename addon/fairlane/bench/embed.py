"""`fairlane bench embed`: the background lane's embedding throughput.

- direct: `SentenceTransformer.encode` at batch 8/16/32/64 in this process (its best is the
  baseline), and Fairlane's engine with the configured backend called directly;
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
from typing import Any

from fairlane import models
from fairlane.bench.servers import fairlane_server, stream_chat
from fairlane.metrics import percentile

NOTES = [
    "The dishwasher's eco programme washes at 45 degrees and takes three hours.",
    "The school trip to the museum is on Friday; children need a packed lunch.",
    "Banana bread: mash three ripe bananas, add flour and sugar, bake for an hour.",
    "The boiler was serviced in March and the next service is due next spring.",
    "Car insurance renews on the first of June; compare quotes before then.",
    "Water the tomatoes every evening in July unless it has rained.",
]


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
    import torch
    from sentence_transformers import SentenceTransformer

    from fairlane.engines.embed import EmbedConfig, EmbeddingEngine
    from fairlane.policy import EmbedPlan, Priority

    torch.set_num_threads(threads)
    corpus = texts(count)
    model = SentenceTransformer(str(models.resolve_embedder(models.DEFAULT_EMBED)), device="cpu")
    model.encode(corpus[:64], batch_size=32)
    direct = {}
    for batch in (8, 16, 32, 64):
        start = time.perf_counter()
        model.encode(corpus, batch_size=batch)
        direct[batch] = count / (time.perf_counter() - start)
    best_batch = max(direct, key=lambda b: direct[b])
    del model

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
        "direct_sentence_transformers_texts_s": {b: round(r, 1) for b, r in direct.items()},
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

    from fairlane.documents import DocumentStore

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
