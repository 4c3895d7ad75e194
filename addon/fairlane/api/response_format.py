"""`response_format`: the JSON a chat completion must produce, as a llama.cpp grammar, within
bounds.

llama.cpp's grammar parser expands a repetition `x{m,n}` into n nested copies of `x`, and its
sampler walks those copies recursively. So a schema that asks for 100,000 characters
(`maxLength`) or items (`maxItems`) overflowed the stack and killed the process, and `minItems`
of 10^9 took all the memory. Every count a schema can ask for (string lengths, item, property
and `contains` counts, the quantifiers of its `pattern`s) is bounded before anything is built,
and so are the schema's size and depth and the grammar's own text. Anything over a bound, and
anything the converter or llama.cpp's parser refuses, is a 400 that says which.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from fairlane.api.common import ApiError
from fairlane.engines.native import import_llama_cpp

llama_grammar = import_llama_cpp("llama_grammar")

# `fairlane_words`: a reply in words. It opens with a letter or a digit (of any script) and
# holds no braces, brackets or backticks: barred only from its first character, the default
# model opened with ">" or a quote and went on with the JSON.
WORDS_GRAMMAR = r"root ::= [A-Za-z0-9\u00C0-\U0010FFFF] [^{}\[\]`\x00]*"

MAX_REPEAT = 500  # the largest count a schema may ask for (length, items, properties)
MAX_SCHEMA_BYTES = 32 * 1024
MAX_DEPTH = 24  # nested objects and arrays in the schema document
MAX_GRAMMAR_BYTES = 128 * 1024
COUNT_KEYS = frozenset(
    {
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "minContains",
        "maxContains",
    }
)
# A regular expression's counted repetition, `{m}`, `{m,}` or `{m,n}` (also how GBNF writes it).
REPETITION = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
PARAM = "response_format.json_schema"


def output_grammar(
    response_format: dict[str, Any] | None, parses: Callable[[str], bool]
) -> str | None:
    """The GBNF grammar (rule `root`) for a validated `response_format`, None for free text.

    `parses` asks the engine whether llama.cpp accepts the grammar; a refusal is a 400 here,
    not a failure inside the device loop."""
    if not response_format or response_format["type"] == "text":
        return None
    if response_format["type"] == "json_object":
        return str(llama_grammar.JSON_GBNF)
    schema = response_format["json_schema"]["schema"]
    check_schema(schema)
    try:
        grammar = str(llama_grammar.json_schema_to_gbnf(json.dumps(schema)))
    except (ValueError, KeyError, TypeError, RecursionError, AssertionError, IndexError) as err:
        # llama.cpp's converter asserts what it cannot do (a `pattern` without ^…$, …).
        raise ApiError(400, f"unsupported JSON schema: {err}", param=PARAM) from err
    if len(grammar) > MAX_GRAMMAR_BYTES:
        raise _over(f"its grammar has {len(grammar)} bytes; at most {MAX_GRAMMAR_BYTES}")
    _check_repetitions(grammar, "its grammar")
    if not parses(grammar):
        raise ApiError(400, "unsupported JSON schema: its grammar does not parse", param=PARAM)
    return grammar


def check_schema(schema: Any) -> None:
    """ApiError (400) for a schema over a bound; it names the bound."""
    _walk(schema, 0)  # first: it stops at MAX_DEPTH, where json.dumps would recurse on
    size = len(json.dumps(schema))
    if size > MAX_SCHEMA_BYTES:
        raise _over(f"the schema has {size} bytes; at most {MAX_SCHEMA_BYTES}")


def _walk(node: Any, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise _over(f"the schema nests deeper than {MAX_DEPTH} levels")
    if isinstance(node, list):
        for item in node:
            _walk(item, depth + 1)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key in COUNT_KEYS:
            _check_count(key, value)
        elif key == "pattern" and isinstance(value, str):
            _check_repetitions(value, "`pattern`")
        elif key == "enum" and (not isinstance(value, list) or not value):
            raise ApiError(
                400, "unsupported JSON schema: `enum` must list at least one value", param=PARAM
            )
        _walk(value, depth + 1)


def _check_count(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ApiError(
            400, f"unsupported JSON schema: `{key}` must be a whole number", param=PARAM
        )
    if value > MAX_REPEAT:
        raise _over(f"`{key}` is {value}; at most {MAX_REPEAT}")


def _check_repetitions(text: str, where: str) -> None:
    for match in REPETITION.finditer(text):
        for number in match.groups():
            if number and int(number) > MAX_REPEAT:
                raise _over(f"{where} repeats {number} times; at most {MAX_REPEAT}")


def _over(what: str) -> ApiError:
    return ApiError(
        400, f"response schema over a limit: {what}", param=PARAM, code="schema_too_large"
    )
