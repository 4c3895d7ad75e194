"""Entities of the Fairlane device, and the chat logic the conversation and AI task share."""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, cast

from homeassistant.components import conversation
from homeassistant.config_entries import ConfigSubentry
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import intent, llm
from homeassistant.helpers.entity import Entity
from homeassistant.helpers.json import json_dumps
from homeassistant.helpers.update_coordinator import CoordinatorEntity

from .answers import done_speech
from .client import FairlaneError, FairlaneProtocolError, FairlaneRequestError
from .const import (
    CONF_ADDON_SLUG,
    CONF_MAX_HISTORY,
    CONF_MAX_TOKENS,
    CONF_TEMPERATURE,
    DEFAULT_MAX_HISTORY,
    DEFAULT_MAX_TOKENS,
    DEFAULT_NAME,
    DEFAULT_TEMPERATURE,
    DOCUMENTS_RELEVANT,
    DOMAIN,
    MAX_TOOL_ITERATIONS,
)
from .coordinator import FairlaneConfigEntry, FairlaneCoordinator
from .home_words import HomeWords, constrain, home_words
from .llm_api import documents_tool, lane_of
from .schema import to_json_schema, vol
from .tool_args import repair_args

_LOGGER = logging.getLogger(__name__)


# Calls whose arguments, as the model wrote them, an LLM entity keeps for its next rounds.
WRITTEN_CALLS = 64


def device_info(entry: FairlaneConfigEntry) -> dr.DeviceInfo:
    """The server's device: the sensors belong to it, and each subentry's device is linked
    to it. Its link opens the add-on's page for add-on users (the dashboard is the add-on's
    panel there), else the server's dashboard."""
    data = entry.runtime_data
    slug = entry.data.get(CONF_ADDON_SLUG)
    return dr.DeviceInfo(
        identifiers={(DOMAIN, entry.entry_id)},
        name=DEFAULT_NAME,
        manufacturer=DEFAULT_NAME,
        model=data.info.llm_model or None,
        sw_version=data.info.version,
        entry_type=dr.DeviceEntryType.SERVICE,
        configuration_url=f"homeassistant://hassio/addon/{slug}/info"
        if slug
        else str(data.client.base),
    )


def subentry_device_info(
    entry: FairlaneConfigEntry, subentry: ConfigSubentry, model: str | None
) -> dr.DeviceInfo:
    """A subentry's own device (an agent, the AI task, the voice), served by the server."""
    fields: dict[str, Any] = {
        "identifiers": {(DOMAIN, subentry.subentry_id)},
        "name": subentry.title,
        "manufacturer": DEFAULT_NAME,
        "model": model or None,
        "sw_version": entry.runtime_data.info.version,
        "entry_type": dr.DeviceEntryType.SERVICE,
        **_served_by(entry),
    }
    # A TypedDict before 2026.11, a dataclass since: the same keywords make either.
    info: dr.DeviceInfo = cast(Any, dr.DeviceInfo)(**fields)
    return info


# Home Assistant 2026.8 names a parent device by its registry id (`via_device` is deprecated,
# and removed in 2027.8); releases before know only `via_device`.
_VIA_DEVICE_ID = "via_device_id" in (
    getattr(dr.DeviceInfo, "__dataclass_fields__", None)  # a dataclass since 2026.11
    or getattr(dr.DeviceInfo, "__annotations__", {})  # a TypedDict before
)


def _served_by(entry: FairlaneConfigEntry) -> dict[str, Any]:
    """The link from a subentry's device to the server's, as this release spells it."""
    if _VIA_DEVICE_ID:
        return {"via_device_id": entry.runtime_data.device_id}
    return {"via_device": (DOMAIN, entry.entry_id)}


class FairlaneEntity(CoordinatorEntity[FairlaneCoordinator]):
    """An entity that reads the server's stats."""

    _attr_has_entity_name = True

    def __init__(self, entry: FairlaneConfigEntry, key: str) -> None:
        super().__init__(entry.runtime_data.coordinator)
        self._attr_unique_id = f"{entry.entry_id}_{key}"
        self._attr_device_info = device_info(entry)


