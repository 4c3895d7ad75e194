"""The embedding engine: sentence-transformers models, one micro-batch per planned step.

Backends (config `embed.backend`):
- `torch`: sentence-transformers itself (CUDA when `embed.device: cuda`);
- `onnx`: the same model exported once with torch.onnx and run by ONNX Runtime (identical
  vectors, faster on a CPU);
- `onnx-int8`: that export with dynamic per-channel int8 quantisation (fastest on a CPU;
  cosine ≥ 0.98 to torch).
The ONNX files are cached beside the other assembled models, keyed by the model's folder.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fairlane.engines.placement import Placement, kind, onnx_placement, onnx_session_options
from fairlane.policy import EmbedPlan, SeqOutput, StepResult
from fairlane.runtime.host import give_back_memory

BACKENDS = ("torch", "onnx", "onnx-int8")
# A micro-batch of this many tokens (padded) or more leaves hundreds of MB freed in the C heap.
LARGE_BATCH_TOKENS = 16_384


@dataclass(frozen=True)
class EmbedConfig:
    model_path: Path
    backend: str = "onnx-int8"
    device: str = "cpu"
    threads: int = 1
    cache_dir: Path | None = None


@dataclass(frozen=True)
class EmbeddingEvent:
    request_id: str
    vector: np.ndarray  # float32, L2-normalised
    tokens: int
    finish_reason: str = "stop"


class EmbeddingEngine:
    def __init__(self, config: EmbedConfig) -> None:
        from tokenizers import Tokenizer

        if config.backend not in BACKENDS:
            raise ValueError(f"embed.backend must be one of {', '.join(BACKENDS)}")
        self.config = config
        folder = config.model_path
        settings = _read_json(folder / "sentence_bert_config.json")
        self.max_tokens = int(settings.get("max_seq_length", 256))
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(self.max_tokens)
        self.tokenizer.no_padding()
        # The same tokenizer without truncation: documents are chunked by their token offsets.
        self.tokenizer_full = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer_full.no_truncation()
        self.tokenizer_full.no_padding()
        self.dimensions = int(_read_json(folder / "config.json").get("hidden_size", 0))
        self.pending: dict[str, list[int]] = {}
        self.placement = Placement("embed", kind(config.device), "cpu")
        self._run = self._torch_runner() if config.backend == "torch" else self._onnx_runner()

    # --- requests ----------------------------------------------------------------------------

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, truncated to the model's limit (what the policy budgets)."""
        return [e.ids for e in self.tokenizer.encode_batch(texts)]

    def add(self, request_id: str, token_ids: list[int]) -> None:
        self.pending[request_id] = token_ids

    def release(self, request_id: str) -> None:
        self.pending.pop(request_id, None)

    def execute(
        self, plan: EmbedPlan, clock: Callable[[], float] = time.perf_counter
    ) -> tuple[StepResult, list[EmbeddingEvent]]:
        """One padded micro-batch (the plan is sorted by length, so padding stays small)."""
        start = clock()
        ids = list(plan.request_ids)
        batch = [self.pending.pop(rid) for rid in ids]
        width = max(len(tokens) for tokens in batch)
        input_ids = np.zeros((len(batch), width), dtype=np.int64)
        mask = np.zeros((len(batch), width), dtype=np.int64)
        for row, tokens in enumerate(batch):
            input_ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1
        vectors = self._run(input_ids, mask)
        if input_ids.size >= LARGE_BATCH_TOKENS:
            give_back_memory()
        events = [EmbeddingEvent(rid, vectors[row], len(batch[row])) for row, rid in enumerate(ids)]
        outputs = tuple(SeqOutput(rid, finished=True) for rid in ids)
        return StepResult(clock() - start, outputs), events

    # --- backends ----------------------------------------------------------------------------

    def _torch_runner(self) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(self.config.threads)
        device = self.config.device
        if kind(device) == "cuda" and not torch.cuda.is_available():
            device = "cpu"  # said in `placement`
        self.placement = Placement(
            "embed", kind(self.config.device), kind(device), f"torch {torch.__version__}"
        )
        model = SentenceTransformer(str(self.config.model_path), device=device)
        transformer: Any = model[0].auto_model
        transformer.eval()

        def run(input_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                ids = torch.from_numpy(input_ids).to(device)
                attention = torch.from_numpy(mask).to(device)
                hidden = transformer(
                    input_ids=ids, attention_mask=attention, token_type_ids=torch.zeros_like(ids)
                ).last_hidden_state
                return _mean_pool(hidden.float().cpu().numpy(), mask)

        return run

    def _onnx_runner(self) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        import onnxruntime as ort

        path = onnx_model(
            self.config.model_path, self.config.backend == "onnx-int8", self.config.cache_dir
        )
        options = onnx_session_options(self.config.threads)
        providers = ["CPUExecutionProvider"]
        if self.config.device == "cuda":
            providers.insert(0, "CUDAExecutionProvider")
        session = ort.InferenceSession(str(path), options, providers=providers)
        self.placement = onnx_placement("embed", self.config.device, session.get_providers())
        # ONNX Runtime's arena keeps the largest batch's memory for good: a document's first
        # micro-batch (256 chunks of 256 tokens) grew the server by ~650 MB and it stayed. The
        # arena gives it back after each run instead (the next batch allocates again: ~1% of
        # its time here).
        shrink = ort.RunOptions()
        shrink.add_run_config_entry(
            "memory.enable_memory_arena_shrinkage",
            "cpu:0" if self.config.device != "cuda" else "cpu:0;gpu:0",
        )

        def run(input_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            feeds = {
                "input_ids": input_ids,
                "attention_mask": mask,
                "token_type_ids": np.zeros_like(input_ids),
            }
            hidden: np.ndarray = session.run(None, feeds, shrink)[0]
            return _mean_pool(hidden, mask)

        return run


def _mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """sentence-transformers' mean pooling over real tokens, then L2 normalisation."""
    weights = mask[..., None].astype(np.float32)
    pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
    norms = np.linalg.norm(pooled, axis=1, keepdims=True)
    return np.asarray(pooled / np.clip(norms, 1e-12, None), dtype=np.float32)


def _read_json(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text())) if path.exists() else {}


def onnx_model(model_path: Path, int8: bool, cache_dir: Path | None = None) -> Path:
    """The model exported to ONNX (and quantised), made once and cached; needs torch to make."""
    from fairlane.engines.models import cache_dir as default_cache

    key = hashlib.sha256(str(model_path.resolve()).encode()).hexdigest()[:12]
    folder = (cache_dir or default_cache()) / f"onnx-{model_path.name}-{key}"
    fp32, quantised = folder / "model.onnx", folder / "model-int8-7bit.onnx"
    if not fp32.exists():
        _export(model_path, fp32)
    if int8 and not quantised.exists():
        from onnxruntime.quantization import QuantType, quantize_dynamic

        partial = quantised.with_suffix(".partial.onnx")
        # Per-channel weights keep cosine ≥ 0.98 to the fp32 vectors; per-tensor fell to 0.94.
        # 7-bit weights (reduce_range): on x86 CPUs without VNNI, ONNX Runtime multiplies u8
        # activations by s8 weights with VPMADDUBSW, whose 16-bit pair sums saturate with full
        # 8-bit weights (cosine 0.977 there, 0.982 with VNNI); with 7 bits they cannot, so
        # every CPU computes the same vectors (0.981) at the same speed. u8 weights also avoid
        # it, at 1.7x the time.
        quantize_dynamic(
            str(fp32), str(partial), weight_type=QuantType.QInt8, per_channel=True,
            reduce_range=True,
        )
        partial.replace(quantised)
    return quantised if int8 else fp32


def _export(model_path: Path, target: Path) -> None:
    import torch
    from transformers import AutoModel

    class Encoder(torch.nn.Module):
        """Named inputs in, last hidden state out: the graph ONNX Runtime will run."""

        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    model = AutoModel.from_pretrained(str(model_path)).eval()
    example = torch.ones((2, 8), dtype=torch.int64)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial.onnx")
    torch.onnx.export(
        Encoder(model),
        (example, example, torch.zeros_like(example)),
        str(partial),
        input_names=names,
        output_names=["last_hidden_state"],
        dynamic_axes={n: {0: "batch", 1: "tokens"} for n in [*names, "last_hidden_state"]},
        opset_version=17,
        dynamo=False,
    )
    partial.replace(target)
