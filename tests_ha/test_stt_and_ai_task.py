"""Speech-to-text through the entity and HA's HTTP API; AI tasks with and without structure."""

from __future__ import annotations

import asyncio
import json
import wave
from collections.abc import AsyncIterator
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
import voluptuous as vol
from homeassistant.components import ai_task, conversation, stt
from homeassistant.core import Context, HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import selector
from homeassistant.helpers.script import script_stack_cv
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry
from pytest_homeassistant_custom_component.typing import ClientSessionGenerator
from tests.pdf import pdf_bytes

from custom_components.fairlane.ai_task import task_class
from custom_components.fairlane.const import CLASS_AUTO
from custom_components.fairlane.conversation import turn_class
from tests_ha.conftest import SPEECH, voice_metadata

STT_ENTITY = "stt.fairlane_speech_to_text"
AI_TASK_ENTITY = "ai_task.fairlane_ai_task"
COMMANDS: dict[str, str] = json.loads((SPEECH / "commands.json").read_text())


def _pcm(name: str) -> bytes:
    with wave.open(str(SPEECH / name)) as wav:
        return wav.readframes(wav.getnframes())


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    for offset in range(0, len(data), 2048):  # as the voice pipeline streams it
        yield data[offset : offset + 2048]


async def test_the_stt_entity_transcribes_the_pipelines_audio(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    engine = stt.async_get_speech_to_text_engine(hass, STT_ENTITY)
    assert engine is not None and "en" in engine.supported_languages
    metadata = voice_metadata("en-US")
    result = await engine.async_process_audio_stream(metadata, _chunks(_pcm("command-00.wav")))
    assert result.result is stt.SpeechResultState.SUCCESS
    assert "kitchen" in (result.text or "").lower()


SILENCE = bytes(16000 * 2 * 8 // 10)  # 0.8 s: what the pipeline's VAD waits before it ends


async def _stt_requests(entry: MockConfigEntry) -> int:
    stats = await entry.runtime_data.client.stats()
    return int(stats["classes"]["voice"]["stt"]["requests"])


async def test_the_stt_entity_starts_at_the_pause_before_the_stream_ends(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    engine = stt.async_get_speech_to_text_engine(hass, STT_ENTITY)
    assert engine is not None
    before = await _stt_requests(entry)

    async def spoken() -> AsyncIterator[bytes]:
        async for chunk in _chunks(_pcm("command-05.wav") + SILENCE):
            yield chunk
        # The stream stays open (the pipeline's VAD is still listening) until the server has
        # transcribed what came before the pause.
        for _ in range(600):
            if await _stt_requests(entry) > before:
                return
            await asyncio.sleep(0.1)

    result = await engine.async_process_audio_stream(voice_metadata("en-US"), spoken())
    assert result.result is stt.SpeechResultState.SUCCESS
    assert "door" in (result.text or "").lower()
    assert await _stt_requests(entry) == before + 1  # that transcript was the answer


async def test_speech_after_the_pause_drops_the_early_transcript(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    engine = stt.async_get_speech_to_text_engine(hass, STT_ENTITY)
    assert engine is not None
    audio = _pcm("command-05.wav") + SILENCE + _pcm("command-00.wav")
    result = await engine.async_process_audio_stream(voice_metadata("en-US"), _chunks(audio))
    text = (result.text or "").lower()
    assert "door" in text and "kitchen" in text


async def test_home_assistants_stt_http_api_reaches_the_server(
    hass: HomeAssistant, entry: MockConfigEntry, hass_client: ClientSessionGenerator
) -> None:
    client = await hass_client()
    response = await client.post(
        f"/api/stt/{STT_ENTITY}",
        headers={
            "X-Speech-Content": "format=wav; codec=pcm; sample_rate=16000; bit_rate=16; "
            "channel=1; language=en"
        },
        data=(SPEECH / "command-01.wav").read_bytes(),  # a whole WAV file, header and all
    )
    assert response.status == HTTPStatus.OK
    body = await response.json()
    assert body["result"] == "success"
    expected = set(COMMANDS["command-01.wav"].split())
    heard = set(body["text"].lower().replace(".", "").replace(",", "").split())
    assert len(expected & heard) >= len(expected) - 1


async def test_ai_task_generates_text(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    result = await ai_task.async_generate_data(
        hass,
        task_name="greeting",
        entity_id=AI_TASK_ENTITY,
        instructions="Write one short sentence welcoming guests to a house party.",
    )
    assert isinstance(result.data, str) and len(result.data.split()) >= 3


async def test_ai_task_honours_the_structure(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    structure = vol.Schema(
        {
            vol.Required("item"): selector.TextSelector(),
            vol.Required("quantity"): selector.NumberSelector(
                selector.NumberSelectorConfig(min=0, max=100, step=1)
            ),
        }
    )
    result = await ai_task.async_generate_data(
        hass,
        task_name="shopping",
        entity_id=AI_TASK_ENTITY,
        instructions="We need six eggs from the shop. Give the item and the quantity.",
        structure=structure,
    )
    assert set(result.data) == {"item", "quantity"}
    assert isinstance(result.data["item"], str) and isinstance(result.data["quantity"], int | float)


def test_lanes_follow_who_is_waiting() -> None:
    spoken = conversation.ConversationInput(
        text="lights on", context=Context(), conversation_id=None, device_id="satellite-1",
        satellite_id="assist_satellite.kitchen", language="en", agent_id="x",
    )
    typed = conversation.ConversationInput(
        text="lights on", context=Context(user_id="u1"), conversation_id=None, device_id=None,
        satellite_id=None, language="en", agent_id="x",
    )
    assert turn_class(spoken, CLASS_AUTO) == "voice"
    assert turn_class(typed, CLASS_AUTO) == "chat"
    assert turn_class(spoken, "background") == "background"

    assert task_class(CLASS_AUTO) == "chat"
    token = script_stack_cv.set(["automation.morning_brief"])  # as HA runs an automation
    try:
        assert task_class(CLASS_AUTO) == "background"
        assert task_class("chat") == "chat"
    finally:
        script_stack_cv.reset(token)


async def _media(hass: HomeAssistant, folder: Path, files: dict[str, bytes]) -> None:
    """Files in a local media folder, as a user's attachments come (media source)."""
    for name, data in files.items():
        (folder / name).write_bytes(data)
    hass.config.media_dirs["local"] = str(folder)  # in place: media_source holds this dict
    assert await async_setup_component(hass, "media_source", {})


async def test_ai_task_reads_a_pdf_attachment_on_the_server(
    hass: HomeAssistant, entry: MockConfigEntry, tmp_path: Path
) -> None:
    """The server extracts the PDF's text (as it does for documents): no base64 in the prompt."""
    await _media(hass, tmp_path, {"warranty.pdf": pdf_bytes(
        "The dishwasher warranty ends on 14 March 2029.")})
    sent: list[dict[str, Any]] = []
    client = entry.runtime_data.client
    plain = client.chat_stream

    async def recorded(body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        sent.append(body)
        async for chunk in plain(body):
            yield chunk

    client.chat_stream = recorded  # type: ignore[method-assign]
    result = await ai_task.async_generate_data(
        hass,
        task_name="warranty",
        entity_id=AI_TASK_ENTITY,
        instructions="When does the dishwasher warranty end? Answer with the date only.",
        attachments=[{"media_content_id": "media-source://media_source/local/warranty.pdf",
                      "media_content_type": "application/pdf"}],
    )
    assert "2029" in str(result.data)
    user = [m for m in sent[0]["messages"] if m["role"] == "user"][-1]
    assert [part["type"] for part in user["content"]] == ["text", "file"]
    assert user["content"][1]["file"]["filename"] == "warranty.pdf"


async def test_ai_task_refuses_an_image_attachment_by_name(
    hass: HomeAssistant, entry: MockConfigEntry, tmp_path: Path
) -> None:
    await _media(hass, tmp_path, {"porch.jpg": b"\xff\xd8\xff\xe0 a photo"})
    with pytest.raises(HomeAssistantError, match=r"porch\.jpg .* reads text only"):
        await ai_task.async_generate_data(
            hass,
            task_name="porch",
            entity_id=AI_TASK_ENTITY,
            instructions="Is there a parcel on the porch?",
            attachments=[{"media_content_id": "media-source://media_source/local/porch.jpg",
                          "media_content_type": "image/jpeg"}],
        )