class FairlaneSubentryEntity(Entity):
    """An entity of one subentry: its unique id is the subentry's, on the subentry's device."""

    _attr_has_entity_name = True

    def __init__(
        self, entry: FairlaneConfigEntry, subentry: ConfigSubentry, model: str | None
    ) -> None:
        self.entry = entry
        self.subentry = subentry
        self._attr_unique_id = subentry.subentry_id
        self._attr_device_info = subentry_device_info(entry, subentry, model)


class FairlaneLLMEntity(FairlaneSubentryEntity):
    """An entity that talks to the server's LLM: a conversation agent or the AI task."""

    def __init__(self, entry: FairlaneConfigEntry, subentry: ConfigSubentry) -> None:
        super().__init__(entry, subentry, entry.runtime_data.info.llm_model)
        # The arguments the model wrote for the calls Home Assistant ran repaired, by call id
        # (the latest WRITTEN_CALLS): sent back as written (see `_message`).
        self._written: dict[str, str] = {}

    async def _async_handle_chat_log(
        self,
        chat_log: conversation.ChatLog,
        *,
        fairlane_class: str,
        user: str | None,
        structure: vol.Schema | None = None,
        language: str | None = None,
    ) -> None:
        """Run the model over the chat log, calling Assist tools until it answers (bounded)."""
        options = self.subentry.data
        tools: list[dict[str, Any]] | None = None
        intent_tools: dict[str, IntentSlots] = {}  # an intent's tool name: its slots
        if chat_log.llm_api:
            words = home_words(self.hass)
            tools = [
                _format_tool(tool, chat_log.llm_api.custom_serializer, words)
                for tool in chat_log.llm_api.tools
            ]
            handlers = {h.intent_type: h.platforms for h in intent.async_get(self.hass)}
            intent_tools = {
                t["function"]["name"]: IntentSlots(
                    frozenset(t["function"]["parameters"].get("properties", {})),
                    frozenset(handlers.get(_unwrapped(tool).name) or ()) or None,
                )
                for tool, t in zip(chat_log.llm_api.tools, tools, strict=True)
                if _is_intent(tool)
            }
        body: dict[str, Any] = {
            "model": self.entry.runtime_data.info.llm_model,
            "max_tokens": int(options.get(CONF_MAX_TOKENS, DEFAULT_MAX_TOKENS)),
            "temperature": float(options.get(CONF_TEMPERATURE, DEFAULT_TEMPERATURE)),
            "fairlane_class": fairlane_class,
            "user": user or "home-assistant",
        }
        if structure is not None:
            serializer = chat_log.llm_api.custom_serializer if chat_log.llm_api else None
            schema = to_json_schema(structure, serializer or llm.selector_serializer)
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "result", "schema": schema},
            }
        max_history = int(options.get(CONF_MAX_HISTORY, DEFAULT_MAX_HISTORY))
        if searched := await search_first(chat_log, self.entity_id):
            # Searched already: offered again, small models search over and over.
            tools = [t for t in tools or () if t["function"]["name"] != searched] or None
        attached: list[dict[str, Any]] = []
        last = chat_log.content[-1]
        if isinstance(last, conversation.UserContent) and last.attachments:
            attached = await self.hass.async_add_executor_job(
                attachment_parts, last.attachments, str(body["model"])
            )

        made: set[str] = set()  # this turn's tool calls, by name and arguments
        answer = False  # the model must answer in words now
        call_now = False  # the model must call a tool now (it described one instead)
        for round_ in range(MAX_TOOL_ITERATIONS):
            messages = stable_first(
                _trim_history(
                    [
                        m
                        for m in (_message(c, self._written) for c in chat_log.content)
                        if not _empty(m)
                    ],
                    max_history,
                )
            )
            if attached:
                _attach(messages, attached)
            request = {**body, "messages": messages}
            if tools:
                request["tools"] = tools
                # The last round, and a round after a repeated call, may not call a tool, so
                # the turn ends in words. The tools stay in the prompt: the server's prefix
                # cache then holds all of it from the calls before.
                if answer or round_ == MAX_TOOL_ITERATIONS - 1:
                    request["tool_choice"] = "none"
                    # In words: the default model echoes a tool's result as JSON otherwise.
                    request["fairlane_words"] = True
                elif call_now:
                    request["tool_choice"] = "required"
                    call_now = False
            guess = self.entry.runtime_data.guess
            if guess is not None and round_ == 0 and len(messages) == 2 and not attached and \
                    isinstance(last, conversation.UserContent):
                guess.opened(request, last.content)  # a new conversation: a guess's shape
            stream = self.entry.runtime_data.client.chat_stream(request)
            repeated: list[str] = []
            try:
                async for _content in chat_log.async_add_delta_content_stream(
                    self.entity_id,
                    _deltas(self.hass, stream, intent_tools, made, repeated, self._written,
                            _said(chat_log)),
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
            if repeated:
                # The model asked again for what it already has (a small model can loop on
                # one call until the last round): the next round may not call a tool, so it
                # answers from the results it has. (A round whose calls were all repeats
                # leaves the chat log ending in the last results, as if unanswered.)
                _LOGGER.debug("Tool call repeated in one turn, not run again: %s", repeated)
                answer = True
                continue
            if not chat_log.unresponded_tool_results:
                if round_ == 0 and tools and _describes_a_tool(chat_log, intent_tools):
                    # Asked to act, the small model sometimes writes how one would call the
                    # tool ("you can use the `HassListAddItem` function…") instead of calling
                    # it: the next round must call one.
                    call_now = True
                    continue
                return
            if done := _actions_done(chat_log):
                # Home Assistant says each action this round asked for is done: its own
                # response for them is the answer (`answers`), in the conversation's language;
                # where it has none, the next round confirms it in words. (Offered the tools
                # again, the default model asks for the same call once more, a whole wasted
                # round.) A query's answer, a tool's error or a failed target still leaves
                # the model free to call again.
                if language and (speech := await done_speech(self.hass, language, done)):
                    chat_log.async_add_assistant_content_without_tools(
                        conversation.AssistantContent(agent_id=self.entity_id, content=speech)
                    )
                    return
                answer = True


def _describes_a_tool(chat_log: conversation.ChatLog, intent_tools: dict[str, Any]) -> bool:
    """Whether the model's last reply, in words, names one of Assist's intent tools."""
    last = chat_log.content[-1]
    if not isinstance(last, conversation.AssistantContent) or not last.content:
        return False
    return any(name.rpartition("__")[2] in last.content for name in intent_tools)


def _actions_done(
    chat_log: conversation.ChatLog,
) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """The last round's calls (intent, arguments, result) when all are Assist actions Home
    Assistant reports done (an intent's `action_done`) with no target failed; else []."""
    done: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    calls: dict[str, llm.ToolInput] = {}
    for content in reversed(chat_log.content):
        if isinstance(content, conversation.AssistantContent):
            calls = {call.id: call for call in content.tool_calls or ()}
            break
    for content in reversed(chat_log.content):
        if not isinstance(content, conversation.ToolResultContent):
            break
        result = _tool_result(content)
        if isinstance(result, dict) and set(result) == {"data", "error"}:
            # Current releases: `llm.ToolResult`, whose `error` is a flag.
            result = None if result["error"] else result["data"]
        if not (
            isinstance(result, dict)
            and result.get("response_type") == intent.IntentResponseType.ACTION_DONE.value
            and not (result.get("data") or {}).get("failed")
        ):
            return []
        call = calls.get(content.tool_call_id)
        args = dict(call.tool_args) if call is not None else {}
        # The intent's own name: since 2026.11 Assist's tools are namespaced (`intent__…`).
        done.append((content.tool_name.rpartition("__")[2], args, result))
    done.reverse()
    return done


def _format_tool(
    tool: llm.Tool, serializer: Callable[[Any], Any] | None, words: HomeWords
) -> dict[str, Any]:
    """An Assist tool in OpenAI's `tools` shape; an intent's targets limited to the home's
    words (`home_words`: the server samples the call under this schema)."""
    parameters = to_json_schema(tool.parameters, serializer)
    if _is_intent(tool):
        parameters = constrain(parameters, words, _unwrapped(tool).name)
    function: dict[str, Any] = {"name": tool.name, "parameters": parameters}
    if tool.description:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _empty(message: dict[str, Any]) -> bool:
    """An assistant message with neither text nor calls (a round whose calls were repeats)."""
    return message["role"] == "assistant" and not message["content"] and not (
        message.get("tool_calls")
    )


def _message(content: conversation.Content, written: dict[str, str]) -> dict[str, Any]:
    """A chat log entry as an OpenAI chat message. A call goes back with the arguments the
    model wrote (`written`, where Home Assistant ran them repaired): the prompt then holds the
    tokens of the call that the server's prefix cache holds, and the round after a call
    prefills only the result (a repaired call, sent as run, broke the cache at the first
    argument dropped)."""
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
                    "function": {
                        "name": call.tool_name,
                        "arguments": written.get(call.id) or json.dumps(call.tool_args),
                    },
                }
                for call in content.tool_calls
            ]
        return message
    return {"role": content.role, "content": content.content}


