"""The household documents as an LLM API: a tool the agent calls to search the server's index.

Selectable in any conversation agent's settings next to Assist. The model gets one tool,
`search_household_documents(query)`, which returns the best passages with the titles of the
documents they come from; the prompt tells it to answer from them and to say which document
it used. The search runs in the voice lane when the turn came from a voice device, else in
the chat lane: a person is waiting for it either way.

Small models call the tool for too few of the questions it answers (the default 0.5B model,
for none of 20 household questions with this prompt; a stricter one got 3 of 20 and then kept
searching instead of answering), and guess instead, often today's date for "when". So
Fairlane's own agent searches first (`entity.search_first`): when the question is close to a
passage, it makes the call itself, and the model answers with the passages in front of it.
Other agents that select this API get the tool alone.
"""

from __future__ import annotations

from typing import Any

from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import llm
from homeassistant.util.json import JsonObjectType

from .client import FairlaneClient, FairlaneError
from .const import DOCUMENTS_API_ID, DOCUMENTS_API_NAME, DOCUMENTS_TOP_K, DOMAIN
from .schema import vol

PROMPT = (
    "You know nothing about this household's things (appliances, warranties, manuals, "
    "contracts, school letters, appointments) except what its documents say. For any "
    "question about them, first call search_household_documents with a short query, then "
    "answer only from the passages it returns and name the document. If the passages do not "
    "answer the question, say that the documents do not say."
)

ANSWER_FROM_PASSAGES = (
    "Answer the user's question from these passages, in one sentence, naming the document."
)


class SearchDocumentsTool(llm.Tool):
    """Search the household documents indexed on the Fairlane server."""

    name = "search_household_documents"
    integration = DOMAIN  # 2026.11 asks each tool for the integration that provides it
    description = (
        "Search the household's documents (manuals, warranties, letters, notes) and return the "
        "passages that best answer the query, with the title of each document."
    )
    parameters = vol.Schema(
        {vol.Required("query", description="What to look for, in a few words"): str}
    )

    def __init__(self, clients: list[FairlaneClient]) -> None:
        self.clients = clients
        self._found: dict[str, list[dict[str, Any]]] = {}  # this turn's searches

    async def search(self, query: str, lane: str) -> list[dict[str, Any]]:
        """The best passages of every loaded server, best first, with their scores (cosine
        similarity). A query searched before in this turn is not searched again."""
        if query in self._found:
            return self._found[query]
        hits: list[dict[str, Any]] = []
        for client in self.clients:  # usually one server
            try:
                hits += await client.search(query, DOCUMENTS_TOP_K, lane)
            except FairlaneError as err:
                raise HomeAssistantError(f"The document search failed: {err}") from err
        hits.sort(key=lambda hit: -float(hit.get("score") or 0.0))
        self._found[query] = hits[:DOCUMENTS_TOP_K]
        return self._found[query]

    async def async_call(
        self, hass: HomeAssistant, tool_input: llm.ToolInput, llm_context: llm.LLMContext
    ) -> Any:
        query = str(tool_input.tool_args.get("query") or "").strip()
        if not query:
            return tool_answer({"error": "give a query: what to look for"}, error=True)
        hits = await self.search(query, lane_of(llm_context))
        results: list[Any] = [
            {"document": str(hit.get("title") or "untitled"), "passage": str(hit.get("text", ""))}
            for hit in hits
        ]
        if not results:
            nothing = "nothing in the household documents matches"
            return tool_answer({"results": [], "note": nothing})
        # Said with the passages, the model answers from them; without it, the default
        # 0.5B model searched again in 4 runs of 4 (docs/history/benchmarks.md).
        return tool_answer({"results": results, "instructions": ANSWER_FROM_PASSAGES})


# Home Assistant 2026.11 wraps a tool's answer in llm.ToolResult (plain JSON is deprecated,
# refused from 2027.11); releases before take the JSON itself.
_TOOL_RESULT: Any = getattr(llm, "ToolResult", None)


def tool_answer(data: JsonObjectType, error: bool = False) -> Any:
    """A tool's answer, as this release takes it."""
    return data if _TOOL_RESULT is None else _TOOL_RESULT(data=data, error=error)


def lane_of(llm_context: llm.LLMContext) -> str:
    return "voice" if llm_context.device_id else "chat"


def documents_tool(api: llm.APIInstance | None) -> tuple[str, SearchDocumentsTool] | None:
    """The document search among an API instance's tools (namespaced when APIs are merged):
    the name the model knows it by, and the tool."""
    for tool in api.tools if api else ():
        inner = tool
        while isinstance(inner, llm.NamespacedTool):
            inner = inner.tool
        if isinstance(inner, SearchDocumentsTool):
            return tool.name, inner
    return None


class DocumentsAPI(llm.API):
    """The LLM API that offers the document search of the loaded Fairlane servers. Registered
    once, so any conversation agent can select it, not only Fairlane's."""

    def __init__(self, hass: HomeAssistant) -> None:
        super().__init__(hass=hass, id=DOCUMENTS_API_ID, name=DOCUMENTS_API_NAME)

    async def async_get_api_instance(self, llm_context: llm.LLMContext) -> llm.APIInstance:
        entries = self.hass.config_entries.async_loaded_entries(DOMAIN)
        clients = [entry.runtime_data.client for entry in entries]
        return llm.APIInstance(
            api=self,
            api_prompt=PROMPT if clients else "The household documents cannot be searched now.",
            llm_context=llm_context,
            tools=[SearchDocumentsTool(clients)] if clients else [],
        )
