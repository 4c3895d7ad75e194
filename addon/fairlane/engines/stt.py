"""The speech engine: Whisper on CTranslate2 (faster-whisper), one batch per planned step.

faster-whisper's own `BatchedInferencePipeline` batches the 30-second chunks of ONE file; the
utterances of a household arrive as separate requests. So the engine batches across requests
itself: the utterances of one `SttPlan` are encoded in one call and decoded in one `generate`
call, each with its own language and prompt.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fairlane.engines.placement import Placement, kind
from fairlane.policy import SeqOutput, StepResult, SttPlan

SAMPLE_RATE = 16_000
WINDOW_S = 30.0  # Whisper encodes a fixed 30-second window


class AudioError(ValueError):
    """Audio that cannot be transcribed (empty, undecodable, too long); the message says why."""


@dataclass(frozen=True)
class Utterance:
    audio: np.ndarray  # float32, 16 kHz mono
    language: str | None = None  # None: detect (multilingual models)
    prompt: str | None = None  # words to expect (names, rooms)

    @property
    def duration_s(self) -> float:
        return len(self.audio) / SAMPLE_RATE


@dataclass(frozen=True)
class TranscriptEvent:
    request_id: str
    text: str
    language: str
    duration_s: float
    finish_reason: str = "stop"


# The most audio one request may bring, silence included (VAD trims it to at most WINDOW_S of
# speech): checked while decoding, so a long or oddly declared file never fills memory.
MAX_DECODE_S = 120.0


def decode_audio(
    data: bytes, raw_pcm_rate: int | None = None, max_s: float = MAX_DECODE_S
) -> np.ndarray:
    """Any container PyAV reads (WAV, FLAC, MP3, OGG…) → float32 16 kHz mono.

    `raw_pcm_rate` marks headerless signed 16-bit little-endian mono PCM at that rate. Audio
    longer than `max_s` is refused before it is resampled (its length is counted in the
    source's own samples, frame by frame).
    """
    if not data:
        raise AudioError("the audio file is empty")
    if raw_pcm_rate is not None:
        if len(data) % 2:
            raise AudioError("raw PCM must be whole 16-bit samples (an odd number of bytes came)")
        _check_length(len(data) / 2 / raw_pcm_rate, max_s)
        samples = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
        if raw_pcm_rate == SAMPLE_RATE:
            return samples
        data = _wav_bytes(samples, raw_pcm_rate)  # let PyAV's resampler do the rate
    try:
        audio = _decode_capped(data, max_s)
    except AudioError:
        raise
    except Exception as err:  # PyAV raises many types for bad input; all mean the same here
        raise AudioError(f"could not decode the audio: {err}") from err
    if audio.size == 0:
        raise AudioError("the audio holds no samples (truncated or empty)")
    return audio


def _check_length(seconds: float, max_s: float) -> None:
    if seconds > max_s:
        raise AudioError(
            f"the audio is longer than {max_s:.0f} s, the most one request may bring: "
            "send one utterance"
        )


def _decode_capped(data: bytes, max_s: float) -> np.ndarray:
    """PyAV's decode and resample to 16 kHz mono, one frame at a time, stopping at `max_s`."""
    import av

    resampler = av.audio.resampler.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
    pieces: list[np.ndarray] = []
    seconds = 0.0
    with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as container:
        frames = container.decode(audio=0)
        while True:
            try:
                frame = next(frames)
            except StopIteration:
                break
            except av.error.InvalidDataError:  # a damaged frame: skip it, as Whisper does
                continue
            seconds += frame.samples / (frame.sample_rate or SAMPLE_RATE)
            _check_length(seconds, max_s)
            pieces.extend(f.to_ndarray().reshape(-1) for f in resampler.resample(frame))
        pieces.extend(f.to_ndarray().reshape(-1) for f in resampler.resample(None))
    if not pieces:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate(pieces).astype(np.float32) / 32768.0


def _wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    import wave

    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


def trim_silence(utterance: Utterance) -> Utterance:
    """Keep only the speech (Silero VAD); silence costs Whisper decoding time and hallucinations."""
    from faster_whisper.vad import collect_chunks, get_speech_timestamps

    speech = get_speech_timestamps(utterance.audio, sampling_rate=SAMPLE_RATE)
    if not speech:
        return Utterance(utterance.audio[:0], utterance.language, utterance.prompt)
    chunks, _ = collect_chunks(utterance.audio, speech, sampling_rate=SAMPLE_RATE)
    return Utterance(np.concatenate(chunks), utterance.language, utterance.prompt)


@dataclass(frozen=True)
class SttConfig:
    model_path: Path
    device: str = "cpu"  # "cuda" on a GPU box; CPU is the fallback
    compute_type: str = "int8"
    threads: int = 1
    beam_size: int = 1  # greedy: commands are short and latency matters
    vad: bool = False  # trim silence with faster-whisper's bundled Silero VAD (ONNX Runtime)


class WhisperEngine:
    """Whisper with cross-request batches; transcribes utterances of up to 30 seconds."""

    def __init__(self, config: SttConfig) -> None:
        import ctranslate2
        from faster_whisper import WhisperModel

        self.config = config
        device, compute_type, detail = config.device, config.compute_type, ""
        if kind(device) == "cuda" and ctranslate2.get_cuda_device_count() == 0:
            # A CPU-only CTranslate2, or no GPU visible: the CPU, said in `placement`.
            device, compute_type = "cpu", "int8"
            detail = "CTranslate2 sees no CUDA device"
        self.placement = Placement(
            "stt", kind(config.device), kind(device), detail or f"CTranslate2 on {device}"
        )
        self.model = WhisperModel(
            str(config.model_path),
            device=device,
            compute_type=compute_type,
            cpu_threads=config.threads,
        )
        self.multilingual = bool(self.model.model.is_multilingual)
        self.pending: dict[str, Utterance] = {}

    @property
    def languages(self) -> list[str]:
        return list(self.model.supported_languages) if self.multilingual else ["en"]

    def add(self, request_id: str, utterance: Utterance) -> None:
        if self.config.vad:
            utterance = trim_silence(utterance)
        if utterance.duration_s < 0.1:
            raise AudioError(
                f"the audio is too short to hold speech ({utterance.duration_s:.2f} s)"
            )
        if utterance.duration_s > WINDOW_S:
            raise AudioError(
                f"{utterance.duration_s:.0f} s of audio: the speech lane takes up to "
                f"{WINDOW_S:.0f} s per request"
            )
        if utterance.language and utterance.language not in self.languages:
            raise AudioError(f"language {utterance.language!r} is not supported by this model")
        self.pending[request_id] = utterance

    def release(self, request_id: str) -> None:
        self.pending.pop(request_id, None)

    def execute(
        self, plan: SttPlan, clock: Callable[[], float] = time.perf_counter
    ) -> tuple[StepResult, list[TranscriptEvent]]:
        """Encode every utterance of the plan in one batch, then decode them in one batch."""
        from faster_whisper.audio import pad_or_trim
        from faster_whisper.tokenizer import Tokenizer

        start = clock()
        ids = list(plan.request_ids)
        utterances = [self.pending.pop(rid) for rid in ids]
        features = np.stack(
            [pad_or_trim(self.model.feature_extractor(u.audio)) for u in utterances]
        )
        encoded = self.model.encode(features)
        languages = self._languages(encoded, utterances)
        tokenizers = [
            Tokenizer(
                self.model.hf_tokenizer, self.multilingual, task="transcribe", language=language
            )
            for language in languages
        ]
        prompts = [
            self.model.get_prompt(
                tok,
                tok.encode(" " + u.prompt.strip()) if u.prompt else [],
                without_timestamps=True,
            )
            for tok, u in zip(tokenizers, utterances, strict=True)
        ]
        results = self.model.model.generate(
            encoded,
            prompts,
            beam_size=self.config.beam_size,
            max_length=self.model.max_length,
            suppress_blank=True,
            suppress_tokens=self._suppressed(tokenizers[0]),
        )
        events = []
        for rid, u, tok, language, result in zip(
            ids, utterances, tokenizers, languages, results, strict=True
        ):
            tokens = [t for t in result.sequences_ids[0] if t < tok.eot]
            text = tok.decode(tokens).strip()
            events.append(TranscriptEvent(rid, text, language, u.duration_s))
        outputs = tuple(SeqOutput(rid, finished=True) for rid in ids)
        return StepResult(clock() - start, outputs), events

    def _languages(self, encoded: Any, utterances: list[Utterance]) -> list[str]:
        if not self.multilingual:
            return ["en"] * len(utterances)
        detected: list[str] = []
        unknown = [i for i, u in enumerate(utterances) if not u.language]
        guesses = self.model.model.detect_language(encoded) if unknown else []
        for i, u in enumerate(utterances):
            if u.language:
                detected.append(u.language)
            else:
                token, _ = guesses[i][0]  # e.g. ("<|sv|>", 0.93)
                detected.append(token[2:-2])
        return detected

    def _suppressed(self, tokenizer: Any) -> list[int]:
        from faster_whisper.transcribe import get_suppressed_tokens

        return list(get_suppressed_tokens(tokenizer, [-1]))
