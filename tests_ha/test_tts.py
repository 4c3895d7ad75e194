"""Fairlane's voice in Home Assistant: the TTS entity (streamed text in, streamed audio out), the
whole spoken turn through HA's pipeline, and HA's own Wyoming integration speaking with it."""

from __future__ import annotations

import io
import wave
from collections.abc import AsyncGenerator
from typing import Any

from homeassistant.components import assist_pipeline, tts
from homeassistant.components.tts.entity import TTSAudioRequest
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import entity_registry as er
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.fairlane.entity import stable_first
from custom_components.fairlane.tts import first_piece, sentences
from tests_ha.conftest import add_kitchen_light, add_wyoming, spoken, voice_metadata, voice_pipeline

TTS_ENTITY = "tts.fairlane_text_to_speech"
REPLY = "The kitchen lights are on. The front door is locked."


def test_streamed_text_is_cut_into_complete_sentences() -> None:
    assert sentences("Hi there. It is 3.5 degrees! And") == (
        ["Hi there.", "It is 3.5 degrees!"], "And"
    )
    assert sentences("no end yet") == ([], "no end yet")


def test_the_first_clause_is_spoken_before_its_sentence_ends() -> None:
    """A small model's reply is often one long sentence: its first clause goes at once."""
    assert first_piece("I have turned on the kitchen lights, and the hall") == (
        "I have turned on the kitchen lights,", "and the hall"
    )
    assert first_piece("Sure, I have") == (None, "Sure, I have")  # too short a clause
    assert first_piece("It is 3.5 degrees and") == (None, "It is 3.5 degrees and")
    long = "one two three four five six seven eight nine ten eleven twelve thirteen"
    assert first_piece(long) == (
        "one two three four five six seven eight nine ten eleven twelve", "thirteen"
    )
    assert first_piece("The lights are on. More") == ("The lights are on.", "More")


async def _text(reply: str) -> AsyncGenerator[str]:
    for offset in range(0, len(reply), 7):  # as an LLM streams its reply
        yield reply[offset : offset + 7]


def _entity(hass: HomeAssistant, entity_id: str) -> tts.TextToSpeechEntity:
    entity = hass.data[tts.DATA_COMPONENT].get_entity(entity_id)
    assert isinstance(entity, tts.TextToSpeechEntity)
    return entity


async def _heard(entry: MockConfigEntry, wav_stream: bytes) -> str:
    """Transcribe what was spoken (its WAV header says nothing of the length: a stream)."""
    with wave.open(io.BytesIO(wav_stream[:44])) as header:
        rate = header.getframerate()
    pcm = wav_stream[44:]
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(pcm)
    return await entry.runtime_data.client.transcribe(buffer.getvalue(), language="en")


