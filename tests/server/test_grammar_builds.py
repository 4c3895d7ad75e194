"""Chat grammars are built off the event loop, one at a time, and each once (review 39cbe61,
finding 2: building one on the loop held up every request, `/health` included)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from fairlane.api.common import ApiError
from fairlane.api.grammars import Grammars

SCHEMA = {"type": "json_schema", "json_schema": {"schema": {
    "type": "object", "properties": {"room": {"type": "string"}}, "required": ["room"]}}}
TOOLS = [{"type": "function", "function": {"name": "HassTurnOn", "parameters": {
    "type": "object", "properties": {"name": {"type": "string"}}}}}]


class Parses:
    """llama.cpp's parse check as the engine answers it, held until `release` is set, and
    where it ran."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.threads: list[str] = []

    def __call__(self, grammar: str) -> bool:
        self.threads.append(threading.current_thread().name)
        assert self.release.wait(60), "the event loop never ran while a grammar was built"
        return True


def test_a_grammar_is_built_while_the_event_loop_goes_on() -> None:
    parses = Parses()
    grammars = Grammars(parses)

    async def scenario() -> str | None:
        building = asyncio.ensure_future(grammars.output(SCHEMA))
        await asyncio.sleep(0)  # the loop runs other work while it builds: this is that work
        parses.release.set()
        return await building

    try:
        grammar = asyncio.run(scenario())
    finally:
        grammars.close()
    assert grammar is not None and "room" in grammar
    assert parses.threads and all(t.startswith("fairlane-grammar") for t in parses.threads)


def test_the_same_tools_are_built_once_and_a_refused_schema_stays_refused() -> None:
    parses = Parses()
    parses.release.set()
    grammars = Grammars(parses)
    bad: dict[str, Any] = {"type": "json_schema", "json_schema": {"schema": {"$ref": 5}}}

    async def scenario() -> list[Any]:
        first = await grammars.tools(TOOLS, "auto", template_shape=True, parallel=False)
        built = len(parses.threads)
        again = await grammars.tools(TOOLS, "auto", template_shape=True, parallel=False)
        assert len(parses.threads) == built  # from the cache: no second build
        for _ in range(2):
            with pytest.raises(ApiError) as refused:
                await grammars.output(bad)
            assert refused.value.status == 400
        return [first, again]

    try:
        first, again = asyncio.run(scenario())
    finally:
        grammars.close()
    assert first == again and first[0] is not None
