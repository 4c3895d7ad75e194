"""The integration's pause detector keeps the specification it shares with the server's
(tests/fixtures/pause-detector.json; tests/voice/test_pause_detector.py plays the same cases)."""

from __future__ import annotations

import array
import json
from pathlib import Path
from typing import Any

import pytest

from custom_components.fairlane.stt import Pause

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
