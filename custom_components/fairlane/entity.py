"""Entities of the Fairlane device, and the chat logic the conversation and AI task share."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import voluptuous as vol
from homeassistant.components import conversation
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import llm
from homeassistant.helpers.entity import Entity
from homeassistant.helpers.json import json_dumps
from homeassistant.helpers.update_coordinator import CoordinatorEntity
from voluptuous_openapi import convert

from . import FairlaneConfigEntry
from .client import FairlaneError, FairlaneRequestError
from .const import (
    CONF_MAX_HISTORY,
    CONF_MAX_TOKENS,
    CONF_TEMPERATURE,
    DEFAULT_MAX_HISTORY,
    DEFAULT_MAX_TOKENS,
    DEFAULT_NAME,
    DEFAULT_TEMPERATURE,
    DOMAIN,
    MAX_TOOL_ITERATIONS,
)
from .coordinator import FairlaneCoordinator
from .tool_args import repair_args

_LOGGER = logging.getLogger(__name__)


def device_info(entry: FairlaneConfigEntry) -> dr.DeviceInfo:
    """The one device every Fairlane entity belongs to: the server."""
    data = entry.runtime_data
    return dr.DeviceInfo(
        identifiers={(DOMAIN, entry.entry_id)},
        name=DEFAULT_NAME,
        manufacturer=DEFAULT_NAME,
        model=data.info.llm_model or None,
        sw_version=data.info.version,
        entry_type=dr.DeviceEntryType.SERVICE,
        configuration_url=str(data.client.base),
    )


class FairlaneEntity(CoordinatorEntity[FairlaneCoordinator]):
    """An entity that reads the server's stats."""

    _attr_has_entity_name = True

    def __init__(self, entry: FairlaneConfigEntry, key: str) -> None:
        super().__init__(entry.runtime_data.coordinator)
        self._attr_unique_id = f"{entry.entry_id}_{key}"
        self._attr_device_info = device_info(entry)


class FairlaneLLMEntity(Entity):
    """An entity that talks to the server's LLM: the conversation agent and the AI task."""

    _attr_has_entity_name = True

    def __init__(self, entry: FairlaneConfigEntry, key: str) -> None:
        self.entry = entry
        self._attr_unique_id = f"{entry.entry_id}_{key}"
        self._attr_device_info = device_info(entry)

    async def _async_handle_chat_log(
        self,
        chat_log: conversation.ChatLog,
        *,
        fairlane_class: str,
        user: str | None,
        structure: vol.Schema | None = None,
    ) -> None:
        """Run the model over the chat log, calling Assist tools until it answers (bounded)."""
        options = self.entry.options
        tools: list[dict[str, Any]] | None = None
        if chat_log.llm_api:
            tools = [
                _format_tool(tool, chat_log.llm_api.custom_serializer)
                for tool in chat_log.llm_api.tools
            ]
        body: dict[str, Any] = {
            "model": self.entry.runtime_data.info.llm_model,
            "max_tokens": int(options.get(CONF_MAX_TOKENS, DEFAULT_MAX_TOKENS)),
            "temperature": float(options.get(CONF_TEMPERATURE, DEFAULT_TEMPERATURE)),
            "fairlane_class": fairlane_class,
            "user": user or "home-assistant",
        }
        if structure is not None:
            serializer = chat_log.llm_api.custom_serializer if chat_log.llm_api else None
            schema = convert(structure, custom_serializer=serializer or llm.selector_serializer)
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "result", "schema": schema},
            }
        max_history = int(options.get(CONF_MAX_HISTORY, DEFAULT_MAX_HISTORY))

        for round_ in range(MAX_TOOL_ITERATIONS):
            messages = stable_first(
                _trim_history([_message(content) for content in chat_log.content], max_history)
            )
            request = {**body, "messages": messages}
            # The last round offers no tools, so the turn ends in words, not a tool result.
            if tools and round_ < MAX_TOOL_ITERATIONS - 1:
                request["tools"] = tools
            stream = self.entry.runtime_data.client.chat_stream(request)
            try:
                async for _content in chat_log.async_add_delta_content_stream(
                    self.entity_id, _deltas(self.hass, stream)
                ):
                    pass
            except FairlaneRequestError as err:
                raise HomeAssistantError(
                    translation_domain=DOMAIN,
                    translation_key="request_refused",
                    translation_placeholders={"error": str(err)},
                ) from err
            except FairlaneError as err:
                raise HomeAssistantError(
                    translation_domain=DOMAIN,
                    translation_key="cannot_connect",
                    translation_placeholders={"error": str(err)},
                ) from err
            if not chat_log.unresponded_tool_results:
                return


