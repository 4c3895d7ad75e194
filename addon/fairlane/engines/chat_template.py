"""Chat prompts and tool calls: the model's own template in, OpenAI `tool_calls` out."""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The model has no usable chat template, or the messages do not fit it."""


class ChatTemplate:
    """Renders messages (and tools) with the GGUF's `tokenizer.chat_template`, as HF does."""

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "") -> None:
        if not source:
            # llama.cpp would silently fall back to ChatML here; a base model has no chat format.
            raise ChatTemplateError(
                "the model has no tokenizer.chat_template (a base model?); "
                "use an instruction-tuned GGUF"
            )
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        env.filters["tojson"] = lambda value, indent=None: json.dumps(
            value, ensure_ascii=False, indent=indent
        )
        self.template = env.from_string(source)
        # Qwen's (Hermes') format: the template tells the model to write calls in these tags.
        self.tagged_tool_calls = "<tool_call>" in source
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        try:
            return self.template.render(
                messages=[_for_template(m) for m in messages],
                tools=tools or None,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError as err:
            raise ChatTemplateError(f"the chat template refused these messages: {err}") from err
        except (TypeError, ValueError) as err:  # a field the template needs is missing or odd
            raise ChatTemplateError(
                f"the chat template cannot render these messages: {err}"
            ) from err


def _raise(message: str) -> None:
    raise TemplateError(message)


def _for_template(message: dict[str, Any]) -> dict[str, Any]:
    """OpenAI message → what HF chat templates expect (text content, dict arguments)."""
    out = dict(message)
    content = message.get("content")
    if isinstance(content, list):
        out["content"] = "".join(p.get("text", "") for p in content if p.get("type") == "text")
    elif content is None:
        out["content"] = ""
    if calls := message.get("tool_calls"):
        converted = []
        for call in calls:
            function = dict(call.get("function", {}))
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                with contextlib.suppress(json.JSONDecodeError):
                    function["arguments"] = json.loads(arguments)
            converted.append({**call, "function": function, **function})
        out["tool_calls"] = converted
    return out


_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_FENCED = re.compile(r"```(?:json|tool_call)?\s*(.*?)\s*```", re.DOTALL)


def parse_tool_calls(text: str, tools: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """OpenAI `tool_calls` from a model's reply, or None when it is not a tool call.

    Leniently: Qwen's `<tool_call>{...}</tool_call>` tags, a fenced ```json block, or the bare
    JSON object (or list of objects) that small models often write instead. A call must name
    one of the offered tools.
    """
    names = {t.get("function", {}).get("name") for t in tools}
    stripped = text.strip()
    candidates = _TAGGED.findall(stripped) or _FENCED.findall(stripped) or [stripped]
    calls: list[dict[str, Any]] = []
    for candidate in candidates:
        try:
            data = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        for item in data if isinstance(data, list) else [data]:
            call = _as_call(item, names)
            if call is not None:
                calls.append(call)
    return calls or None


def _as_call(item: Any, names: set[str | None]) -> dict[str, Any] | None:
    if not isinstance(item, dict):
        return None
    nested = item.get("function")
    function: dict[str, Any] = nested if isinstance(nested, dict) else item
    name = function.get("name")
    if name not in names:
        return None
    arguments = function.get("arguments", function.get("parameters", {}))
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def may_be_tool_call(text: str) -> bool:
    """Whether a reply that starts like this could still turn out to be a tool call."""
    head = text.lstrip()
    if not head:
        return True
    return any(
        marker.startswith(head[: len(marker)]) or head.startswith(marker)
        for marker in ("<tool_call>", "```", "{", "[")
    )
