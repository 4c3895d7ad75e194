"""The conversation agent against the real server and its default model."""

from __future__ import annotations

import time
from typing import Any

from homeassistant.components import conversation
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import chat_session, intent
from homeassistant.helpers import entity_registry as er
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry

AGENT = "conversation.fairlane"


async def test_a_turn_streams_a_real_reply(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    deltas: list[tuple[float, dict[str, Any]]] = []

    def listener(_log: conversation.ChatLog, delta: dict[str, Any]) -> None:
        deltas.append((time.monotonic(), delta))

    # The voice pipeline listens to the chat log this way, to start speaking early.
    with (
        chat_session.async_get_chat_session(hass) as session,
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
    # A real light entity: a template light over an input_boolean.
    assert await async_setup_component(
        hass, "input_boolean", {"input_boolean": {"kitchen_power": {"name": "Kitchen power"}}}
    )
    assert await async_setup_component(
        hass,
        "light",
        {
            "light": {
                "platform": "template",
                "lights": {
                    "kitchen_light": {
                        "unique_id": "kitchen-light",
                        "friendly_name": "Kitchen light",
                        "value_template": "{{ is_state('input_boolean.kitchen_power', 'on') }}",
                        "turn_on": {"action": "input_boolean.turn_on",
                                    "target": {"entity_id": "input_boolean.kitchen_power"}},
                        "turn_off": {"action": "input_boolean.turn_off",
                                     "target": {"entity_id": "input_boolean.kitchen_power"}},
                    }
                },
            }
        },
    )
    await hass.async_block_till_done()
    assert hass.states.get("light.kitchen_light").state == "off"
    kitchen = ar.async_get(hass).async_create("Kitchen")
    er.async_get(hass).async_update_entity("light.kitchen_light", area_id=kitchen.id)
    async_expose_entity(hass, conversation.DOMAIN, "light.kitchen_light", True)

    result = await conversation.async_converse(
        hass, "Turn on the kitchen light", None, Context(), agent_id=AGENT
    )
    assert result.response.response_type is intent.IntentResponseType.ACTION_DONE
    assert hass.states.get("light.kitchen_light").state == "on"



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
