"""The cost model's published error: per device loop and step kind, over the last 5 minutes."""

from __future__ import annotations

import pytest

from fairlane.policy import Kind, Priority
from fairlane.runtime.device import StepRecord
from fairlane.runtime.prediction import prediction_error, step_kind


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
