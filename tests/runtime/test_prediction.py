"""The cost model's published error: per device loop and step kind, over the last 5 minutes."""

from __future__ import annotations

import pytest

from fairlane.policy import Kind, Priority
from fairlane.runtime.device import StepRecord
from fairlane.runtime.prediction import background_steps, prediction_error, step_kind


def step(kind: Kind, start: float, took: float, predicted: float, prefill: int = 0,
         decodes: int = 0, device: str = "gpu") -> StepRecord:
    return StepRecord(start, start + took, kind, ("r",), (), (Priority.CHAT,), prefill, decodes,
                      predicted, device)


def test_llm_steps_are_prefill_decode_or_mixed_and_the_others_are_named_by_engine() -> None:
    assert step_kind(step(Kind.LLM, 0, 1, 1, prefill=64)) == "prefill"
    assert step_kind(step(Kind.LLM, 0, 1, 1, decodes=4)) == "decode"
    assert step_kind(step(Kind.LLM, 0, 1, 1, prefill=8, decodes=4)) == "mixed"
    assert [step_kind(step(k, 0, 1, 1)) for k in (Kind.STT, Kind.TTS, Kind.EMBED)] == [
        "stt", "tts", "embed"]


def test_error_is_relative_to_the_measured_time_per_kind_and_device() -> None:
    records = [
        step(Kind.LLM, 400.0, 0.010, 0.011, decodes=1),  # 10% over
        step(Kind.LLM, 401.0, 0.020, 0.010, decodes=2),  # 50% under
        step(Kind.LLM, 402.0, 0.010, 0.010, decodes=1),  # exact
        step(Kind.EMBED, 403.0, 0.100, 0.150, device="cpu"),  # 50% over
    ]
    errors = prediction_error(records, now=410.0)
    decode = errors["gpu"]["decode"]
    assert decode["steps"] == 3 and decode["median"] == pytest.approx(0.1)
    assert decode["p95"] == pytest.approx(0.1 + 0.9 * 0.4)  # interpolated between 0.1 and 0.5
    assert errors["cpu"] == {"embed": {"steps": 1, "median": 0.5, "p95": 0.5}}


def test_only_the_last_five_minutes_count() -> None:
    old = step(Kind.STT, 0.0, 1.0, 3.0)
    recent = step(Kind.STT, 350.0, 1.0, 1.2)
    assert prediction_error([old, recent], now=400.0)["gpu"]["stt"] == {
        "steps": 1, "median": 0.2, "p95": 0.2}
    assert prediction_error([old], now=400.0) == {}


def test_background_steps_are_those_without_interactive_work_beside_the_slice() -> None:
    def ran(
        kind: Kind, start: float, took: float, *classes: Priority, budget: float | None = 0.05
    ) -> StepRecord:
        return StepRecord(
            start, start + took, kind, ("r",), (), classes, 0, 1, took, "cpu", budget_s=budget
        )

    records = [
        ran(Kind.LLM, 100.0, 0.040, Priority.BACKGROUND),
        ran(Kind.LLM, 101.0, 0.060, Priority.BACKGROUND),
        ran(Kind.LLM, 102.0, 0.500, Priority.BACKGROUND, Priority.VOICE),  # carried a voice turn
        ran(Kind.EMBED, 103.0, 0.100, Priority.BACKGROUND, budget=None),
        ran(Kind.LLM, 104.0, 0.900, Priority.CHAT),
        ran(Kind.LLM, 10.0, 0.900, Priority.BACKGROUND),  # before the window
    ]
    steps = background_steps(records, now=110.0, slice_s=0.05, window_s=60.0)
    llm = steps["cpu"]["llm"]
    assert llm["steps"] == 2 and llm["p50_ms"] == 50.0
    assert llm["p95_ms"] == pytest.approx(59.0) and llm["p95_over_slice"] == pytest.approx(1.18)
    assert llm["sliced"]["steps"] == 2 and llm["p95_over_budget"] == pytest.approx(1.18)
    assert steps["cpu"]["embed"] == {
        "steps": 1, "p50_ms": 100.0, "p95_ms": 100.0, "p95_over_slice": 2.0,
        "sliced": {"steps": 0, "p50_ms": None, "p95_ms": None, "p95_over_slice": None},
        "p95_over_budget": None,
    }


def test_steps_planned_while_nobody_talks_are_told_apart_from_sliced_ones() -> None:
    """A background step may grow to the arrival wait when nobody is talking: it counts
    against the slice in the overall figure, but not among the steps planned to a slice, and
    against its own bound it ran as planned."""
    records = [
        StepRecord(100.0 + i, 100.0 + i + took, Kind.LLM, ("r",), (), (Priority.BACKGROUND,),
                   8, 0, took, "cpu", budget_s=budget)
        for i, (took, budget) in enumerate([(0.045, 0.05), (0.055, 0.05), (0.9, 1.0), (0.95, 1.0)])
    ]
    llm = background_steps(records, now=110.0, slice_s=0.05, window_s=60.0)["cpu"]["llm"]
    assert llm["steps"] == 4 and llm["p95_over_slice"] > 18
    assert llm["sliced"]["steps"] == 2 and llm["sliced"]["p95_over_slice"] == pytest.approx(1.09)
    assert llm["p95_over_budget"] == pytest.approx(1.078)  # 0.9, 0.9, 0.95, 1.1
