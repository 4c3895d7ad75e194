"""Tool calls sampled under a grammar: a name among the tools offered, arguments in the tool's
JSON schema, and, where the chat template writes calls in Qwen's (Hermes') tags, in the very
text the template will write the call back as.

A small model left free wanders: it names a tool that was not offered, drops a required
argument, or writes a value its enum does not hold, and the turn fails or asks again. So a chat
request with tools samples under a lazy grammar: the reply is free until it starts a tool call,
and from there it must be a call of an offered tool with schema-valid arguments.
`tool_choice: "required"` or a named function applies the grammar from the first token.

Which shape a call must take depends on the turn:
- Replying to the person's words (or forced), with a tagged template, a reply that opens with
  JSON or a code fence is a call, and it is written as the template writes a call in the next
  round's prompt: `<tool_call>\n{"name": "…", "arguments": {…}}\n</tool_call>`, one line of
  JSON with Python's `json.dumps` spacing. The model's first token chooses between a call and
  words; the grammar chooses how the call is spelt. The answer round's prompt then holds the
  tokens already in the prefix cache through the call, instead of breaking at its first token
  (the small default model, free, writes a bare or ```json-fenced call, sometimes
  pretty-printed, and all of it was prefilled again in the next round).
- After a tool's result, the small model often echoes the result as JSON: that is its answer,
  not a call to force into a tool's shape, so only JSON that starts like a call
  (`{"name"`, fenced or bare) or the tag arms the grammar, and it admits the call in the shape
  the model began it in (`SHAPES`).

The grammar is best effort, as OpenAI's non-strict tools are: a tool whose schema is over a
bound or that llama.cpp's converter cannot take gets free JSON object arguments, and a grammar
that cannot be built leaves the reply free (logged). Only a `tool_choice` naming a tool that
was not offered is the client's error (400).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from fairlane.api.common import ApiError
from fairlane.api.response_format import MAX_GRAMMAR_BYTES, plain_schema, schema_grammar

_LOGGER = logging.getLogger(__name__)

# Where a tool call starts (regular expressions over the reply's UTF-8 text; the grammar takes
# the text from the first group, or else the whole match; see SamplingParams).
# Replying to the person's words: the tag anywhere, or JSON or a fence as the reply's first
# character (the token that opens it is replaced by the grammar's choice, `<tool_call>`).
OPENING_TRIGGERS = (r"<tool_call>", r"\A[ \t\n]*([{`])")
# After a tool's result: the tag anywhere; at the start of the reply, a fenced or bare JSON
# object whose first key is "name". Other JSON stays free: the small model may echo the result.
TRIGGERS = (
    r"<tool_call>",
    r'\A[ \t\n]*```(?:json|tool_call)?[ \t]*\n?[ \t\n]*\{[ \t\n]*"name"',
    r'\A[ \t\n]*\{[ \t\n]*"name"',
)

# The template's own shape: each call in its tags, one JSON line, a newline between calls (the
# template writes "\n<tool_call>\n" before each call, the first newline the generation prompt's).
# The tags are the vocabulary's own tokens (`<…>`: one token each, not their letters: the
# model, free to spell `</tool_call>` in five pieces, did).
TEMPLATE_SHAPE = r"""
root ::= tagged more
tagged ::= <tool_call> "\n" call "\n" </tool_call>
between ::= "\n"
"""
# The shapes a call may take once the model began it (rule `call`, a JSON object
# {"name": …, "arguments": …}).
SHAPES = r"""
root ::= ws (tagged more | fenced | call)
between ::= ws
tagged ::= "<tool_call>" ws call ws "</tool_call>"
fenced ::= "```" ("json" | "tool_call")? [ \t]* "\n"? ws call ws "```"
ws ::= [ \t\n]{0,8}
"""
# JSON's whitespace as llama.cpp's newer converter writes it: a call may be pretty-printed, as
# the small models write it when free (the converter here allows one space only).
SPACE = 'space ::= | " " | "\\n" [ \\t]{0,20}'
# JSON as `json.dumps` writes it (the template's `tojson`): ", " and ": ", no other space.
DUMPS_SPACE = 'space ::= ""'
ANY_ARGUMENTS: dict[str, Any] = {"type": "object"}
# After the first call: more calls (`parallel_tool_calls`), or none. One call by default, as
# llama.cpp's server does: the small default model, free to go on, calls tool after tool it
# was never asked for (for "what is the weather tomorrow": HassTurnOn, then HassLightSet red).
MORE_CALLS = "more ::= (between tagged)*"
ONE_CALL = 'more ::= ""'


def tool_call_grammar(
    tools: list[dict[str, Any]],
    tool_choice: Any,
    parses: Callable[[str], bool],
    template_shape: bool = False,
    parallel: bool = False,
) -> tuple[str | None, tuple[str, ...]]:
    """The grammar (rule `root`) and its triggers for a request's tools; (None, ()) when the
    reply stays free. No triggers: the grammar applies from the first token. `template_shape`:
    a call is written as a tagged chat template writes it back (see the module's docstring).
    `parallel`: a reply may hold several calls (in tags), else exactly one."""
    forced = tool_choice == "required" or isinstance(tool_choice, dict)
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        tools = [t for t in tools if t["function"]["name"] == name]
        if not tools:
            raise ApiError(
                400, f"tool_choice names {name!r}, which is not among the tools",
                param="tool_choice",
            )
    alternatives = [_alternative(tool["function"]) for tool in tools]
    try:
        call = schema_grammar({"anyOf": alternatives})
    except ApiError as err:
        _LOGGER.warning("Tool calls are sampled free: their grammar failed: %s", err.message)
        return None, ()
    call = re.sub(r"^root ::=", "call ::=", call, flags=re.MULTILINE)
    if template_shape:
        call = call.replace('"," space', '", "').replace('":" space', '": "')
        call = re.sub(r"^space ::=.*$", lambda _: DUMPS_SPACE, call, flags=re.MULTILINE)
        grammar = call + TEMPLATE_SHAPE
    else:
        call = re.sub(r"^space ::=.*$", lambda _: SPACE, call, flags=re.MULTILINE)
        grammar = call + SHAPES
    grammar += (MORE_CALLS if parallel else ONE_CALL) + "\n"
    if len(grammar) > MAX_GRAMMAR_BYTES or not parses(grammar):
        _LOGGER.warning(
            "Tool calls are sampled free: their grammar (%d bytes) is over %d or does not parse",
            len(grammar), MAX_GRAMMAR_BYTES,
        )
        return None, ()
    if forced:
        return grammar, ()
    return grammar, OPENING_TRIGGERS if template_shape else TRIGGERS


def _alternative(function: dict[str, Any]) -> dict[str, Any]:
    """One tool's call as a JSON schema: its name, then its arguments."""
    return {
        "type": "object",
        "properties": {
            "name": {"const": function["name"]},
            "arguments": _arguments(function),
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _arguments(function: dict[str, Any]) -> dict[str, Any]:
    """The tool's parameter schema, or any JSON object when it cannot be a grammar."""
    schema = function.get("parameters")
    if not isinstance(schema, dict) or not schema:
        return ANY_ARGUMENTS
    try:
        plain = plain_schema(schema)
        schema_grammar(plain)
    except ApiError as err:
        _LOGGER.info("Tool %s takes free arguments: %s", function["name"], err.message)
        return ANY_ARGUMENTS
    return plain
