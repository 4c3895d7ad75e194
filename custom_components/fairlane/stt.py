"""Speech-to-text: the voice pipeline's audio, transcribed by the server in the voice lane."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable

from homeassistant.components import stt
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from . import FairlaneConfigEntry
from .client import FairlaneError
from .const import WHISPER_LANGUAGES
from .entity import device_info

_LOGGER = logging.getLogger(__name__)
PARALLEL_UPDATES = 0


async def async_setup_entry(
    hass: HomeAssistant,
    entry: FairlaneConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    if entry.runtime_data.info.stt_model:
        async_add_entities([FairlaneSpeechToText(entry)])


class FairlaneSpeechToText(stt.SpeechToTextEntity):
    """Whisper on the Fairlane server. The utterance is sent whole once the pipeline's VAD
    ends it: the server transcribes complete utterances (≤ 30 s), and on a LAN the upload
    of a few seconds of 16 kHz audio costs milliseconds."""

    _attr_has_entity_name = True
    _attr_translation_key = "stt"

    def __init__(self, entry: FairlaneConfigEntry) -> None:
        self.entry = entry
        self._attr_unique_id = f"{entry.entry_id}_stt"
        self._attr_device_info = device_info(entry)
        model = entry.runtime_data.info.stt_model or ""
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
        audio = b"".join([chunk async for chunk in stream])
        try:
            text = await self.entry.runtime_data.client.transcribe(
                audio,
                # HA speaks of "en-US"; Whisper of "en".
                language=metadata.language.split("-")[0].lower() or None,
                sample_rate=int(metadata.sample_rate),
                fairlane_class="voice",
            )
        except FairlaneError:
            _LOGGER.exception("Transcription failed")
            return stt.SpeechResult(None, stt.SpeechResultState.ERROR)
        return stt.SpeechResult(text.strip(), stt.SpeechResultState.SUCCESS)
