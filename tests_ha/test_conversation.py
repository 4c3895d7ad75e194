"""The conversation agent against the real server and its default model."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from homeassistant.components import conversation
from homeassistant.core import Context, HomeAssistant
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



def _record_requests(entry: MockConfigEntry, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The body of each model call the agent makes, as sent."""
    client = entry.runtime_data.client
    plain = client.chat_stream
    sent: list[dict[str, Any]] = []

    def chat_stream(body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        sent.append(body)
        return plain(body)

    monkeypatch.setattr(client, "chat_stream", chat_stream)
    return sent


# A language Home Assistant has no responses in: the model confirms a done action itself.
NO_RESPONSES = "xx"


async def test_a_done_action_is_answered_in_home_assistant_s_own_words(
    hass: HomeAssistant, entry: MockConfigEntry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked to confirm a done action, the default model wrote "Mark the kitchen light as
    off.", listed commands, or answered in Chinese. Home Assistant's own response for the
    intent, in the conversation's language, is the answer: one model call, not two."""
    await add_kitchen_light(hass, "Kitchen lights")
    await set_agent(hass, entry, **{CONF_TEMPERATURE: 0.0})
    sent = _record_requests(entry, monkeypatch)
    result = await conversation.async_converse(
        hass, "Turn on the kitchen lights", None, Context(), agent_id=AGENT, language="en"
    )
    await hass.async_block_till_done()
    assert hass.states.get("light.kitchen_lights").state == "on"
    assert len(sent) == 1
    assert result.response.speech["plain"]["speech"] == "Turned on the light"


async def test_a_done_action_is_confirmed_in_the_next_round(
    hass: HomeAssistant, entry: MockConfigEntry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where Home Assistant has no response in the conversation's language, the model confirms
    the action. At temperature 0 the default model, given HassTurnOn's `action_done`, asks for
    the same call again when it may: a whole round spent on nothing. When Home Assistant
    reports every action of a round done, the next round may not call a tool: two model calls,
    not three."""
    await add_kitchen_light(hass, "Kitchen lights")
    await set_agent(hass, entry, **{CONF_TEMPERATURE: 0.0})
    sent = _record_requests(entry, monkeypatch)
    result = await conversation.async_converse(
        hass, "Turn on the kitchen lights", None, Context(), agent_id=AGENT,
        language=NO_RESPONSES,
    )
    await hass.async_block_till_done()
    assert hass.states.get("light.kitchen_lights").state == "on"
    assert result.response.speech["plain"]["speech"].strip()
    assert len(sent) == 2
    assert "tool_choice" not in sent[0]
    assert sent[1]["tool_choice"] == "none" and sent[1]["tools"] == sent[0]["tools"]
    result_message = sent[1]["messages"][-1]
    assert result_message["role"] == "tool" and "action_done" in result_message["content"]
    # Said in words: free, the default model read the result back as JSON.
    speech = result.response.speech["plain"]["speech"]
    assert sent[1]["fairlane_words"] is True and not set("{}[]`") & set(speech), speech


async def test_a_call_goes_back_as_the_model_wrote_it(
    hass: HomeAssistant, entry: MockConfigEntry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Home Assistant runs a repaired call (the default model guesses a floor and a device
    class for a named light); the next round sends the call back with the arguments the model
    wrote, so the server's prefix cache holds the first round's prompt and every token of the
    call it fed: the round after the call prefills only the result."""
    await add_kitchen_light(hass, "Kitchen lights")
    await set_agent(hass, entry, **{CONF_TEMPERATURE: 0.0})
    client = entry.runtime_data.client
    plain = client.chat_stream
    sent: list[dict[str, Any]] = []
    usage: list[dict[str, Any]] = []
    written: list[str] = []

    async def chat_stream(body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        sent.append(body)
        async for chunk in plain({**body, "stream_options": {"include_usage": True}}):
            if chunk.get("usage"):
                usage.append(chunk["usage"])
            for choice in chunk.get("choices") or ():
                for call in (choice.get("delta") or {}).get("tool_calls") or ():
                    written.append((call.get("function") or {}).get("arguments") or "")
            yield chunk

    monkeypatch.setattr(client, "chat_stream", chat_stream)
    await conversation.async_converse(  # a second round: the model confirms (see above)
        hass, "Turn on the kitchen lights", None, Context(), agent_id=AGENT,
        language=NO_RESPONSES,
    )
    await hass.async_block_till_done()
    assert hass.states.get("light.kitchen_lights").state == "on"
    assert len(sent) == 2 and len(usage) == 2
    call = sent[1]["messages"][-2]["tool_calls"][0]
    assert call["function"]["name"].endswith("HassTurnOn")  # intent__HassTurnOn since 2026.11
    assert call["function"]["arguments"] == "".join(written)
    first = usage[0]["prompt_tokens"] + usage[0]["completion_tokens"] - 1
    assert usage[1]["prompt_tokens_details"]["cached_tokens"] == first


async def test_a_tool_call_repeated_in_one_turn_is_not_run_again(
    hass: HomeAssistant, entry: MockConfigEntry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At temperature 0 the default model, given GetDateTime's answer (a query, so it may call
    again), asks for the same call again: unguarded, a call ran four times in one turn and the
    last round, without tools, spoke the call as JSON. A call the turn has already made is not
    run again, and the next round may not call a tool (tool_choice none). (What the model then
    says is its own: this one echoes the tool's result.)"""
    await set_agent(hass, entry, **{CONF_TEMPERATURE: 0.0})
    sent = _record_requests(entry, monkeypatch)
    result = await conversation.async_converse(
        hass, "What is the date today?", None, Context(), agent_id=AGENT
    )
    assert result.response.speech["plain"]["speech"].strip()
    assert 2 <= len(sent) < MAX_TOOL_ITERATIONS
    # Each round after the first was sent with the results so far: one result per call run.
    results = [m for m in sent[-1]["messages"] if m["role"] == "tool"]
    calls = [
        call["function"]["name"]
        for m in sent[-1]["messages"]
        if m["role"] == "assistant"
        for call in m.get("tool_calls") or ()
    ]
    assert calls and len(results) == len(calls) == len(set(calls))
    assert sent[-1]["tool_choice"] == "none"


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
