"""Text-to-speech: the agent's reply spoken by the server's voice, in the voice lane.

Home Assistant's pipeline streams the agent's text into `async_stream_tts_audio` as the LLM
writes it. The reply's first clause, then each sentence, is sent to the server as soon as it
is complete (at most two at a time), and its audio is streamed on as soon as it comes back:
the first words are heard while the agent is still writing the rest.
"""

from __future__ import annotations

import asyncio
import io
import logging
import re
import wave
from collections.abc import AsyncGenerator
from typing import Any

from homeassistant.components import tts
from homeassistant.components.tts.entity import TTSAudioRequest, TTSAudioResponse
from homeassistant.config_entries import ConfigSubentry
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .client import FairlaneError
from .const import SUBENTRY_TTS
from .coordinator import FairlaneConfigEntry
from .entity import FairlaneSubentryEntity

_LOGGER = logging.getLogger(__name__)
PARALLEL_UPDATES = 0
# A sentence ends at . ! ? ; : followed by white space, or at a line break.
SENTENCE_END = re.compile(r"[.!?;:][\"')\]]*\s|\n")
IN_FLIGHT = 2  # sentences requested ahead of the one being played
# The reply's first piece need not wait for its sentence's end: it is sent at the first clause
# boundary (a comma, semicolon, colon or dash before white space, or a sentence end) once it
# has FIRST_PIECE_MIN_WORDS words, or at a word boundary once it has FIRST_PIECE_MAX_WORDS
# without one. A small model's reply is often one long sentence, and the person hears nothing
# until it is written.
CLAUSE_END = re.compile(r"[,;:.!?\u2014][\"')\]]*\s|\n")
FIRST_PIECE_MIN_WORDS = 4
FIRST_PIECE_MAX_WORDS = 12


async def async_setup_entry(
    hass: HomeAssistant,
    entry: FairlaneConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    if not entry.runtime_data.info.tts_voice:
        return  # the server runs without a voice
    for subentry in entry.subentries.values():
        if subentry.subentry_type == SUBENTRY_TTS:
            async_add_entities(
                [FairlaneTextToSpeech(entry, subentry)], config_subentry_id=subentry.subentry_id
            )


def sentences(text: str) -> tuple[list[str], str]:
    """The complete sentences at the start of `text`, and the rest."""
    done: list[str] = []
    start = 0
    for match in SENTENCE_END.finditer(text):
        if sentence := text[start : match.end()].strip():
            done.append(sentence)
        start = match.end()
    return done, text[start:]


def has_words(piece: str) -> bool:
    """Whether a piece holds anything to say: the server refuses one without a word (`"}}`
    where a small model echoes JSON, or "..."), and one refusal would end the whole reply."""
    return re.search(r"\w", piece) is not None


def first_piece(text: str) -> tuple[str | None, str]:
    """The reply's first piece to speak, if `text` holds one yet, and the rest."""
    for match in CLAUSE_END.finditer(text):
        if len(text[: match.end()].split()) >= FIRST_PIECE_MIN_WORDS:
            return text[: match.end()].strip(), text[match.end() :]
    words = list(re.finditer(r"\S+\s", text))
    if len(words) >= FIRST_PIECE_MAX_WORDS:
        cut = words[FIRST_PIECE_MAX_WORDS - 1].end()
        return text[:cut].strip(), text[cut:]
    return None, text


def pcm_of(wav_bytes: bytes) -> tuple[bytes, int]:
    with wave.open(io.BytesIO(wav_bytes)) as wav:
        return wav.readframes(wav.getnframes()), wav.getframerate()


def streaming_header(rate: int) -> bytes:
    """A WAV header with no frame count: the stream's length is not known yet."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
    return buffer.getvalue()


class FairlaneTextToSpeech(tts.TextToSpeechEntity, FairlaneSubentryEntity):
    """The server's Piper voice; text streamed in, audio streamed out, sentence by sentence."""

    # Home Assistant's TTS needs an engine name, so this entity is named by its subentry (as
    # core's TTS entities of subentries are), not by its device.
    _attr_has_entity_name = False

    def __init__(self, entry: FairlaneConfigEntry, subentry: ConfigSubentry) -> None:
        voice = entry.runtime_data.info.tts_voice or ""
        super().__init__(entry, subentry, voice)
        self._attr_name = subentry.title
        self._voice = voice
        # "en_US-joe-medium" → "en-US", Home Assistant's spelling of the language.
        language = voice.split("-")[0].replace("_", "-") or "en-US"
        self._attr_supported_languages = [language]
        self._attr_default_language = language
        self._attr_supported_options = [tts.ATTR_VOICE]

    def async_get_supported_voices(self, language: str) -> list[tts.Voice] | None:
        if language not in self._attr_supported_languages:
            return None
        return [tts.Voice(voice_id=self._voice, name=self._voice)]

    async def async_get_tts_audio(
        self, message: str, language: str, options: dict[str, Any]
    ) -> tts.TtsAudioType:
        try:
            audio = await self.entry.runtime_data.client.speak(
                message, voice=options.get(tts.ATTR_VOICE), fairlane_class="voice"
            )
        except FairlaneError as err:
            raise HomeAssistantError(f"Fairlane could not speak the text: {err}") from err
        return "wav", audio

    async def async_stream_tts_audio(self, request: TTSAudioRequest) -> TTSAudioResponse:
        voice = request.options.get(tts.ATTR_VOICE)
        client = self.entry.runtime_data.client
        order: asyncio.Queue[asyncio.Task[bytes] | BaseException | None] = asyncio.Queue()
        slots = asyncio.Semaphore(IN_FLIGHT)

        async def request_sentence(text: str) -> bytes:
            return await client.speak(text, voice=voice, fairlane_class="voice")

        async def produce() -> None:
            try:
                rest, started = "", False
                async for chunk in request.message_gen:
                    rest += chunk
                    done: list[str] = []
                    if not started:
                        piece, rest = first_piece(rest)
                        if piece:
                            done.append(piece)
                            started = True
                    if started:
                        more, rest = sentences(rest)
                        done += more
                    for sentence in filter(has_words, done):
                        await slots.acquire()
                        order.put_nowait(asyncio.create_task(request_sentence(sentence)))
                if has_words(rest):
                    await slots.acquire()
                    order.put_nowait(asyncio.create_task(request_sentence(rest.strip())))
                order.put_nowait(None)
            except Exception as err:  # the consumer raises it in order
                order.put_nowait(err)

        producer = self.entry.async_create_background_task(
            self.hass, produce(), "fairlane tts text"
        )

        async def data_gen() -> AsyncGenerator[bytes]:
            header_sent = False
            try:
                while (item := await order.get()) is not None:
                    if isinstance(item, BaseException):
                        raise item
                    try:
                        pcm, rate = pcm_of(await item)
                    except FairlaneError as err:
                        raise HomeAssistantError(f"Fairlane could not speak: {err}") from err
                    except (wave.Error, EOFError) as err:
                        raise HomeAssistantError(
                            f"Fairlane's answer is not WAV audio: {err}"
                        ) from err
                    finally:
                        slots.release()
                    if not header_sent:
                        yield streaming_header(rate)
                        header_sent = True
                    yield pcm
            finally:
                producer.cancel()
                while not order.empty():
                    if isinstance(item := order.get_nowait(), asyncio.Task):
                        item.cancel()

        return TTSAudioResponse("wav", data_gen())
