"""A spoken command through Home Assistant's own voice pipeline: Fairlane's speech-to-text, then
Fairlane's agent with Assist's tools; the light really turns on, and both ran as `voice`."""

from __future__ import annotations

import wave
from collections.abc import AsyncIterator
from typing import Any

from homeassistant.components import assist_pipeline, conversation
from homeassistant.components.assist_pipeline.const import DOMAIN as PIPELINE
from homeassistant.components.assist_pipeline.pipeline import KEY_ASSIST_PIPELINE
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import entity_registry as er
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry

from tests_ha.conftest import SPEECH, voice_metadata


async def _kitchen_lights(hass: HomeAssistant) -> None:
    assert await async_setup_component(
        hass, "input_boolean", {"input_boolean": {"kitchen_power": {"name": "Kitchen power"}}}
    )
    target = {"target": {"entity_id": "input_boolean.kitchen_power"}}
    assert await async_setup_component(hass, "light", {"light": {
        "platform": "template",
        "lights": {"kitchen_lights": {
            "unique_id": "kitchen-lights",
            "friendly_name": "Kitchen lights",
            "value_template": "{{ is_state('input_boolean.kitchen_power', 'on') }}",
            "turn_on": {"action": "input_boolean.turn_on", **target},
            "turn_off": {"action": "input_boolean.turn_off", **target},
        }},
    }})
    await hass.async_block_till_done()
    kitchen = ar.async_get(hass).async_create("Kitchen")
    er.async_get(hass).async_update_entity("light.kitchen_lights", area_id=kitchen.id)
    async_expose_entity(hass, conversation.DOMAIN, "light.kitchen_lights", True)


async def _spoken(name: str) -> AsyncIterator[bytes]:
    with wave.open(str(SPEECH / name)) as wav:
        audio = wav.readframes(wav.getnframes())
    for offset in range(0, len(audio), 1024):  # 32 ms frames, as a satellite streams them
        yield audio[offset : offset + 1024]


async def test_a_spoken_command_turns_on_the_light(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    await _kitchen_lights(hass)
    assert await async_setup_component(hass, PIPELINE, {})
    store = hass.data[KEY_ASSIST_PIPELINE].pipeline_store
    pipeline = await store.async_create_item({
        "name": "Fairlane", "language": "en", "conversation_engine": "conversation.fairlane",
        "conversation_language": "en", "stt_engine": "stt.fairlane_speech_to_text",
        "stt_language": "en", "tts_engine": None, "tts_language": None, "tts_voice": None,
        "wake_word_entity": None, "wake_word_id": None, "prefer_local_intents": False,
    })
    assert hass.states.get("light.kitchen_lights").state == "off"
    client = entry.runtime_data.client
    before = (await client.stats())["classes"]["voice"]

    events: list[Any] = []
    await assist_pipeline.async_pipeline_from_audio_stream(
        hass,
        context=Context(),
        event_callback=events.append,
        stt_metadata=voice_metadata(),
        stt_stream=_spoken("command-00.wav"),  # "turn on the kitchen lights"
        pipeline_id=pipeline.id,
        device_id="kitchen-satellite",
        end_stage=assist_pipeline.PipelineStage.INTENT,
    )
    kinds = [e.type for e in events]
    assert assist_pipeline.PipelineEventType.ERROR not in kinds, events
    stt_end = next(e for e in events if e.type is assist_pipeline.PipelineEventType.STT_END)
    assert "kitchen" in stt_end.data["stt_output"]["text"].lower()
    assert hass.states.get("light.kitchen_lights").state == "on"

    after = (await client.stats())["classes"]["voice"]
    assert after["stt"]["requests"] > before["stt"]["requests"]  # the transcription: voice
    assert after["requests"] > before["requests"]  # the agent's model calls: voice
