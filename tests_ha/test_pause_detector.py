"""The integration's pause detector keeps the specification it shares with the server's
(tests/fixtures/pause-detector.json; tests/voice/test_pause_detector.py plays the same cases)."""

from __future__ import annotations

import array
import json
import wave
from pathlib import Path
from typing import Any

import pytest

from custom_components.fairlane.stt import Pause, micro_vad
from tests_ha.conftest import SPEECH

SPEC = json.loads(
    (Path(__file__).parents[1] / "tests" / "fixtures" / "pause-detector.json").read_text()
)


def chunk(rms: float) -> bytes:
    """A chunk of 16-bit PCM whose RMS is `rms` of full scale (a square wave)."""
    level = round(rms * 32767)
    return array.array("h", [level, -level] * (SPEC["chunk_samples"] // 2)).tobytes()


@pytest.mark.parametrize("case", SPEC["cases"], ids=[c["name"] for c in SPEC["cases"]])
def test_pause_keeps_the_shared_specification(case: dict[str, Any]) -> None:
    pause = Pause(rate=SPEC["rate"], pause_s=SPEC["pause_s"])
    played = [chunk(rms) for rms, count in case["chunks"] for _ in range(count)]
    fired = [index for index, piece in enumerate(played) if pause.feed(piece)]
    assert fired == case["fires_at"]


def _recording(name: str) -> bytes:
    with wave.open(str(SPEECH / name)) as wav:
        return wav.readframes(wav.getnframes())


def _scaled(pcm: bytes, factor: float) -> bytes:
    return array.array("h", (int(x * factor) for x in array.array("h", pcm))).tobytes()


def _after_the_pause(audio: bytes, vad: Any) -> bool:
    """Play `audio` in 32 ms chunks; whether the early transcript would stand at the end."""
    pause = Pause(vad=vad)
    fired = [pause.feed(audio[i : i + 1024]) for i in range(0, len(audio), 1024)]
    assert any(fired)
    return pause.still_quiet


@pytest.mark.parametrize("level", [0.03, 0.01])
def test_a_soft_word_after_the_pause_is_heard_by_home_assistant_s_vad(level: float) -> None:
    """A command, half a second of quiet, then a second sentence at 3% or 1% of its loudness:
    the loudness rule calls that quiet and would let the early transcript (the first sentence
    alone) stand; the assist pipeline's own VAD (pymicro-vad) hears the speech."""
    command, more = _recording("command-00.wav"), _recording("command-03.wav")
    audio = command + bytes(16000) + _scaled(more, level)
    assert _after_the_pause(audio, None)  # loudness: quiet, the guess would stand
    assert not _after_the_pause(audio, micro_vad())


def test_quiet_after_the_pause_lets_the_early_transcript_stand() -> None:
    """The detector's lingering speech probability just after the command is not a new word."""
    assert micro_vad() is not None  # the assist pipeline's requirement is installed
    assert _after_the_pause(_recording("command-00.wav") + bytes(32000), micro_vad())
