"""The server's pause detector keeps the specification it shares with the integration's
(tests/fixtures/pause-detector.json; tests_ha/test_pause_detector.py plays the same cases)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fairlane.voice.pause import PauseDetector

SPEC = json.loads((Path(__file__).parents[1] / "fixtures" / "pause-detector.json").read_text())


def chunk(rms: float) -> bytes:
    """A chunk of 16-bit PCM whose RMS is `rms` of full scale (a square wave)."""
    level = round(rms * 32767)
    samples = np.tile(np.array([level, -level], dtype="<i2"), SPEC["chunk_samples"] // 2)
    return samples.tobytes()


@pytest.mark.parametrize("case", SPEC["cases"], ids=[c["name"] for c in SPEC["cases"]])
def test_pause_detector_keeps_the_shared_specification(case: dict) -> None:
    detector = PauseDetector(pause_s=SPEC["pause_s"])
    played = [chunk(rms) for rms, count in case["chunks"] for _ in range(count)]
    fired = [index for index, piece in enumerate(played) if detector.feed(piece)]
    assert fired == case["fires_at"]
