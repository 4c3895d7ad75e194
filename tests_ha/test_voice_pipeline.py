"""A spoken command through Home Assistant's own voice pipeline: Fairlane's speech-to-text, then
Fairlane's agent with Assist's tools; the light really turns on, and both ran as `voice`."""

from __future__ import annotations

import asyncio
from typing import Any

from homeassistant.components import assist_pipeline
from homeassistant.core import Context, HomeAssistant
from homeassistant.util import dt as dt_util
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.fairlane.stt import Pause, micro_vad
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


async def test_a_turn_begun_on_the_early_transcript_is_claimed_or_dropped(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    """Where the transcript at the speaker's pause is ready while the audio still streams, the
    agent's turn is begun on the server then, and the agent's request claims it; if the
    speaker goes on, the begun turn is dropped at once.

    On these cores Whisper is slower than the pipeline's wait for the end of speech, so the
    stream is held open until the guess has reached the server (a GPU's Whisper gives that
    lead by itself)."""
    await add_kitchen_light(hass, "Kitchen lights")
    pipeline_id = await voice_pipeline(hass)
    client = entry.runtime_data.client
    assert "speculative_turns" in entry.runtime_data.info.features

    async def turn(stream: Any) -> list[Any]:
        events: list[Any] = []
        await assist_pipeline.async_pipeline_from_audio_stream(
            hass, context=Context(), event_callback=events.append,
            stt_metadata=voice_metadata(), stt_stream=stream, pipeline_id=pipeline_id,
            device_id="kitchen-satellite", end_stage=assist_pipeline.PipelineStage.INTENT,
        )
        assert assist_pipeline.PipelineEventType.ERROR not in [e.type for e in events], events
        return events

    # The first turn shows that this speech-to-text feeds this agent (and its prompt's shape).
    await turn(spoken("command-00.wav"))
    while dt_util.now().second >= 50:  # the guess and the turn in the same minute
        await asyncio.sleep(0.5)
    before = (await client.stats())["speculation"]

    async def paused_then_held() -> Any:
        # The recording, then silence, up to the chunk where the speaker's pause is heard (the
        # integration's detector, fed the same chunks); then nothing until the guess is in.
        pause = Pause(rate=16000, vad=micro_vad())
        silence = [bytes(1024)] * 30
        async for chunk in _then(spoken("command-00.wav"), silence):
            yield chunk
            if pause.feed(chunk):
                break
        async with asyncio.timeout(600):  # the early transcript, then the guess, on the server
            while (await client.stats())["speculation"]["started"] == before["started"]:
                await asyncio.sleep(0.05)

    events = await turn(paused_then_held())
    intent_end = next(e for e in events if e.type is assist_pipeline.PipelineEventType.INTENT_END)
    assert intent_end.data["intent_output"]["response"]["response_type"] != "error"
    after = (await client.stats())["speculation"]
    assert after["claimed"] == before["claimed"] + 1  # the agent's request was the guessed turn
    assert after["discarded"] == before["discarded"] and after["held"] == 0
    assert hass.states.get("light.kitchen_lights").state == "on"

    # They go on talking after the guess is in: the integration drops it there and then (the
    # server frees it before the real turn comes), and the real turn runs afresh.
    before = after

    async def paused_then_resumed() -> Any:
        pause = Pause(rate=16000, vad=micro_vad())
        async for chunk in _then(spoken("command-00.wav"), [bytes(1024)] * 30):
            yield chunk
            if pause.feed(chunk):
                break
        async with asyncio.timeout(600):
            while (await client.stats())["speculation"]["started"] == before["started"]:
                await asyncio.sleep(0.05)
        async for chunk in spoken("command-00.wav"):
            yield chunk
        async with asyncio.timeout(120):  # dropped by the speech-to-text, not by the turn
            while (await client.stats())["speculation"]["discarded"] == before["discarded"]:
                await asyncio.sleep(0.05)

    await turn(paused_then_resumed())
    after = (await client.stats())["speculation"]
    assert after["claimed"] == before["claimed"] and after["held"] == 0
    assert after["discarded"] == before["discarded"] + 1


async def _then(first: Any, rest: list[bytes]) -> Any:
    async for chunk in first:
        yield chunk
    for chunk in rest:
        yield chunk
