"""Chat templates and the lenient tool-call parser (the shapes small models really write)."""

from __future__ import annotations

import json

import pytest

from fairlane.engines.chat_template import (
    ChatTemplate,
    ChatTemplateError,
    may_be_tool_call,
    parse_tool_calls,
)

TOOLS = [{"type": "function", "function": {"name": "light_turn_on", "parameters": {}}}]


@pytest.mark.parametrize(
    "reply",
    [
        '<tool_call>\n{"name": "light_turn_on", "arguments": {"name": "kitchen"}}\n</tool_call>',
        '```json\n{"name": "light_turn_on", "arguments": {"name": "kitchen"}}\n```',
        '{"name": "light_turn_on", "arguments": {"name": "kitchen"}}',
        '[{"name": "light_turn_on", "arguments": {"name": "kitchen"}}]',
        '{"function": {"name": "light_turn_on", "arguments": "{\\"name\\": \\"kitchen\\"}"}}',
        '{"name": "light_turn_on", "parameters": {"name": "kitchen"}}',
    ],
)
def test_tool_call_shapes_are_parsed(reply: str) -> None:
    calls = parse_tool_calls(reply, TOOLS)
    assert calls is not None and len(calls) == 1
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls[0]["function"]["name"] == "light_turn_on"
    assert json.loads(calls[0]["function"]["arguments"]) == {"name": "kitchen"}


@pytest.mark.parametrize(
    "reply",
    ["The kitchen light is on.", '{"name": "unlock_door", "arguments": {}}', "{not json"],
)
def test_text_and_unknown_tools_are_not_calls(reply: str) -> None:
    assert parse_tool_calls(reply, TOOLS) is None


def test_may_be_tool_call_holds_back_only_what_could_become_one() -> None:
    assert may_be_tool_call("") and may_be_tool_call("<tool") and may_be_tool_call("  {")
    assert may_be_tool_call("``") and not may_be_tool_call("Sure, the light")


TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% for c in m.tool_calls or [] %}[{{ c.function.name }} {{ c.function.arguments | tojson }}]"
    "{% endfor %}</{{ m.role }}>{% endfor %}"
    "{% if tools %}<tools>{{ tools | length }}</tools>{% endif %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_template_renders_tools_text_parts_and_dict_arguments() -> None:
    template = ChatTemplate(TEMPLATE)
    text = template.render(
        [
            {"role": "user", "content": [{"type": "text", "text": "Lights"},
                                         {"type": "text", "text": " on"}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "light_turn_on", "arguments": '{"name": "hall"}'}}]},
        ],
        tools=TOOLS,
    )
    assert text == ('<user>Lights on</user><assistant>[light_turn_on {"name": "hall"}]'
                    "</assistant><tools>1</tools><assistant>")


def test_template_errors_are_chat_template_errors() -> None:
    with pytest.raises(ChatTemplateError, match=r"no tokenizer\.chat_template"):
        ChatTemplate("")
    failing = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        failing.render([{"role": "user", "content": "hi"}])
