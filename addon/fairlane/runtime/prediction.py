"""How wrong the cost model is: every step's predicted time (what the policy planned with)
beside what the device took, as a relative error per device loop and step kind.

Every promise the scheduler makes (slices, ITL budgets, admission by deadline, batch windows)
rests on these predictions, so their error is published like a latency: `/v1/stats`
(`prediction_error`), `/metrics` (`fairlane_prediction_error_ratio`) and the dashboard show
the median and p95 of |predicted − measured| / measured over the last five minutes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fairlane.policy import Kind
from fairlane.runtime.device import StepRecord
from fairlane.runtime.metrics import percentile

WINDOW_S = 300.0
STEP_KINDS = ("prefill", "decode", "mixed", "stt", "tts", "embed")


def step_kind(record: StepRecord) -> str:
    """An LLM step is a prefill (prompt chunks only), a decode (one token per sequence only) or
    mixed; the other engines' steps are named after them."""
    if record.kind is Kind.LLM:
        if record.decode_seqs == 0:
            return "prefill"
        return "decode" if record.prefill_tokens == 0 else "mixed"
    return str(record.kind.value)


def relative_error(record: StepRecord) -> float | None:
    measured = record.end - record.start
    if measured <= 0:
        return None
    return abs(record.predicted_s - measured) / measured


def prediction_error(
    records: Iterable[StepRecord], now: float, window_s: float = WINDOW_S
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per device loop and step kind, over steps that ended in the last `window_s`: how many,
    and the median and p95 of the relative error (0.1: predictions 10% off)."""
    errors: dict[tuple[str, str], list[float]] = {}
    for record in records:
        if record.end < now - window_s:
            continue
        error = relative_error(record)
        if error is not None:
            errors.setdefault((record.device, step_kind(record)), []).append(error)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (device, kind), values in sorted(errors.items()):
        out.setdefault(device, {})[kind] = {
            "steps": len(values),
            "median": _rounded(percentile(values, 50)),
            "p95": _rounded(percentile(values, 95)),
        }
    return out


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def background_steps(
    records: Iterable[StepRecord], now: float, slice_s: float, window_s: float = WINDOW_S
) -> dict[str, dict[str, Any]]:
    """Per device loop and engine kind, the steps that carried background work and nothing
    interactive, over the last `window_s`: how many, their p50 and p95 in ms, and the p95 over
    the slice (the policy's bound on such a step while someone is talking; DESIGN's goal: at
    most 1.2).

    The policy lets a background step grow past the slice when nobody is talking (to the
    arrival wait), so the steps it planned to the slice or less are also shown on their own
    (`sliced`: what an arrival waits for), and every step against its own time bound
    (`p95_over_budget`: above 1, the step ran longer than it was planned to).
    """
    steps: dict[tuple[str, str], list[StepRecord]] = {}
    for record in records:
        if record.end < now - window_s or not record.classes:
            continue
        if any(p.interactive for p in record.classes):
            continue
        steps.setdefault((record.device, record.kind.value), []).append(record)
    out: dict[str, dict[str, Any]] = {}
    for (device, kind), group in sorted(steps.items()):
        values = [r.end - r.start for r in group]
        sliced = [
            r.end - r.start
            for r in group
            if r.budget_s is not None and r.budget_s <= slice_s * (1 + 1e-9)
        ]
        over = [(r.end - r.start) / r.budget_s for r in group if r.budget_s]
        figures = durations(values, slice_s)
        figures["sliced"] = durations(sliced, slice_s)
        figures["p95_over_budget"] = _rounded(percentile(over, 95))
        out.setdefault(device, {})[kind] = figures
    return out


def durations(values: list[float], slice_s: float) -> dict[str, Any]:
    """Steps' count, p50 and p95 (ms) and the p95 over the slice (also the simulator's)."""
    p95 = percentile(values, 95)
    return {
        "steps": len(values),
        "p50_ms": _ms(percentile(values, 50)),
        "p95_ms": _ms(p95),
        "p95_over_slice": None if p95 is None else round(p95 / slice_s, 2),
    }


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)
