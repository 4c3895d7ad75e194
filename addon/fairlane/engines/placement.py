"""Where each engine really runs, against where the configuration asked it to.

A GPU asked for and not obtained is the quiet failure of GPU images: a llama.cpp built without
CUDA ignores `gpu_layers`, an ONNX Runtime without a working CUDA provider falls back to the
CPU, and a CPU-only CTranslate2 refuses `cuda` outright. Each engine reports what it got; the
server says it in one log line per engine at start and in `/health` (status `degraded`), or,
with `server.require_devices`, refuses to start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Placement:
    """One engine's device: what was asked, what it got, and how that was found out."""

    engine: str  # "llm", "stt", "embed", "tts"
    asked: str  # "cpu" or "cuda"
    got: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.asked == self.got

    def as_dict(self) -> dict[str, str | bool]:
        return {"asked": self.asked, "got": self.got, "ok": self.ok, "detail": self.detail}

    def complaint(self) -> str:
        return f"{self.engine} asked for {self.asked} and runs on {self.got}: {self.detail}"


def kind(device: str) -> str:
    """`cuda`, `cuda:1` → "cuda"; anything else is the CPU."""
    return "cuda" if device.startswith("cuda") else "cpu"


def onnx_placement(engine: str, asked: str, providers: list[str]) -> Placement:
    """ONNX Runtime drops a provider it cannot load and runs on what is left."""
    got = "cuda" if "CUDAExecutionProvider" in providers else "cpu"
    return Placement(engine, kind(asked), got, f"ONNX Runtime providers: {', '.join(providers)}")


def onnx_session_options(threads: int) -> Any:
    """ONNX Runtime's options for an engine that shares the cores with the others.

    Its intra-op threads spin after each run, waiting for the next (ONNX Runtime's default).
    The device loop runs the LLM's step next, and llama.cpp's threads then share the cores
    with threads that have no work: a decode right after an embedding batch took 49 ms
    against 24 ms after another decode (docs/history/benchmarks.md, "The online fit held to its
    scale, and a decode after an embedding batch"). Without the spin the embedding batch is as fast
    and the decode after it ~32 ms.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return options
