"""The embedding backends agree: ONNX Runtime (fp32, int8) against sentence-transformers."""

from __future__ import annotations

import numpy as np
import pytest

from fairlane import models
from fairlane.engines.embed import EmbedConfig, EmbeddingEngine
from fairlane.policy import EmbedPlan, Priority

TEXTS = [
    "The dishwasher's eco programme takes three hours.",
    "School trip on Friday: packed lunch needed.",
    "hello",
    "Turn on the kitchen lights",
    "Banana bread with walnuts, baked for an hour at 175 degrees.",
]


def _vectors(backend: str, tmp_path) -> np.ndarray:
    engine = EmbeddingEngine(EmbedConfig(models.resolve_embedder(models.DEFAULT_EMBED),
                                         backend=backend, threads=1, cache_dir=tmp_path))
    for i, tokens in enumerate(engine.tokenize(TEXTS)):
        engine.add(f"t{i}", tokens)
    plan = EmbedPlan(tuple(f"t{i}" for i in range(len(TEXTS))), Priority.BACKGROUND, 0, 0.0)
    _, events = engine.execute(plan)
    return np.stack([e.vector for e in events])


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("onnx")


def test_onnx_export_matches_sentence_transformers(cache) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(models.resolve_embedder(models.DEFAULT_EMBED)),
                                    device="cpu").encode(TEXTS, normalize_embeddings=True)
    torch_vectors = _vectors("torch", cache)
    fp32 = _vectors("onnx", cache)
    int8 = _vectors("onnx-int8", cache)
    assert np.min(np.sum(torch_vectors * reference, axis=1)) > 0.9999
    assert np.min(np.sum(fp32 * reference, axis=1)) > 0.9999
    assert np.min(np.sum(int8 * reference, axis=1)) > 0.98
    # Same nearest neighbours among the texts, whichever backend.
    assert (np.argsort(-(int8 @ int8.T), axis=1)[:, 1]
            == np.argsort(-(reference @ reference.T), axis=1)[:, 1]).all()
    assert len(list(cache.glob("onnx-*/model-int8-7bit.onnx"))) == 1  # exported once, cached
