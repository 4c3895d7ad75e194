"""The model catalogue (catalogue.yaml): what Fairlane recommends for each role and machine,
and the references a person may give instead of a catalogue name.

A conversation model is named three ways: a catalogue name (`qwen3-4b-instruct-2507`), a file
of a Hugging Face repository (`hf:OWNER/REPO/FILE.gguf`), or a repository and a quantisation
(`OWNER/REPO:Q4_K_M`, as llama-server's `-hf` takes it: the repository's one GGUF file whose
name holds it). `reference` turns any of them into a `HubFile` (or the packaged model's name).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from fairlane.engines.models import PACKAGED, ModelError

ROLES = ("conversation", "speech-to-text", "embeddings")
TIERS = ("cpu-4gb", "cpu-8gb", "cpu-16gb", "gpu-8gb", "gpu-16gb", "gpu-24gb")
TIER_GB = {"cpu-4gb": 4, "cpu-8gb": 8, "cpu-16gb": 16, "gpu-8gb": 8, "gpu-16gb": 16,
           "gpu-24gb": 24}
HUB_FILE = re.compile(r"^hf:(?P<repo>[\w.-]+/[\w.-]+)/(?P<file>[\w./-]+\.gguf)$")
HUB_QUANT = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+):(?P<quant>[\w.-]+)$")


@dataclass(frozen=True)
class Entry:
    """One recommended model."""

    role: str
    name: str
    tiers: tuple[str, ...]
    size_mb: int
    licence: str
    why: str
    repo: str | None = None
    file: str | None = None
    packaged: bool = False
    context: int | None = None
    tool_calls: bool | None = None
    assist: dict[str, Any] | None = None
    faster_whisper: str | None = None


@dataclass(frozen=True)
class HubFile:
    """One file of a Hugging Face repository; `quant` when the file is still to be found by
    its quantisation among the repository's files."""

    repo: str
    file: str | None
    quant: str | None = None
    revision: str = "main"

    @property
    def label(self) -> str:
        return f"{self.repo}/{self.file}" if self.file else f"{self.repo}:{self.quant}"


def load() -> list[Entry]:
    """Every catalogue entry, in the file's order."""
    text = resources.files("fairlane").joinpath("catalogue.yaml").read_text()
    data = yaml.safe_load(text)
    return [Entry(role=role, **{**item, "tiers": tuple(item["tiers"])})
            for role in ROLES for item in data.get(role, ())]


def find(name: str) -> Entry | None:
    return next((entry for entry in load() if entry.name == name), None)


def reference(text: str) -> HubFile | str:
    """A conversation model's reference as a hub file, or the name of a packaged model.
    ModelError for anything else (a path is not a reference: it is used as it is)."""
    if text in PACKAGED:
        return text
    entry = find(text)
    if entry is not None:
        if entry.packaged:
            return entry.name
        if entry.role != "conversation" or entry.repo is None or entry.file is None:
            raise ModelError(f"{text!r} is a {entry.role} model; it is not pulled by name")
        return HubFile(entry.repo, entry.file)
    if match := HUB_FILE.match(text):
        return HubFile(match["repo"], match["file"])
    if match := HUB_QUANT.match(text):
        return HubFile(match["repo"], None, match["quant"])
    names = ", ".join(e.name for e in load() if e.role == "conversation")
    raise ModelError(
        f"{text!r} is not a catalogue model ({names}), `hf:OWNER/REPO/FILE.gguf` or "
        "`OWNER/REPO:QUANT`"
    )


def is_reference(text: str) -> bool:
    """Whether a configured `llm.model` names something to pull (not a packaged model or a
    file on this machine)."""
    if text in PACKAGED or Path(text).expanduser().exists():
        return False
    try:
        return isinstance(reference(text), HubFile)
    except ModelError:
        return False


def this_machine(gpu_gb: float | None = None) -> str:
    """The tier of this machine: the GPU's memory when given, else system RAM."""
    if gpu_gb:
        return next((t for t in reversed(TIERS) if t.startswith("gpu")
                     and gpu_gb >= TIER_GB[t] * 0.9), "gpu-8gb")
    total = memory_gb()
    return next((t for t in reversed(TIERS) if t.startswith("cpu")
                 and total >= TIER_GB[t] * 0.9), "cpu-4gb")


def memory_gb(field: str = "MemTotal") -> float:
    """System memory in GB (`MemTotal`, or `MemAvailable`), from /proc/meminfo."""
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) / 1024**3


def recommended(role: str, tier: str) -> list[Entry]:
    """The catalogue's models of a role for a tier, and for every smaller tier of its kind."""
    kind, size = tier.split("-")[0], TIER_GB[tier]
    return [e for e in load() if e.role == role and any(
        t.startswith(kind) and TIER_GB[t] <= size for t in e.tiers)]
