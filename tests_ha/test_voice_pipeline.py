"""A spoken command through Home Assistant's own voice pipeline: Fairlane's speech-to-text, then
Fairlane's agent with Assist's tools; the light really turns on, and both ran as `voice`."""

from __future__ import annotations

from typing import Any

from homeassistant.components import assist_pipeline
from homeassistant.core import Context, HomeAssistant
from pytest_homeassistant_custom_component.common import MockConfigEntry

from tests_ha.conftest import add_kitchen_light, spoken, voice_metadata, voice_pipeline


async def test_a_spoken_command_turns_on_the_light(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    assert await add_kitchen_light(hass, "Kitchen lights") == "light.kitchen_lights"
    pipeline_id = await voice_pipeline(hass)
    assert hass.states.get("light.kitchen_lights").state == "off"
    client = entry.runtime_data.client
    before = (await client.stats())["classes"]["voice"]

    events: list[Any] = []
    await assist_pipeline.async_pipeline_from_audio_stream(
        hass,
        context=Context(),
        event_callback=events.append,
        stt_metadata=voice_metadata(),
        stt_stream=spoken("command-00.wav"),  # "turn on the kitchen lights"
        pipeline_id=pipeline_id,
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
