"""Speech-to-text: the voice pipeline's audio, transcribed by the server in the voice lane."""

from __future__ import annotations

import array
import asyncio
import contextlib
import importlib
import logging
import math
from collections.abc import AsyncIterable
from dataclasses import dataclass
from typing import Any

from homeassistant.components import stt
from homeassistant.config_entries import ConfigSubentry
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .client import FairlaneError
from .const import SUBENTRY_STT, WHISPER_LANGUAGES
from .coordinator import FairlaneConfigEntry
from .entity import FairlaneSubentryEntity

_LOGGER = logging.getLogger(__name__)
PARALLEL_UPDATES = 0


async def async_setup_entry(
    hass: HomeAssistant,
    entry: FairlaneConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    if not entry.runtime_data.info.stt_model:
        return  # the server runs without speech-to-text
    for subentry in entry.subentries.values():
        if subentry.subentry_type == SUBENTRY_STT:
            async_add_entities(
                [FairlaneSpeechToText(entry, subentry)], config_subentry_id=subentry.subentry_id
            )


VAD_FRAME = 320  # pymicro-vad takes 10 ms of 16 kHz 16-bit audio at a time
VAD_SPEECH = 0.5  # the speech probability the assist pipeline's own segmenter counts as speech


def micro_vad() -> Any:
    """Home Assistant's own voice activity detector, or None where it is not installed.

    pymicro-vad is the assist pipeline's requirement (the pipeline ends an utterance with it),
    so it is there wherever a voice pipeline runs; the integration does not require it."""
    try:
        return importlib.import_module("pymicro_vad").MicroVad()
    except ImportError:
        return None


@dataclass
class Pause:
    """The speaker's first pause in 16-bit PCM chunks, by loudness: a chunk is speech when its
    RMS is above a tenth of the loudest so far (and a floor). The server's Wyoming side uses
    the same rule; this copy lives here because the integration cannot import the server, and
    both keep one specification (tests/fixtures/pause-detector.json, played by both suites).

    Whether anyone spoke after the pause (so the early transcript cannot stand) is a voice
    activity detector's call where one is given (`vad`: pymicro-vad, 16 kHz): a soft last word
    is speech to it at a hundredth of full scale, where the loudness rule hears quiet. Its
    speech probability lingers ~0.3 s after a word ends, so after the pause it counts only once
    it has first fallen below `VAD_SPEECH`."""

    rate: int = 16000
    pause_s: float = 0.3
    floor: float = 0.01 * 32768
    loudest: float = 0.0
    heard: bool = False
    speaking: bool = False
    quiet_s: float = 0.0
    since_pause: float = 0.0  # the loudest chunk since the pause
    vad: Any = None  # pymicro_vad.MicroVad, or None: loudness alone
    paused: bool = False
    vad_fell: bool = False  # the detector's probability fell below speech after the pause
    voice_after_pause: bool = False
    _frames: bytes = b""

    @property
    def still_quiet(self) -> bool:
        """Nobody spoke since the pause: by the voice activity detector where there is one;
        else nothing as loud as a twentieth of the loudest speech (stricter than the rule for
        speech, so a soft last word drops the early transcript)."""
        if self.vad is not None:
            return not self.voice_after_pause
        return self.since_pause <= max(self.floor, 0.05 * self.loudest)

    def feed(self, chunk: bytes) -> bool:
        """True once, when the quiet after speech first reaches `pause_s`."""
        if self.vad is not None:
            self._listen(chunk)
        samples = array.array("h", chunk[: len(chunk) // 2 * 2])
        if not samples:
            return False
        rms = math.sqrt(sum(x * x for x in samples) / len(samples))
        self.loudest = max(self.loudest, rms)
        self.since_pause = max(self.since_pause, rms)
        self.speaking = rms > max(self.floor, 0.1 * self.loudest)
        if self.speaking:
            self.heard, self.quiet_s = True, 0.0
            return False
        before = self.quiet_s
        self.quiet_s += len(samples) / self.rate
        if self.heard and before < self.pause_s <= self.quiet_s:
            self.since_pause = 0.0
            self.paused, self.vad_fell, self.voice_after_pause = True, False, False
            return True
        return False

    def _listen(self, chunk: bytes) -> None:
        frames = self._frames + chunk
        whole = len(frames) // VAD_FRAME * VAD_FRAME
        for start in range(0, whole, VAD_FRAME):
            speech = self.vad.Process10ms(frames[start : start + VAD_FRAME]) >= VAD_SPEECH
            if not self.paused:
                continue
            if not speech:
                self.vad_fell = True
            elif self.vad_fell:
                self.voice_after_pause = True
        self._frames = frames[whole:]


class FairlaneSpeechToText(stt.SpeechToTextEntity, FairlaneSubentryEntity):
    """Whisper on the Fairlane server, recognition started at the speaker's first pause.

    The pipeline streams audio until its VAD has heard enough silence (0.7 s by default) to
    end the utterance. At the first 0.3 s of quiet after speech the audio so far is sent for
    transcription; if nothing loud comes after it, that transcript is the answer when the
    stream ends (it is usually ready by then); if the speaker goes on, it is dropped and the
    whole utterance is sent at the end. An early transcript ready while the stream still runs
    begins the agent's turn on the server at once (`guess`). The server transcribes complete
    utterances (≤ 30 s); on a LAN the upload of a few seconds of 16 kHz audio costs
    milliseconds."""

    _attr_name = None

    def __init__(self, entry: FairlaneConfigEntry, subentry: ConfigSubentry) -> None:
        model = entry.runtime_data.info.stt_model or ""
        super().__init__(entry, subentry, model)
        self._languages = ["en"] if model.endswith(".en") else list(WHISPER_LANGUAGES)

    @property
    def supported_languages(self) -> list[str]:
        return self._languages

    @property
    def supported_formats(self) -> list[stt.AudioFormats]:
        return [stt.AudioFormats.WAV]

    @property
    def supported_codecs(self) -> list[stt.AudioCodecs]:
        return [stt.AudioCodecs.PCM]

    @property
    def supported_bit_rates(self) -> list[stt.AudioBitRates]:
        return [stt.AudioBitRates.BITRATE_16]

    @property
    def supported_sample_rates(self) -> list[stt.AudioSampleRates]:
        return [stt.AudioSampleRates.SAMPLERATE_16000]

    @property
    def supported_channels(self) -> list[stt.AudioChannels]:
        return [stt.AudioChannels.CHANNEL_MONO]

    async def async_process_audio_stream(
        self, metadata: stt.SpeechMetadata, stream: AsyncIterable[bytes]
    ) -> stt.SpeechResult:
        audio = bytearray()
        rate = int(metadata.sample_rate)
        pause = Pause(rate=rate, vad=micro_vad() if rate == 16000 else None)
        early: asyncio.Task[str] | None = None
        streaming = True
        guess = self.entry.runtime_data.guess

        def transcribed(task: asyncio.Task[str]) -> None:
            # The words are here before the end of speech: the agent's turn can begin.
            if streaming and pause.still_quiet and guess is not None and not task.cancelled() \
                    and task.exception() is None:
                self.hass.async_create_task(guess.send(task.result().strip()))

        try:
            async for chunk in stream:
                audio += chunk
                if pause.feed(chunk) and early is None:
                    early = self.hass.async_create_task(self._transcribe(bytes(audio), metadata))
                    early.add_done_callback(transcribed)
                elif early is not None and (pause.speaking or pause.voice_after_pause):
                    if early.done() and guess is not None:
                        self.hass.async_create_task(guess.drop())  # so is the turn begun on it
                    early.cancel()  # they went on talking: the transcript is stale
                    early = None
            streaming = False
            if early is not None and pause.still_quiet:
                text = await early  # nothing said since the pause: the guess stands
            else:
                text = await self._transcribe(bytes(audio), metadata)
        except FairlaneError:
            _LOGGER.exception("Transcription failed")
            return stt.SpeechResult(None, stt.SpeechResultState.ERROR)
        finally:
            streaming = False
            if early is not None and not early.done():
                early.cancel()
                with contextlib.suppress(asyncio.CancelledError, FairlaneError):
                    await early
        if guess is not None:
            guess.heard(text.strip())
        return stt.SpeechResult(text.strip(), stt.SpeechResultState.SUCCESS)

    async def _transcribe(self, audio: bytes, metadata: stt.SpeechMetadata) -> str:
        return await self.entry.runtime_data.client.transcribe(
            audio,
            # HA speaks of "en-US"; Whisper of "en".
            language=metadata.language.split("-")[0].lower() or None,
            sample_rate=int(metadata.sample_rate),
            fairlane_class="voice",
        )