async def test_the_tts_entity_streams_the_reply_sentence_by_sentence(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    entity = _entity(hass, TTS_ENTITY)
    assert entity.async_supports_streaming_input()
    assert entity.supported_languages == ["en-US"]
    voices = entity.async_get_supported_voices("en-US")
    assert voices and voices[0].voice_id == "en_US-joe-medium"
    assert entity.async_get_supported_voices("de-DE") is None
    before = (await entry.runtime_data.client.stats())["classes"]["voice"]["tts"]["requests"]

    response = await entity.async_stream_tts_audio(
        TTSAudioRequest(language="en-US", options={}, message_gen=_text(REPLY))
    )
    pieces = [piece async for piece in response.data_gen]
    assert response.extension == "wav" and pieces[0].startswith(b"RIFF")
    assert len(pieces) == 3  # the header, then one piece per sentence
    heard = await _heard(entry, b"".join(pieces))
    assert "kitchen" in heard.lower() and "locked" in heard.lower()
    after = (await entry.runtime_data.client.stats())["classes"]["voice"]["tts"]["requests"]
    assert after - before == 2  # each sentence went to the server as voice work

    extension, audio = await entity.async_get_tts_audio("Dinner is ready.", "en-US", {})
    assert extension == "wav" and audio is not None and audio.startswith(b"RIFF")


async def test_a_piece_with_no_words_is_not_sent_to_be_spoken(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    """A reply that echoes JSON breaks into pieces such as `"}}` that hold nothing to say. The
    server refuses those (400), which ended the whole spoken reply; they are left out."""
    entity = _entity(hass, TTS_ENTITY)
    before = (await entry.runtime_data.client.stats())["classes"]["voice"]["tts"]["requests"]
    reply = 'The kitchen lights are on now, as you asked.\n"}}\n...\nAnything else?\n}'
    response = await entity.async_stream_tts_audio(
        TTSAudioRequest(language="en-US", options={}, message_gen=_text(reply))
    )
    pieces = [piece async for piece in response.data_gen]
    assert len(pieces) == 4  # the header, then "The kitchen lights are on now," and two more
    after = (await entry.runtime_data.client.stats())["classes"]["voice"]["tts"]["requests"]
    assert after - before == 3


async def test_home_assistants_pipeline_speaks_the_reply_through_fairlane(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    assert await add_kitchen_light(hass, "Kitchen lights") == "light.kitchen_lights"
    pipeline_id = await voice_pipeline(hass, TTS_ENTITY)
    events: list[Any] = []

    await assist_pipeline.async_pipeline_from_audio_stream(
        hass,
        context=Context(),
        event_callback=events.append,
        stt_metadata=voice_metadata(),
        stt_stream=spoken("command-00.wav"),  # "turn on the kitchen lights"
        pipeline_id=pipeline_id,
        device_id="kitchen-satellite",
        # WAV as the voice makes it: no ffmpeg conversion (a satellite may ask for another
        # format; Home Assistant then converts with its ffmpeg).
        tts_audio_output={tts.ATTR_PREFERRED_FORMAT: "wav"},
        end_stage=assist_pipeline.PipelineStage.TTS,
    )
    kinds = [e.type for e in events]
    assert assist_pipeline.PipelineEventType.ERROR not in kinds, events
    assert hass.states.get("light.kitchen_lights").state == "on"
    start = next(e for e in events if e.type is assist_pipeline.PipelineEventType.TTS_START)
    assert start.data["engine"] == TTS_ENTITY
    end = next(e for e in events if e.type is assist_pipeline.PipelineEventType.TTS_END)
    stream = tts.async_get_stream(hass, end.data["tts_output"]["token"])
    assert stream is not None
    audio = b"".join([chunk async for chunk in stream.async_stream_result()])
    assert audio.startswith(b"RIFF") and len(audio) > 22050  # at least half a second spoken


async def test_home_assistants_wyoming_integration_speaks_with_fairlane(
    hass: HomeAssistant, fairlane_server, socket_enabled
) -> None:
    entry = await add_wyoming(hass, fairlane_server.wyoming_port)
    entities = er.async_entries_for_config_entry(er.async_get(hass), entry.entry_id)
    tts_id = next(e.entity_id for e in entities if e.domain == "tts")
    entity = _entity(hass, tts_id)
    assert entity.async_supports_streaming_input()

    response = await entity.async_stream_tts_audio(
        TTSAudioRequest(language="en_US", options={}, message_gen=_text(REPLY))
    )
    streamed = b"".join([piece async for piece in response.data_gen])
    assert streamed.startswith(b"RIFF") and len(streamed) > 2 * 22050
    extension, audio = await entity.async_get_tts_audio("Dinner is ready.", "en_US", {})
    assert extension == "wav" and audio is not None and len(audio) > 22050

    assert await hass.config_entries.async_unload(entry.entry_id)
    await hass.async_block_till_done()


# --- the prompt, cache-friendly ---------------------------------------------------------------


def _system(time: str) -> str:
    return (
        "You are a voice assistant for Home Assistant.\nAnswer in plain text.\n"
        "Static Context: An overview of the areas and the devices in this smart home:\n"
        + "".join(f"- names: Lamp {i}\n  domain: light\n  areas: Room {i}\n" for i in range(40))
        + f"Current time is {time}. Today's date is 2026-12-03.\n"
    )


def test_the_time_moves_from_the_system_prompt_to_the_newest_user_message() -> None:
    messages = [
        {"role": "system", "content": _system("14:03:22")},
        {"role": "user", "content": "turn on the lamp"},
    ]
    out = stable_first(messages)
    assert "Current time" not in out[0]["content"] and out[0]["content"].endswith("Room 39")
    assert out[1]["content"] == (
        "turn on the lamp\n\n(Current time is 14:03. Today's date is 2026-12-03.)"
    )
    assert messages[1]["content"] == "turn on the lamp"  # the chat log's copy is untouched


async def test_turns_seconds_apart_reuse_the_cached_system_prompt_and_tools(
    entry: MockConfigEntry,
) -> None:
    client = entry.runtime_data.client
    tools = [{"type": "function", "function": {
        "name": "HassTurnOn", "description": "Turns on a device",
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}}}}}]
    cached = []
    for time, ask in (("14:03:22", "is the lamp on?"), ("14:03:31", "turn off room 3")):
        messages = stable_first([
            {"role": "system", "content": _system(time)}, {"role": "user", "content": ask}
        ])
        body = {"messages": messages, "tools": tools, "max_tokens": 1,
                "stream_options": {"include_usage": True}, "fairlane_class": "voice"}
        usage = [c["usage"] async for c in client.chat_stream(body) if c.get("usage")][-1]
        cached.append(usage["prompt_tokens_details"]["cached_tokens"] / usage["prompt_tokens"])
    assert cached[1] > 0.8, cached  # all but the newest question and the time came from cache
