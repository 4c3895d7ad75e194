"""The household documents as an agent tool, against the real server and its default model."""

from __future__ import annotations

import asyncio
from typing import Any

from homeassistant.components import conversation
from homeassistant.const import CONF_LLM_HASS_API
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import llm
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.fairlane.const import DOCUMENTS_API_ID, DOCUMENTS_API_NAME
from custom_components.fairlane.llm_api import SearchDocumentsTool
from tests_ha.conftest import chat_session_of, set_agent, tool_data

DOCUMENTS = {
    "Dishwasher warranty": "Warranty certificate for the Bosch dishwasher bought in March "
    "2024. The warranty ends on 14 March 2029 and covers parts and labour.",
    "Boiler service": "The boiler is serviced every October by Hughes Heating. The pressure "
    "gauge should read between 1 and 1.5 bar.",
    "School trip": "The class trip to the science museum is on Friday. Children need a packed "
    "lunch and a raincoat.",
}


async def _index(entry: MockConfigEntry) -> None:
    client = entry.runtime_data.client
    ids = []
    for title, text in DOCUMENTS.items():
        document = await client.add_document(
            f"# {title}\n{text}".encode(), f"{title}.md", "text/markdown"
        )
        ids.append(document["id"])
    # Searching waits for nothing: poll until the chunks are embedded.
    for _ in range(600):
        status = {d["id"]: d["status"] for d in await client.documents()}
        if all(status.get(i) == "indexed" for i in ids):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not indexed: {status}")


async def test_the_api_is_offered_next_to_assist(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    apis = {api.id: api.name for api in llm.async_get_apis(hass)}
    assert apis[DOCUMENTS_API_ID] == DOCUMENTS_API_NAME and llm.LLM_API_ASSIST in apis


async def test_the_agent_answers_from_the_household_documents(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    await _index(entry)
    await set_agent(hass, entry, **{CONF_LLM_HASS_API: [DOCUMENTS_API_ID]})
    calls: list[dict[str, Any]] = []
    searched: list[list[dict[str, Any]]] = []
    original = SearchDocumentsTool.async_call

    async def recorded(self: SearchDocumentsTool, hass: HomeAssistant, tool_input: llm.ToolInput,
                       llm_context: llm.LLMContext) -> Any:
        calls.append(tool_input.tool_args)
        result = await original(self, hass, tool_input, llm_context)
        searched.append(tool_data(result).get("results", []))
        return result

    SearchDocumentsTool.async_call = recorded  # type: ignore[method-assign]
    try:
        with chat_session_of(hass) as session:
            result = await conversation.async_converse(
                hass, "When does the dishwasher warranty end?", session.conversation_id,
                Context(), agent_id="conversation.fairlane",
            )
    finally:
        SearchDocumentsTool.async_call = original  # type: ignore[method-assign]
    speech = result.response.speech["plain"]["speech"]
    assert calls and "dishwasher" in calls[0]["query"].lower(), speech
    # The best passage comes first, with its document's title (the file's name, as sent).
    assert searched[0][0]["document"] == "Dishwasher warranty.md"
    assert "2029" in speech, speech


async def test_a_command_is_not_searched_for(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    """With Assist and the documents both selected, "turn on the light" is far from every
    passage: the agent does not search, and the tools are Assist's and the search."""
    await _index(entry)
    await set_agent(hass, entry, **{CONF_LLM_HASS_API: [llm.LLM_API_ASSIST, DOCUMENTS_API_ID]})
    with (
        chat_session_of(hass) as session,
        conversation.async_get_chat_log(hass, session) as chat_log,
    ):
        await conversation.async_converse(
            hass, "Turn on the kitchen light.", session.conversation_id, Context(),
            agent_id="conversation.fairlane",
        )
        assert chat_log.llm_api is not None
        names = {tool.name for tool in chat_log.llm_api.tools}
        calls = [call.tool_name for content in chat_log.content
                 if isinstance(content, conversation.AssistantContent)
                 for call in content.tool_calls or ()]
    assert any(name.endswith("search_household_documents") for name in names)
    assert not any(name.endswith("search_household_documents") for name in calls), calls