def _format_tool(tool: llm.Tool, serializer: Callable[[Any], Any] | None) -> dict[str, Any]:
    """An Assist tool in OpenAI's `tools` shape."""
    function: dict[str, Any] = {
        "name": tool.name,
        "parameters": convert(tool.parameters, custom_serializer=serializer),
    }
    if tool.description:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _message(content: conversation.Content) -> dict[str, Any]:
    """A chat log entry as an OpenAI chat message."""
    if isinstance(content, conversation.ToolResultContent):
        return {
            "role": "tool",
            "tool_call_id": content.tool_call_id,
            "content": json_dumps(_tool_result(content)),
        }
    if isinstance(content, conversation.AssistantContent):
        message: dict[str, Any] = {"role": "assistant", "content": content.content or ""}
        if content.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.tool_name, "arguments": json.dumps(call.tool_args)},
                }
                for call in content.tool_calls
            ]
        return message
    return {"role": content.role, "content": content.content}


# Home Assistant's system prompt carries the time to the second (llm.DATE_TIME_PROMPT).
_MOMENT = re.compile(r"Current time is [^\n]*?\.\s*Today's date is [^\n]*?\.[ \t]*\n?")


def stable_first(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What changes every turn goes last, so the server's prefix cache matches the rest.

    The server's cache reuses the longest prompt prefix it has seen. Home Assistant's system
    prompt holds the time to the second, before the exposed entities' or the tools' text (the
    chat template writes the tools after the system prompt), so two turns seconds apart would
    share almost nothing. The time and date move to the end of the newest user message.
    """
    if not messages or messages[0]["role"] != "system":
        return messages
    system = str(messages[0].get("content") or "")
    moment = _MOMENT.search(system)
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if moment is None or not users:
        return messages
    out = [dict(m) for m in messages]
    out[0]["content"] = (system[: moment.start()] + system[moment.end() :]).strip()
    out[users[-1]]["content"] = f"{out[users[-1]]['content']}\n\n({moment.group(0).strip()})"
    return out


def _tool_result(content: conversation.ToolResultContent) -> Any:
    """The tool's answer: `result` on current releases; `tool_result` before (and, on current
    releases, a deprecated alias that goes in 2027.11)."""
    if (result := getattr(content, "result", None)) is not None:
        return result
    return content.tool_result


def _trim_history(messages: list[dict[str, Any]], max_turns: int) -> list[dict[str, Any]]:
    """Keep the system prompt and the last `max_turns` user turns (0 keeps everything)."""
    if max_turns < 1:
        return messages
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if len(users) <= max_turns:
        return messages
    keep_from = users[-max_turns]
    head = messages[:1] if messages and messages[0]["role"] == "system" else []
    return head + messages[keep_from:]


async def _deltas(
    hass: HomeAssistant, chunks: AsyncIterator[dict[str, Any]]
) -> AsyncGenerator[conversation.AssistantContentDeltaDict]:
    """OpenAI stream chunks → the chat log's deltas.

    Text is passed on as it comes, so the voice pipeline can start speaking early. Tool calls
    arrive in pieces keyed by `index` (id and name first, then the arguments' text) and are
    handed over whole when the model finishes, as HA runs a tool as soon as it sees it.
    """
    yield {"role": "assistant"}
    calls: dict[int, dict[str, str]] = {}
    async for chunk in chunks:
        for choice in chunk.get("choices", ()):
            delta = choice.get("delta") or {}
            if delta.get("content"):
                yield {"content": delta["content"]}
            for piece in delta.get("tool_calls") or ():
                call = calls.setdefault(piece.get("index", 0), {"id": "", "name": "", "args": ""})
                function = piece.get("function") or {}
                call["id"] = piece.get("id") or call["id"]
                call["name"] = function.get("name") or call["name"]
                call["args"] += function.get("arguments") or ""
    if calls:
        yield {"tool_calls": [_tool_input(hass, call) for _, call in sorted(calls.items())]}


def _tool_input(hass: HomeAssistant, call: dict[str, str]) -> llm.ToolInput:
    """A complete tool call, its arguments repaired (see `tool_args`)."""
    try:
        args = json.loads(call["args"] or "{}")
    except json.JSONDecodeError:
        _LOGGER.warning("Tool call %s with arguments that are not JSON: %s", call["name"], call)
        args = {}
    args = repair_args(hass, args) if isinstance(args, dict) else {}
    if call["id"]:
        return llm.ToolInput(tool_name=call["name"], tool_args=args, id=call["id"])
    return llm.ToolInput(tool_name=call["name"], tool_args=args)
