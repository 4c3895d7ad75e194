"""Metric definitions used everywhere (DESIGN.md §6): server, simulator, benchmarks, sensors."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from fairlane.engines.numbers import number_words
from fairlane.policy import Kind, Priority, Slo


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0–100) with linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def jain(values: Sequence[float]) -> float | None:
    """Jain's fairness index: 1 when all equal, 1/n when one gets everything."""
    if not values:
        return None
    total = sum(values)
    squares = sum(v * v for v in values)
    return 1.0 if squares == 0 else total * total / (len(values) * squares)


@dataclass
class RequestRecord:
    """What a person felt about one request: arrival, every output time, the end."""

    kind: Kind
    priority: Priority
    client: str
    group: str
    arrival: float
    prompt_tokens: int = 0
    token_times: list[float] = field(default_factory=list)
    finished_at: float | None = None
    refused: str | None = None

    @property
    def ttft(self) -> float | None:
        """Arrival → first output token; for STT and embeddings, arrival → result."""
        if self.kind is Kind.LLM:
            return self.token_times[0] - self.arrival if self.token_times else None
        return None if self.finished_at is None else self.finished_at - self.arrival

    @property
    def itl(self) -> list[float]:
        times = self.token_times
        return [b - a for a, b in itertools.pairwise(times)]

    @property
    def e2e(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.arrival

    def met(self, slo: Slo) -> bool:
        """Finished, first output within its target and p95 of its own ITL within target."""
        if self.finished_at is None:
            return False
        target_ms = slo.ttft_ms if self.kind is Kind.LLM else slo.stt_ms
        ttft = self.ttft
        if target_ms is not None and (ttft is None or ttft * 1000 > target_ms):
            return False
        gaps = self.itl
        if slo.itl_ms is not None and gaps:
            p95 = percentile(gaps, 95)
            return p95 is not None and p95 * 1000 <= slo.itl_ms
        return True


def normalize_words(text: str) -> list[str]:
    """Lower case, no punctuation, numbers as words ("21°" and "twenty-one" both count once)."""
    text = text.lower().replace("%", " percent").replace("-", " ")
    text = re.sub(r"\d+", lambda m: f" {number_words(int(m.group()))} ", text)
    return re.sub(r"[^a-z' ]+", " ", text).split()


def word_error_rate(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Word edits (substitutions, insertions, deletions) over reference words, after
    `normalize_words`, pooled over all pairs."""
    edits = words = 0
    for reference, hypothesis in zip(references, hypotheses, strict=True):
        ref, hyp = normalize_words(reference), normalize_words(hypothesis)
        row = list(range(len(hyp) + 1))
        for i, r in enumerate(ref, 1):
            previous, row[0] = row[0], i
            for j, h in enumerate(hyp, 1):
                previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (r != h))
        edits += row[-1]
        words += len(ref)
    return edits / words if words else 0.0
