"""A spoken turn's stages, from the records of its requests (transcription, model calls,
speech), grouped by time as the server sees them."""

from __future__ import annotations

import pytest

from fairlane.policy import Kind, Priority
from fairlane.runtime.metrics import RequestRecord
from fairlane.runtime.turns import breakdown, spoken_turns


def record(kind: Kind, arrival: float, tokens: tuple[float, ...] = (), finished: float = 0.0,
           priority: Priority = Priority.VOICE, client: str = "ha") -> RequestRecord:
    return RequestRecord(kind, priority, client, kind.value, arrival,
                         token_times=list(tokens), finished_at=finished or None)


def evening() -> list[RequestRecord]:
    return [
        # Turn 1, "turn on the kitchen light": transcript, a tool call, HA runs it, the reply.
        record(Kind.STT, 0.0, finished=0.6, client="wyoming"),
        record(Kind.LLM, 0.7, (0.9, 1.2, 1.5), 1.5),
        record(Kind.LLM, 0.8, (1.0,), 1.1, priority=Priority.CHAT),  # someone typing: not it
        record(Kind.LLM, 1.7, (1.8, 1.9), 2.2),
        record(Kind.TTS, 1.95, (2.1,), 2.4, client="wyoming"),
        # Turn 2, a question without a tool.
        record(Kind.STT, 10.0, finished=10.5, client="wyoming"),
        record(Kind.LLM, 10.6, (10.8, 11.0), 11.2),
        record(Kind.TTS, 11.0, (), 11.3, client="wyoming"),
        # A voice-class call long after: no turn of its own, and not turn 2's.
        record(Kind.LLM, 30.0, (30.1,), 30.2),
    ]


def test_a_tool_turn_is_split_into_its_stages() -> None:
    first, second = spoken_turns(evening(), gap_s=2.0)
    stages = first.stages()
    expected = {
        "transcript": 0.6, "agent": 0.1, "first_token": 0.2, "tool_call": 0.6, "tool": 0.2,
        "second_first_token": 0.1, "speech_wait": 0.15, "first_audio": 0.15, "total": 2.1,
    }
    assert stages == pytest.approx(expected)
    assert len(second.calls) == 1 and "tool" not in second.stages()
    assert second.stages()["total"] == pytest.approx(1.3)  # one piece of audio: its end


def test_stats_give_each_stage_over_the_turns() -> None:
    summary = breakdown(evening(), gap_s=2.0)
    assert summary["turns"] == 2 and summary["with_tool"] == 1
    stages = summary["stages_ms"]
    assert stages["tool"] == {"count": 1, "p50": 200.0, "p95": 200.0}
    assert stages["transcript"]["count"] == 2 and stages["transcript"]["p50"] == 550.0
    assert breakdown([], gap_s=2.0)["stages_ms"]["total"] == {"count": 0, "p50": None, "p95": None}