# Home Assistant's system prompt carries the time to the second (llm.DATE_TIME_PROMPT).
_MOMENT = re.compile(r"Current time is [^\n]*?\.\s*Today's date is [^\n]*?\.[ \t]*\n?")
_SECONDS = re.compile(r"\b(\d{1,2}:\d{2}):\d{2}\b")


def stable_first(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What changes every turn goes last, so the server's prefix cache matches the rest.

    The server's cache reuses the longest prompt prefix it has seen. Home Assistant's system
    prompt holds the time to the second, before the exposed entities' or the tools' text (the
    chat template writes the tools after the system prompt), so two turns seconds apart would
    share almost nothing. The time and date move to the end of the newest user message, the
    time to the minute: a reply needs no seconds, and a turn begun a moment before on the
    early transcript (`guess`) then has the prompt of the turn that claims it.
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
    when = _SECONDS.sub(r"\1", moment.group(0).strip())
    out[users[-1]]["content"] = f"{out[users[-1]]['content']}\n\n({when})"
    return out


def _tool_result(content: conversation.ToolResultContent) -> Any:
    """The tool's answer. Current releases hold it in `result`, an object with `data` and
    `error` (sent as core's own OpenAI-style agents send it); releases before have only
    `tool_result`, which current ones keep as a deprecated alias until 2027.11."""
    result = getattr(content, "result", None)
    if result is None:
        return content.tool_result
    if hasattr(result, "data"):
        return {"data": result.data, "error": getattr(result, "error", None)}
    return result


# What the server reads out of a file part (it extracts the text, as for documents).
TEXT_TYPES = ("text/plain", "text/markdown", "text/html", "application/pdf")


def attachment_parts(
    attachments: list[conversation.Attachment], model: str
) -> list[dict[str, Any]]:
    """Text and PDF attachments as OpenAI `file` parts, for the server to read (in the
    executor: it reads the files). An image or another kind is refused with what the model
    reads; the model sees no pixels, so it must not pretend to."""
    parts: list[dict[str, Any]] = []
    for attachment in attachments:
        mime = attachment.mime_type.split(";")[0].strip().lower()
        if mime not in TEXT_TYPES:
            raise HomeAssistantError(
                translation_domain=DOMAIN,
                translation_key="attachment_not_supported",
                translation_placeholders={
                    "name": attachment.path.name,
                    "type": mime,
                    "model": model,
                },
            )
        data = base64.b64encode(attachment.path.read_bytes()).decode()
        parts.append(
            {
                "type": "file",
                "file": {
                    "filename": attachment.path.name,
                    "file_data": f"data:{mime};base64,{data}",
                },
            }
        )
    return parts


def _attach(messages: list[dict[str, Any]], parts: list[dict[str, Any]]) -> None:
    """The attachments go with the newest user message, after its text."""
    for message in reversed(messages):
        if message["role"] == "user":
            text = str(message.get("content") or "")
            message["content"] = [{"type": "text", "text": text}, *parts]
            return


async def search_first(chat_log: conversation.ChatLog, agent_id: str) -> str | None:
    """With the household documents selected: search them for the user's words before the
    model runs and, when a passage is close (`DOCUMENTS_RELEVANT`), put the search and its
    result in the chat log as the agent's own tool call, so the model answers with the
    passages in front of it (see `llm_api`). The model may still search again itself."""
    found = documents_tool(chat_log.llm_api)
    last = chat_log.content[-1]
    if found is None or chat_log.llm_api is None or not isinstance(last, conversation.UserContent):
        return None
    name, tool = found
    query = last.content.strip()
    hits = await tool.search(query, lane_of(chat_log.llm_api.llm_context)) if query else []
    if not hits or float(hits[0].get("score") or 0.0) < DOCUMENTS_RELEVANT:
        return None
    call = llm.ToolInput(tool_name=name, tool_args={"query": query})
    async for _result in chat_log.async_add_assistant_content(
        conversation.AssistantContent(agent_id=agent_id, content=None, tool_calls=[call])
    ):
        pass
    return name


def _is_intent(tool: llm.Tool) -> bool:
    """An Assist intent tool, also when several APIs are merged and it is namespaced."""
    return isinstance(_unwrapped(tool), llm.IntentTool)


def _unwrapped(tool: llm.Tool) -> llm.Tool:
    while isinstance(tool, llm.NamespacedTool):
        tool = tool.tool
    return tool


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
    hass: HomeAssistant,
    chunks: AsyncIterator[dict[str, Any]],
    intent_tools: dict[str, IntentSlots],
    made: set[str],
    repeated: list[str],
    written: dict[str, str] | None = None,
    said: str | None = None,
) -> AsyncGenerator[conversation.AssistantContentDeltaDict]:
    """OpenAI stream chunks → the chat log's deltas.

    Text is passed on as it comes, so the voice pipeline can start speaking early. Tool calls
    arrive in pieces keyed by `index` (id and name first, then the arguments' text) and are
    handed over whole when the model finishes, as HA runs a tool as soon as it sees it. A
    chunk that is not in OpenAI's shape ends the turn with an error, not a traceback.
    A call the turn has already made (`made`: name and arguments) is not handed over again;
    its name goes to `repeated`. A call whose arguments were repaired keeps the arguments the
    model wrote in `written` (by call id), to be sent back as written. `said`: the person's
    words this turn, against which an intent's targets are repaired (`tool_args`).
    """
    yield {"role": "assistant"}
    calls: dict[int, dict[str, str]] = {}
    async for chunk in chunks:
        try:
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if content := delta.get("content"):
                    yield {"content": str(content)}
                for piece in delta.get("tool_calls") or ():
                    index = int(piece.get("index", 0))
                    call = calls.setdefault(index, {"id": "", "name": "", "args": ""})
                    function = piece.get("function") or {}
                    call["id"] = str(piece.get("id") or call["id"])
                    call["name"] = str(function.get("name") or call["name"])
                    call["args"] += str(function.get("arguments") or "")
        except (AttributeError, KeyError, TypeError, ValueError) as err:
            raise FairlaneProtocolError(f"malformed stream chunk: {str(chunk)[:120]}") from err
    fresh = []
    for _, call in sorted(calls.items()):
        tool_input = _tool_input(hass, call, intent_tools.get(call["name"]), said)
        if written is not None and tool_input.id and tool_input.tool_args != _arguments(call):
            written[tool_input.id] = call["args"]
            while len(written) > WRITTEN_CALLS:
                del written[next(iter(written))]
        key = f"{tool_input.tool_name} {json.dumps(tool_input.tool_args, sort_keys=True)}"
        if key in made:
            repeated.append(tool_input.tool_name)
        else:
            made.add(key)
            fresh.append(tool_input)
    if fresh:
        yield {"tool_calls": fresh}


