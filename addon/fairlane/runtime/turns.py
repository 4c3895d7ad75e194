"""Where a spoken turn's time goes, from the server's own records.

A spoken command reaches the server as several requests: its transcription (Wyoming or the
integration's STT), one or two model calls from Home Assistant's agent (the second after HA ran
a tool), and the reply's speech. They come from different clients (Wyoming, the integration),
so a turn is found by time: a voice-class transcription starts it, and every voice-class model
call or synthesis that arrives within `gap_s` of the turn's last activity belongs to it. Two
people speaking at the same moment would merge; in a household that is rare, and the stages
below say so by their spread.

Stages, each in seconds:
- `transcript`: end of speech → transcript (the STT request's own latency);
- `agent`: transcript → the first model call arrives (Home Assistant's work in between);
- `first_token`: that call's first token;
- `tool_call`: its first token → its last (a tool call is generated whole before HA can run it);
- `tool`: the first call's end → the second call's arrival (HA running the tool);
- `second_first_token`: the second call's first token;
- `speech_wait`: the last model call's first token → the first synthesis request arrives;
- `first_audio`: that request → its audio;
- `total`: end of speech → first audio.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fairlane.policy import Kind, Priority
from fairlane.runtime.metrics import RequestRecord, percentile

STAGES = (
    "transcript",
    "agent",
    "first_token",
    "tool_call",
    "tool",
    "second_first_token",
    "speech_wait",
    "first_audio",
    "total",
)


@dataclass
class SpokenTurn:
    stt: RequestRecord
    calls: list[RequestRecord] = field(default_factory=list)
    speech: list[RequestRecord] = field(default_factory=list)

    @property
    def last_activity(self) -> float:
        ends = [self.stt.finished_at or self.stt.arrival]
        ends += [r.finished_at or r.arrival for r in self.calls + self.speech]
        return max(ends)

    def stages(self) -> dict[str, float]:
        """The stages this turn went through (a turn without a tool has no `tool`)."""
        out: dict[str, float] = {}
        heard = self.stt.finished_at
        if heard is None:
            return out
        out["transcript"] = heard - self.stt.arrival
        if self.calls:
            first = self.calls[0]
            out["agent"] = first.arrival - heard
            if first.token_times:
                out["first_token"] = first.token_times[0] - first.arrival
                out["tool_call"] = first.token_times[-1] - first.token_times[0]
            if len(self.calls) > 1 and first.finished_at is not None:
                second = self.calls[1]
                out["tool"] = second.arrival - first.finished_at
                if second.token_times:
                    out["second_first_token"] = second.token_times[0] - second.arrival
        if self.speech and (audio := _first_output(said := self.speech[0])) is not None:
            last = self.calls[-1] if self.calls else None
            if last is not None and last.token_times:
                out["speech_wait"] = said.arrival - last.token_times[0]
            out["first_audio"] = audio - said.arrival
            out["total"] = audio - self.stt.arrival
        return out


def _first_output(record: RequestRecord) -> float | None:
    """When a synthesis request's first audio went out (its end, if it sent one piece)."""
    return record.token_times[0] if record.token_times else record.finished_at


def spoken_turns(records: Iterable[RequestRecord], gap_s: float) -> list[SpokenTurn]:
    """The voice-class records grouped into turns (see the module's docstring)."""
    turns: list[SpokenTurn] = []
    current: SpokenTurn | None = None
    voice = sorted((r for r in records if r.priority is Priority.VOICE), key=lambda r: r.arrival)
    for record in voice:
        if record.kind is Kind.STT:
            current = SpokenTurn(record)
            turns.append(current)
        elif current is not None and record.arrival - current.last_activity <= gap_s:
            if record.kind is Kind.LLM:
                current.calls.append(record)
            elif record.kind is Kind.TTS:
                current.speech.append(record)
    return turns


def breakdown(records: Iterable[RequestRecord], gap_s: float) -> dict[str, Any]:
    """`/v1/stats` `spoken_turns`: how many turns, and each stage's p50 / p95 in ms."""
    turns = spoken_turns(records, gap_s)
    values: dict[str, list[float]] = {stage: [] for stage in STAGES}
    for turn in turns:
        for stage, seconds in turn.stages().items():
            values[stage].append(seconds)
    return {
        "turns": len(turns),
        "with_tool": sum(1 for t in turns if len(t.calls) > 1),
        "stages_ms": {
            stage: {
                "count": len(found),
                "p50": _ms(percentile(found, 50)),
                "p95": _ms(percentile(found, 95)),
            }
            for stage, found in values.items()
        },
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)
