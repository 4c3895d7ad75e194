"""When to transcribe early: the speaker's first pause, by loudness, while the client is still
sending the trailing silence its own VAD waits for; and whether speech came after it (Silero
VAD), which decides whether the early transcript stands."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairlane.engines.stt import SAMPLE_RATE


@dataclass
class PauseDetector:
    """Finds the speaker's first pause in a stream of 16 kHz 16-bit chunks, by loudness: a
    chunk is speech when its RMS is above a tenth of the loudest chunk so far (and above a
    floor). It only decides when to transcribe early; whether the early transcript stands is
    decided at the end with Silero VAD (`speech_after`). The integration's STT entity has its
    own copy (it cannot import the server); both keep tests/fixtures/pause-detector.json."""

    pause_s: float = 0.3
    floor: float = 0.01
    loudest: float = 0.0
    heard: bool = False
    speaking: bool = False  # the last chunk was speech
    quiet_s: float = 0.0

    def feed(self, chunk: bytes) -> bool:
        """True once, when the trailing quiet first reaches `pause_s` after speech."""
        samples = pcm_floats(chunk)
        if samples.size == 0:
            return False
        rms = float(np.sqrt(np.mean(samples**2)))
        self.loudest = max(self.loudest, rms)
        self.speaking = rms > max(self.floor, 0.1 * self.loudest)
        if self.speaking:
            self.heard, self.quiet_s = True, 0.0
            return False
        before = self.quiet_s
        self.quiet_s += samples.size / SAMPLE_RATE
        return self.heard and before < self.pause_s <= self.quiet_s


def pcm_floats(pcm: bytes) -> np.ndarray:
    return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0


def speech_after(audio: np.ndarray, start: int) -> bool:
    """Whether Silero VAD hears speech in `audio` after sample `start` (a soft last word the
    loudness rule missed keeps the early transcript from standing)."""
    from faster_whisper.vad import VadOptions, get_speech_timestamps

    tail = audio[max(0, start - SAMPLE_RATE // 10) :]
    if tail.size < SAMPLE_RATE // 10:
        return False
    options = VadOptions(min_speech_duration_ms=100)
    return any(
        segment["end"] > SAMPLE_RATE // 10
        for segment in get_speech_timestamps(tail, options, sampling_rate=SAMPLE_RATE)
    )
