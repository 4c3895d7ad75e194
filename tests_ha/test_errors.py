"""What users see when something goes wrong: clear errors, never a hang or a traceback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
import voluptuous as vol
from homeassistant import config_entries
from homeassistant.components import ai_task, conversation, stt
from homeassistant.const import CONF_HOST, CONF_PORT, CONF_TOKEN
from homeassistant.core import Context, HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.exceptions import HomeAssistantError, ServiceValidationError
from homeassistant.helpers import intent, selector
from pytest_homeassistant_custom_component.common import MockConfigEntry, async_capture_events

from custom_components.fairlane import services
from custom_components.fairlane.client import (
    FairlaneClient,
    FairlaneConnectionError,
    FairlaneRequestError,
)
from custom_components.fairlane.const import DOMAIN, EVENT_SUMMARY_DONE
from custom_components.fairlane.entity import (
    IntentSlots,
    _describes_a_tool,
    _tool_input,
    _trim_history,
)
from tests_ha.conftest import RunningServer, fairlane_entry, voice_metadata

AGENT = "conversation.fairlane"


async def test_a_prompt_too_long_for_the_context_is_a_clear_error(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    # The real server refuses it (400); the agent says why instead of failing silently.
    result = await conversation.async_converse(
        hass, "word " * 9000, None, Context(), agent_id=AGENT
    )
    assert result.response.response_type is intent.IntentResponseType.ERROR
    speech = result.response.speech["plain"]["speech"]
    assert "refused the request" in speech and "may hold" in speech


async def test_an_unreachable_server_mid_turn_is_a_clear_error(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    async def down(self: FairlaneClient, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        raise FairlaneConnectionError("connection refused")
        yield {}

    with patch.object(FairlaneClient, "chat_stream", down):
        result = await conversation.async_converse(
            hass, "Hello", None, Context(), agent_id=AGENT
        )
    assert result.response.response_type is intent.IntentResponseType.ERROR
    assert "Could not reach the Fairlane server" in result.response.speech["plain"]["speech"]


async def test_an_ai_task_answer_that_is_not_the_json_asked_for(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    async def prose(self: FairlaneClient, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        assert body["response_format"]["type"] == "json_schema"
        yield {"choices": [{"index": 0, "delta": {"content": "Six eggs."}}]}

    with (
        patch.object(FairlaneClient, "chat_stream", prose),
        pytest.raises(HomeAssistantError, match="not the JSON"),
    ):
        await ai_task.async_generate_data(
            hass,
            task_name="shopping",
            entity_id="ai_task.fairlane_ai_task",
            instructions="Six eggs",
            structure=vol.Schema({vol.Required("item"): selector.TextSelector()}),
        )


async def test_stt_reports_an_error_for_audio_the_server_refuses(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    async def nothing() -> AsyncIterator[bytes]:
        yield b""

    engine = stt.async_get_speech_to_text_engine(hass, "stt.fairlane_speech_to_text")
    assert engine is not None
    metadata = voice_metadata()
    result = await engine.async_process_audio_stream(metadata, nothing())
    assert result.result is stt.SpeechResultState.ERROR


async def test_an_unexpected_error_in_the_flow_is_unknown(
    hass: HomeAssistant, fairlane_server: RunningServer
) -> None:
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    with patch.object(FairlaneClient, "health", side_effect=ValueError("surprise")):
        result = await hass.config_entries.flow.async_configure(
            result["flow_id"],
            {CONF_HOST: fairlane_server.host, CONF_PORT: fairlane_server.port, CONF_TOKEN: "t"},
        )
    assert result["type"] is FlowResultType.FORM and result["errors"] == {"base": "unknown"}


async def test_actions_need_exactly_one_server(
    hass: HomeAssistant, entry: MockConfigEntry, entry_data: dict[str, object]
) -> None:
    # Two entries of one server (the flows refuse that, so this one is made by hand).
    second = fairlane_entry(entry_data, unique_id=entry.unique_id, title="Same server, again")
    second.add_to_hass(hass)
    assert await hass.config_entries.async_setup(second.entry_id)
    with pytest.raises(ServiceValidationError, match="More than one"):
        await hass.services.async_call(
            DOMAIN, "search_documents", {"query": "boiler"}, blocking=True, return_response=True
        )
    found = await hass.services.async_call(
        DOMAIN, "search_documents", {"query": "boiler", "config_entry_id": second.entry_id},
        blocking=True, return_response=True,
    )
    assert found is not None and "results" in found

    for loaded in (entry, second):
        assert await hass.config_entries.async_unload(loaded.entry_id)
    with pytest.raises(ServiceValidationError, match="No Fairlane server"):
        await hass.services.async_call(
            DOMAIN, "search_documents", {"query": "boiler"}, blocking=True, return_response=True
        )


async def test_actions_map_server_errors(
    hass: HomeAssistant, entry: MockConfigEntry, tmp_path: Path
) -> None:
    with (
        patch.object(FairlaneClient, "search", side_effect=FairlaneConnectionError("down")),
        pytest.raises(HomeAssistantError, match="Could not reach"),
    ):
        await hass.services.async_call(
            DOMAIN, "search_documents", {"query": "boiler"}, blocking=True, return_response=True
        )
    note = tmp_path / "note.txt"
    note.write_text("The spare key is with the neighbours.")
    hass.config.allowlist_external_dirs = {str(tmp_path)}
    with (
        patch.object(FairlaneClient, "add_document", side_effect=FairlaneConnectionError("down")),
        pytest.raises(HomeAssistantError, match="Could not reach"),
    ):
        await hass.services.async_call(
            DOMAIN, "index_documents", {"path": str(note)}, blocking=True, return_response=True
        )


async def test_a_summary_that_disappears_fires_no_event(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    events = async_capture_events(hass, EVENT_SUMMARY_DONE)
    client = entry.runtime_data.client
    replies = [FairlaneConnectionError("restarting"), FairlaneRequestError(404, "no summary")]
    with (
        patch.object(services, "SUMMARY_POLL_S", 0),
        patch.object(FairlaneClient, "summary", side_effect=replies),
    ):
        await services._announce_summary(hass, client, "gone")
    assert events == []


def test_history_keeps_the_system_prompt_and_the_last_turns() -> None:
    messages = [{"role": "system", "content": "be brief"}]
    for turn in range(5):
        messages += [{"role": "user", "content": f"q{turn}"},
                     {"role": "assistant", "content": f"a{turn}"}]
    kept = _trim_history(messages, 2)
    assert [m["content"] for m in kept] == ["be brief", "q3", "a3", "q4", "a4"]
    assert _trim_history(messages, 0) == messages


async def test_tool_arguments_that_are_not_json_become_empty(hass: HomeAssistant) -> None:
    call = _tool_input(hass, {"id": "", "name": "HassTurnOn", "args": "{name: kitchen"},
                       IntentSlots(frozenset({"name", "area"})))
    assert call.tool_name == "HassTurnOn" and call.tool_args == {} and call.id


async def test_only_intent_tools_get_their_targets_repaired(hass: HomeAssistant) -> None:
    """A shopping list item called "None", a script's field: passed on as written."""
    item = {"item": "None", "name": "Shopping list", "area": "Garage"}
    args = '{"item": "None", "name": "Shopping list", "area": "Garage"}'
    intent_call = _tool_input(hass, {"id": "1", "name": "HassShoppingListAddItem",
                                     "args": args}, IntentSlots(frozenset({"item", "name"})))
    assert intent_call.tool_args == {"item": "None", "name": "Shopping list"}  # no Garage here
    script_call = _tool_input(hass, {"id": "2", "name": "script_notify", "args": args}, None)
    assert script_call.tool_args == item



async def test_a_reply_that_describes_a_tool_is_told_apart_from_an_answer(
    hass: HomeAssistant,
) -> None:
    """"To add history homework to your tasks, you can use the `HassListAddItem` function…":
    the next round must call a tool."""
    chat_log = conversation.ChatLog(hass, "test")
    tools = {"HassListAddItem": None, "intent__HassTurnOn": None}
    for text, describes in [
        ("You can use the `HassListAddItem` function to add it.", True),
        ("Call HassTurnOn with the name of the light.", True),
        ("Paris is the capital of France.", False),
    ]:
        chat_log.content.append(conversation.AssistantContent(agent_id="a", content=text))
        assert _describes_a_tool(chat_log, tools) is describes
