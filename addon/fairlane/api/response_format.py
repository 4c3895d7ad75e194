"""`response_format`: the JSON a chat completion must produce, as a llama.cpp grammar, within
bounds.

llama.cpp's grammar parser expands a repetition `x{m,n}` into n nested copies of `x`, and its
sampler walks those copies recursively. So a schema that asks for 100,000 characters
(`maxLength`) or items (`maxItems`) overflowed the stack and killed the process, and `minItems`
of 10^9 took all the memory. Every count a schema can ask for (string lengths, item, property
and `contains` counts, the quantifiers of its `pattern`s) is bounded before anything is built,
and so are the schema's size and depth and the grammar's own text. Anything over a bound, and
anything the converter or llama.cpp's parser refuses, is a 400 that says which.

Two more bounds are on time, not size. llama.cpp's grammar follows every reading of an
ambiguous pattern at once, so a step's work grows with the product of nested counts: the
counts of quantifiers nested within a pattern's groups may multiply to at most MAX_NESTED where
an inner one is variable (`^((a{0,10}){0,10}){0,10}a{60}$` froze the device for minutes; a
product of 100 costs ~60 ms a masked step here, of 125 ~350 ms, of 900 ~1.7 s). And the
converter spells every combination of optional properties, so an object may have at most
MAX_OPTIONAL of them (950 took 2.2 s to convert). The engine bounds what is left at sampling
time (`llm.grammar_budget_ms`).

A schema is first made plain (`plain_schema`): a boolean sub-schema `true` is `{}`, `false` is
a 400, and every keyword the converter reads must have its JSON type, so that any valid JSON
Schema is served or refused with a 400, never a 500.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fairlane.api.common import ApiError
from fairlane.engines.native import import_llama_cpp

llama_grammar = import_llama_cpp("llama_grammar")
_LOGGER = logging.getLogger(__name__)

# `fairlane_words`: a reply in words. It opens with a letter or a digit (of any script) and
# holds no braces, brackets or backticks: barred only from its first character, the default
# model opened with ">" or a quote and went on with the JSON.
WORDS_GRAMMAR = r"root ::= [A-Za-z0-9\u00C0-\U0010FFFF] [^{}\[\]`\x00]*"

MAX_REPEAT = 500  # the largest count a schema may ask for (length, items, properties)
MAX_SCHEMA_BYTES = 32 * 1024
MAX_DEPTH = 24  # nested objects and arrays in the schema document
MAX_GRAMMAR_BYTES = 128 * 1024
MAX_OPTIONAL = 64  # optional properties of one object (the converter is quadratic in them)
# Nested counts multiply to at most this where an inner quantifier is variable. `*`, `+` and
# `{m,}` are one recursive rule in llama.cpp (its readings merge), so they count as max(m, 2).
MAX_NESTED = 100
# Keywords whose values are sub-schemas: one, a list of them, or a map of names to them.
ONE_SCHEMA = frozenset(
    {"additionalProperties", "items", "not", "contains", "if", "then", "else",
     "propertyNames", "unevaluatedItems", "unevaluatedProperties", "additionalItems"}
)
SCHEMA_LISTS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions",
                         "dependentSchemas"})
DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})  # values, not schemas
KEYWORD_TYPES: dict[str, tuple[type, ...]] = {
    "pattern": (str,), "$ref": (str,), "format": (str,), "type": (str, list),
    "required": (list,), "enum": (list,),
}
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
    grammar = schema_grammar(plain_schema(response_format["json_schema"]["schema"]))
    if len(grammar) > MAX_GRAMMAR_BYTES:
        raise _over(f"its grammar has {len(grammar)} bytes; at most {MAX_GRAMMAR_BYTES}")
    _check_repetitions(grammar, "its grammar")
    if not parses(grammar):
        raise ApiError(400, "unsupported JSON schema: its grammar does not parse", param=PARAM)
    return grammar


def schema_grammar(schema: dict[str, Any]) -> str:
    """llama.cpp's converter on a plain schema; what it cannot do is a 400."""
    try:
        grammar = str(llama_grammar.json_schema_to_gbnf(json.dumps(schema)))
    except (ValueError, KeyError, TypeError, RecursionError, AssertionError, IndexError) as err:
        # llama.cpp's converter asserts what it cannot do (a `pattern` without ^…$, …).
        raise ApiError(400, f"unsupported JSON schema: {err}", param=PARAM) from err
    except Exception as err:  # a converter bug is still this schema's: a 400, never a 500
        _LOGGER.warning("The grammar converter failed on a schema: %r", err)
        raise ApiError(400, f"unsupported JSON schema: {err!r}", param=PARAM) from err
    return astral_escapes(grammar)


