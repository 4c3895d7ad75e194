"""The simulator's report counts work as `bench family` counts it on the real server, so the
two can be set side by side (docs/history/benchmarks.md: the simulator against the server)."""

from __future__ import annotations

import pytest

from fairlane.policy import Kind, Priority
from fairlane.runtime.metrics import RequestRecord
from fairlane.sim.report import background_done


def _llm(prompt: int, token_times: list[float], finished_at: float | None) -> RequestRecord:
    return RequestRecord(
        Kind.LLM, Priority.BACKGROUND, "docs", "summaries", 0.0, prompt, token_times, finished_at
    )


def test_background_work_within_the_phase_counts_a_summary_cut_at_the_end() -> None:
    """A summary whose answer began within the phase counts its prompt and the tokens out by
    then, as the bench's client sees them; one still in prefill counts nothing; an embedding
    request counts once finished within the phase. The simulator once counted only requests
    finished within it, and so reported less background work than the same run on the server."""
    records = [
        _llm(1000, [50.0, 51.0], finished_at=51.0),  # done: 1,002
        _llm(1200, [99.0, 99.5, 100.5, 101.0], finished_at=None),  # cut: 1,202
        _llm(1500, [], finished_at=None),  # still in prefill: 0
        _llm(800, [120.0], finished_at=120.0),  # began after the phase: 0
        RequestRecord(Kind.EMBED, Priority.BACKGROUND, "docs", "documents", 0.0, 256,
                      finished_at=90.0),
        RequestRecord(Kind.EMBED, Priority.BACKGROUND, "docs", "documents", 0.0, 256,
                      finished_at=101.0),
        RequestRecord(Kind.LLM, Priority.CHAT, "teen", "chat", 0.0, 500, [1.0], 2.0),
    ]
    llm, embedded = background_done(records, duration_s=100.0)
    assert llm == pytest.approx((1002 + 1202) / 100.0)
    assert embedded == pytest.approx(256 / 100.0)
