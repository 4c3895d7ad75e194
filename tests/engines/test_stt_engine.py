"""The Whisper engine's own behaviour: one batch equals the utterances one by one; VAD trims."""

from __future__ import annotations

import json
import wave
from pathlib import Path

import numpy as np
import pytest

from fairlane.engines import models
from fairlane.engines.stt import AudioError, SttConfig, Utterance, WhisperEngine
from fairlane.policy import Priority, SttPlan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "speech"
COMMANDS = json.loads((FIXTURES / "commands.json").read_text())


def _audio(name: str) -> np.ndarray:
    with wave.open(str(FIXTURES / name)) as wav:
        return np.frombuffer(wav.readframes(wav.getnframes()), "<i2").astype(np.float32) / 32768


@pytest.fixture(scope="module")
def engine() -> WhisperEngine:
    return WhisperEngine(SttConfig(Path(models.resolve_stt("whisper-tiny.en")), threads=1))


def _run(engine: WhisperEngine, names: list[str]) -> list[str]:
    ids = [f"u{i}" for i in range(len(names))]
    for rid, name in zip(ids, names, strict=True):
        engine.add(rid, Utterance(_audio(name), "en"))
    result, events = engine.execute(SttPlan(tuple(ids), Priority.VOICE, 0.0, 0.0))
    assert [o.request_id for o in result.outputs] == ids and all(o.finished for o in result.outputs)
    return [e.text for e in events]


def test_a_cross_request_batch_transcribes_each_utterance_as_alone(engine) -> None:
    names = ["command-00.wav", "command-04.wav", "command-07.wav"]
    together = _run(engine, names)
    alone = [_run(engine, [name])[0] for name in names]
    assert together == alone


def test_vad_trims_the_silence_around_a_command() -> None:
    engine = WhisperEngine(SttConfig(Path(models.resolve_stt("whisper-tiny.en")), vad=True))
    silence = np.zeros(16000 * 3, dtype=np.float32)
    speech = _audio("command-05.wav")
    engine.add("padded", Utterance(np.concatenate([silence, speech, silence]), "en"))
    assert engine.pending["padded"].duration_s < len(speech) / 16000 + 1.0
    _, events = engine.execute(SttPlan(("padded",), Priority.VOICE, 0.0, 0.0))
    assert "door" in events[0].text.lower()
    with pytest.raises(AudioError, match="too short"):
        engine.add("silent", Utterance(silence, "en"))