def plain_schema(schema: Any) -> dict[str, Any]:
    """The schema with its boolean sub-schemas spelt as objects, checked against every bound;
    ApiError (400) for one over a bound (it names the bound) or a keyword of the wrong type."""
    plain = _walk(schema, 0)  # first: it stops at MAX_DEPTH, where json.dumps would recurse on
    if not isinstance(plain, dict):
        raise _unsupported("the schema must be an object")
    size = len(json.dumps(schema))
    if size > MAX_SCHEMA_BYTES:
        raise _over(f"the schema has {size} bytes; at most {MAX_SCHEMA_BYTES}")
    return plain


def _walk(node: Any, depth: int) -> Any:
    """One sub-schema, plain (see `plain_schema`)."""
    if depth > MAX_DEPTH:
        raise _over(f"the schema nests deeper than {MAX_DEPTH} levels")
    if node is True:
        return {}
    if node is False:
        raise _unsupported("a `false` sub-schema accepts nothing")
    if not isinstance(node, dict):
        raise _unsupported(f"a sub-schema must be an object or a boolean, not {_kind(node)}")
    plain: dict[str, Any] = {}
    for key, value in node.items():
        expected = KEYWORD_TYPES.get(key)
        if expected is not None and not isinstance(value, expected):
            raise _unsupported(f"`{key}` must be {_kinds(expected)}, not {_kind(value)}")
        if key in COUNT_KEYS:
            _check_count(key, value)
        elif key == "pattern":
            _check_repetitions(value, "`pattern`")
            _check_nesting(value)
        elif key == "enum" and not value:
            raise _unsupported("`enum` must list at least one value")
        if key in DATA_KEYWORDS:
            _check_depth(value, depth + 1)
            plain[key] = value
        elif key == "additionalProperties" and isinstance(value, bool):
            plain[key] = value  # the converter reads the booleans themselves
        elif key in ONE_SCHEMA and not (key == "items" and isinstance(value, list)):
            plain[key] = _walk(value, depth + 1)
        elif key in SCHEMA_LISTS or key == "items":
            if not isinstance(value, list) or (key != "prefixItems" and not value):
                raise _unsupported(f"`{key}` must be a non-empty list of schemas")
            plain[key] = [_walk(item, depth + 1) for item in value]
        elif key in SCHEMA_MAPS:
            if not isinstance(value, dict):
                raise _unsupported(f"`{key}` must be an object of schemas, not {_kind(value)}")
            plain[key] = {name: _walk(item, depth + 1) for name, item in value.items()}
        else:
            _check_depth(value, depth + 1)
            plain[key] = value
    _check_optional(plain)
    return plain


def _check_depth(value: Any, depth: int) -> None:
    """A value that is data, not a schema, is held to the same depth."""
    if depth > MAX_DEPTH:
        raise _over(f"the schema nests deeper than {MAX_DEPTH} levels")
    children = value.values() if isinstance(value, dict) else value
    for child in children if isinstance(value, dict | list) else ():
        _check_depth(child, depth + 1)


def _check_optional(schema: dict[str, Any]) -> None:
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return
    required = schema.get("required") or []
    optional = sum(1 for name in properties if name not in required)
    if optional > MAX_OPTIONAL:
        raise _over(f"an object has {optional} optional properties; at most {MAX_OPTIONAL}")


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


def _kinds(types: tuple[type, ...]) -> str:
    return " or ".join(_kind(t()) for t in types)


