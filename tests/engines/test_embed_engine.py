"""The embedding backends agree: ONNX Runtime (fp32, int8) against sentence-transformers."""

from __future__ import annotations

import numpy as np
import pytest

from fairlane.engines import models
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


# Run under qemu's user-mode emulation of a Haswell CPU (AVX2, no VNNI), where ONNX Runtime's
# int8 kernels multiply with VPMADDUBSW: the quantised model's vectors on that CPU.
ON_ANOTHER_CPU = """
import sys
import numpy as np
import onnxruntime as ort
data = np.load(sys.argv[2])
options = ort.SessionOptions()
options.intra_op_num_threads = 1
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
feeds = {"input_ids": data["ids"], "attention_mask": data["mask"],
         "token_type_ids": np.zeros_like(data["ids"])}
np.save(sys.argv[3], session.run(None, feeds)[0])
"""


def test_int8_vectors_are_the_same_on_a_cpu_without_vnni(cache, tmp_path) -> None:
    """The fresh-clone failure (cosine 0.977 < 0.98 on a CPU without VNNI, 0.982 with it):
    8-bit weights saturate VPMADDUBSW's 16-bit sums there. With 7-bit weights the emulated
    Haswell computes what this CPU computes."""
    import shutil
    import subprocess
    import sys

    import onnxruntime as ort

    from fairlane.engines.embed import onnx_model

    qemu = shutil.which("qemu-x86_64")
    assert qemu, "qemu-user is missing: `make test` installs it (Debian's qemu-user)"
    path = onnx_model(models.resolve_embedder(models.DEFAULT_EMBED), True, cache)
    engine = EmbeddingEngine(EmbedConfig(models.resolve_embedder(models.DEFAULT_EMBED),
                                         backend="onnx-int8", threads=1, cache_dir=cache))
    tokens = engine.tokenize(TEXTS)
    width = max(len(t) for t in tokens)
    ids = np.array([t + [0] * (width - len(t)) for t in tokens], dtype=np.int64)
    mask = np.array([[1] * len(t) + [0] * (width - len(t)) for t in tokens], dtype=np.int64)
    np.savez(tmp_path / "inputs.npz", ids=ids, mask=mask)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    here = session.run(None, {"input_ids": ids, "attention_mask": mask,
                              "token_type_ids": np.zeros_like(ids)})[0]
    subprocess.run([qemu, "-cpu", "Haswell", sys.executable, "-c", ON_ANOTHER_CPU, str(path),
                    str(tmp_path / "inputs.npz"), str(tmp_path / "there.npy")],
                   check=True, capture_output=True, timeout=600)
    there = np.load(tmp_path / "there.npy")
    real = mask.astype(bool)
    assert np.abs(here[real] - there[real]).max() < 1e-4