def _arguments(call: dict[str, str]) -> dict[str, Any]:
    """A streamed call's arguments as the model wrote them ({} when they are not an object)."""
    try:
        args = json.loads(call["args"] or "{}")
    except json.JSONDecodeError:
        return {}
    return args if isinstance(args, dict) else {}


def _said(chat_log: conversation.ChatLog) -> str | None:
    """The person's words this turn (the chat log's last user message)."""
    for content in reversed(chat_log.content):
        if isinstance(content, conversation.UserContent):
            return content.content
    return None


@dataclass(frozen=True)
class IntentSlots:
    """What an Assist intent's tool takes: its slots, and the domains its handler acts on."""

    slots: frozenset[str]
    platforms: frozenset[str] | None = None


def _tool_input(
    hass: HomeAssistant,
    call: dict[str, str],
    takes: IntentSlots | None,
    said: str | None = None,
) -> llm.ToolInput:
    """A complete tool call; an Assist intent's arguments repaired (see `tool_args`)."""
    args = _arguments(call)
    if not args and (call["args"] or "{}").strip() != "{}":
        _LOGGER.warning("Tool call %s with arguments that are not an object: %s",
                        call["name"], call)
    if takes is not None:  # an Assist intent
        args = repair_args(hass, args, said, takes.slots, takes.platforms)
    if call["id"]:
        return llm.ToolInput(tool_name=call["name"], tool_args=args, id=call["id"])
    return llm.ToolInput(tool_name=call["name"], tool_args=args)