# A surrogate pair as the converter writes a character outside the Basic Multilingual Plane
# (json.dumps's `\ud83d\udc4d`), not preceded by an escaped backslash.
SURROGATE_PAIR = re.compile(
    r"(?<!\\)((?:\\\\)*)\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})", re.IGNORECASE
)
LONE_SURROGATE = re.compile(r"(?<!\\)((?:\\\\)*)\\ud[89a-f][0-9a-f]{2}", re.IGNORECASE)


def astral_escapes(grammar: str) -> str:
    """The grammar with each surrogate pair as the one character it stands for (`\\U0001F44D`):
    llama.cpp reads `\\ud83d` as a code point of its own, which no UTF-8 text holds, and the
    reply was mojibake. A lone surrogate matches nothing: a 400."""

    def one(match: re.Match[str]) -> str:
        high, low = int(match.group(2), 16), int(match.group(3), 16)
        point = 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)
        return f"{match.group(1)}\\U{point:08X}"

    grammar = SURROGATE_PAIR.sub(one, grammar)
    if LONE_SURROGATE.search(grammar):
        raise _unsupported("a string holds a lone surrogate (half of a UTF-16 pair)")
    return grammar


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


@dataclass
class _Group:
    """What a pattern's group holds: the largest product of counts within it, and whether any
    quantifier within it is variable (its piece may match in more than one length)."""

    repeats: int = 1
    variable: bool = False


def _check_nesting(pattern: str) -> None:
    """A 400 when a variable quantifier sits within a repeated group and the counts multiply
    past MAX_NESTED: llama.cpp's grammar follows every way of splitting the text among them."""
    stack = [_Group()]
    last: _Group | None = None  # the piece a quantifier after it would repeat
    i = 0
    while i < len(pattern):
        char = pattern[i]
        quantifier = _quantifier(pattern, i)
        if quantifier is not None and last is not None:
            low, high, i = quantifier
            repeats = last.repeats * (max(low, 2) if high is None else high)
            if last.variable and high != 1 and repeats > MAX_NESTED:
                raise _over(
                    f"`pattern` nests a repetition of varying length in a repeated group: its "
                    f"counts multiply to {repeats}; at most {MAX_NESTED}"
                )
            stack[-1].repeats = max(stack[-1].repeats, repeats)
            stack[-1].variable |= last.variable or low != high
            last = None
            continue
        last = _Group()
        if char == "\\":
            i += 2
        elif char == "[":
            i = _class_end(pattern, i)
        elif char == "(":
            stack.append(_Group())
            last = None
            i += 1
            if pattern.startswith("?", i):  # (?:…), (?=…): the marker is not a quantifier
                i += 2
        elif char == ")" and len(stack) > 1:
            last = stack.pop()
            stack[-1].repeats = max(stack[-1].repeats, last.repeats)
            stack[-1].variable |= last.variable
            i += 1
        else:
            last = None if char in "|^$" else last
            i += 1


def _quantifier(pattern: str, i: int) -> tuple[int, int | None, int] | None:
    """(low, high or None for no bound, the index after it) of a quantifier at i; None if
    there is none."""
    char = pattern[i]
    high: int | None
    if char in "*+?":
        low, high, end = (1 if char == "+" else 0), (1 if char == "?" else None), i + 1
    elif char == "{" and (match := REPETITION.match(pattern, i)) is not None:
        low = int(match.group(1))
        given = match.group(2)
        high = low if given is None else (None if given == "" else int(given))
        end = match.end()
    else:
        return None
    if end < len(pattern) and pattern[end] in "?+":  # lazy or possessive: the same counts
        end += 1
    return low, high, end


def _class_end(pattern: str, i: int) -> int:
    """The index after a character class that opens at i."""
    j = i + 1
    if pattern.startswith("^", j):
        j += 1
    if pattern.startswith("]", j):
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j + 1


def _unsupported(what: str) -> ApiError:
    return ApiError(400, f"unsupported JSON schema: {what}", param=PARAM)


def _over(what: str) -> ApiError:
    return ApiError(
        400, f"response schema over a limit: {what}", param=PARAM, code="schema_too_large"
    )
