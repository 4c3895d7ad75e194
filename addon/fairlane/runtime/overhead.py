"""The device loop's own time per step: what the host spends around each device call.

On a GPU a decode iteration of an 8B model takes a few milliseconds, so the work the loop does
in Python around it (planning the step, filling llama.cpp's batch, sampling, applying the
outputs, handing tokens to their streams) decides how busy the GPU can be kept. Every step
records it (`StepRecord.host_s`); `/v1/stats` (`host_overhead`) and `fairlane bench host` show
it per device loop and batch size: the median and p95 per step, and its share of the loop's
time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fairlane.policy import Kind
from fairlane.runtime.device import StepRecord
from fairlane.runtime.metrics import percentile

WINDOW_S = 300.0
# Sequences in an LLM step, grouped: the cost of Python work grows with them.
BATCHES = ((1, 1), (2, 4), (5, 8), (9, 16), (17, 32), (33, 10**9))


def batch_label(sequences: int) -> str:
    for low, high in BATCHES:
        if low <= sequences <= high:
            return str(low) if low == high else (f"{low}-{high}" if high < 10**9 else f"{low}+")
    return "0"


def step_group(record: StepRecord) -> str:
    """`llm:5-8` for an LLM step of 5 to 8 sequences; the other engines by kind."""
    if record.kind is Kind.LLM:
        return f"llm:{batch_label(len(record.request_ids))}"
    return str(record.kind.value)


def host_overhead(
    records: Iterable[StepRecord], now: float, window_s: float = WINDOW_S
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per device loop and step group, over steps that ended in the last `window_s`: how many,
    the host's milliseconds per step (median, p95), the device call's (median), and the
    host's share of the two."""
    groups: dict[tuple[str, str], list[StepRecord]] = {}
    for record in records:
        if record.end >= now - window_s:
            groups.setdefault((record.device, step_group(record)), []).append(record)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (device, group), steps in sorted(groups.items()):
        host = [r.host_s for r in steps]
        device_s = [r.end - r.start if r.device_s is None else r.device_s for r in steps]
        total = sum(host) + sum(device_s)
        out.setdefault(device, {})[group] = {
            "steps": len(steps),
            "host_ms_p50": _ms(percentile(host, 50)),
            "host_ms_p95": _ms(percentile(host, 95)),
            "device_ms_p50": _ms(percentile(device_s, 50)),
            "host_share": round(sum(host) / total, 3) if total > 0 else None,
        }
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)
