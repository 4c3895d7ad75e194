"""The conversation agent against the real server and its default model."""

from __future__ import annotations

import time
from typing import Any

from homeassistant.components import conversation
from homeassistant.const import EVENT_CALL_SERVICE
from homeassistant.core import Context, Event, HomeAssistant, callback
from homeassistant.helpers import intent
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.fairlane.const import CONF_TEMPERATURE, MAX_TOOL_ITERATIONS
from tests_ha.conftest import add_kitchen_light, chat_session_of, set_agent

AGENT = "conversation.fairlane"


async def test_a_turn_streams_a_real_reply(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    deltas: list[tuple[float, dict[str, Any]]] = []

    def listener(_log: conversation.ChatLog, delta: dict[str, Any]) -> None:
        deltas.append((time.monotonic(), delta))

    # The voice pipeline listens to the chat log this way, to start speaking early.
    with (
        chat_session_of(hass) as session,
        conversation.async_get_chat_log(
            hass, session, None, chat_log_delta_listener=listener
        ),
    ):
        result = await conversation.async_converse(
            hass,
            "What is the capital of France? Answer in one sentence.",
            session.conversation_id,
            Context(),
            agent_id=AGENT,
        )
    done = time.monotonic()
    assert result.response.response_type is intent.IntentResponseType.ACTION_DONE
    speech = result.response.speech["plain"]["speech"]
    assert "Paris" in speech
    pieces = [d["content"] for _, d in deltas if d.get("content")]
    assert len(pieces) > 3 and "".join(pieces).strip() == speech.strip()
    assert deltas[0][0] < done  # streamed: the first words came before the turn ended


async def test_turn_on_the_kitchen_light_through_assist_tools(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    assert await add_kitchen_light(hass) == "light.kitchen_light"
    assert hass.states.get("light.kitchen_light").state == "off"

    result = await conversation.async_converse(
        hass, "Turn on the kitchen light", None, Context(), agent_id=AGENT
    )
    assert result.response.response_type is intent.IntentResponseType.ACTION_DONE
    assert hass.states.get("light.kitchen_light").state == "on"



async def test_a_tool_call_repeated_in_one_turn_is_not_run_again(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    """At temperature 0 the default model, given HassTurnOn's result, asks for the same call
    again: it ran four times in one turn and the last round, without tools, spoke the call as
    JSON. A call the turn has already made is not run again, and the next round may not call
    a tool (tool_choice none). (What the model then says is its own: this one echoes the
    tool's result.)"""
    await add_kitchen_light(hass, "Kitchen lights")
    await set_agent(hass, entry, **{CONF_TEMPERATURE: 0.0})
    runs: list[Event] = []

    @callback
    def ran(event: Event) -> None:
        if event.data["domain"] == "input_boolean":
            runs.append(event)

    hass.bus.async_listen(EVENT_CALL_SERVICE, ran)

    async def model_calls() -> int:
        classes = (await entry.runtime_data.client.stats())["classes"]
        return sum(int(figures["requests"]) for figures in classes.values())

    before = await model_calls()
    result = await conversation.async_converse(
        hass, "Turn on the kitchen lights", None, Context(), agent_id=AGENT
    )
    await hass.async_block_till_done()
    assert hass.states.get("light.kitchen_lights").state == "on"
    assert result.response.speech["plain"]["speech"].strip()
    assert 1 <= len(runs) <= 2
    assert await model_calls() - before < MAX_TOOL_ITERATIONS


async def test_a_spoken_turn_goes_in_the_voice_lane(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    client = entry.runtime_data.client

    async def requests() -> tuple[int, int]:
        classes = (await client.stats())["classes"]
        return int(classes["voice"]["requests"]), int(classes["chat"]["requests"])

    voice, chat = await requests()
    # A satellite's turn (the voice pipeline passes its device): someone is standing there.
    result = await conversation.async_converse(
        hass, "Say hi.", None, Context(), agent_id=AGENT, device_id="kitchen-satellite"
    )
    assert result.response.response_type is intent.IntentResponseType.ACTION_DONE
    # Every model call of the turn (a tool round is one more) ran as voice, none as chat.
    voice_after, chat_after = await requests()
    assert voice_after > voice and chat_after == chat
