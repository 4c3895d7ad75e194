"""The grammars a chat request samples under, built off the event loop and cached.

Building one is pure Python (llama.cpp's schema converter) plus llama.cpp's own parse of the
result: a large schema takes a second or more, and on the event loop it held up every other
request, `/health` included (950 optional properties: 2.2 s; eight such requests: 14.6 s).
So each is built on one worker thread of its own (one at a time: two cores do not build two
faster, and a flood of schemas then queues there instead of on the loop), and kept by what it
was built from: Home Assistant sends the same tools every turn, so a home's tool grammar is
built once. A schema that is refused is remembered as refused.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fairlane.api.common import ApiError
from fairlane.api.response_format import output_grammar
from fairlane.api.tool_calls import tool_call_grammar

ToolGrammar = tuple[str | None, tuple[str, ...]]
CACHED = 256  # grammars kept (the least recently used goes first)


class Grammars:
    """Output and tool-call grammars for chat requests (see the module)."""

    def __init__(self, parses: Callable[[str], bool], size: int = CACHED) -> None:
        self._parses = parses
        self._size = size
        self._built: OrderedDict[str, str | ToolGrammar | ApiError | None] = OrderedDict()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="fairlane-grammar")

    async def output(self, response_format: dict[str, Any] | None) -> str | None:
        """`response_format`'s grammar (None for free text); ApiError (400) if refused."""
        if not response_format or response_format.get("type") == "text":
            return None
        built = await self._get(
            ["output", response_format], lambda: output_grammar(response_format, self._parses)
        )
        assert built is None or isinstance(built, str)
        return built

    async def tools(
        self, tools: list[dict[str, Any]], tool_choice: Any, template_shape: bool, parallel: bool
    ) -> ToolGrammar:
        """The tool-call grammar and its triggers (`tool_calls.tool_call_grammar`)."""
        built = await self._get(
            ["tools", tools, tool_choice, template_shape, parallel],
            lambda: tool_call_grammar(
                tools, tool_choice, self._parses, template_shape=template_shape, parallel=parallel
            ),
        )
        assert isinstance(built, tuple)
        return built

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)

    async def _get(self, what: list[Any], build: Callable[[], Any]) -> Any:
        key = json.dumps(what, sort_keys=True, ensure_ascii=False)
        if key not in self._built:
            loop = asyncio.get_running_loop()
            try:
                built = await loop.run_in_executor(self._worker, build)
            except ApiError as err:
                built = err
            self._built[key] = built
            while len(self._built) > self._size:
                self._built.popitem(last=False)
        self._built.move_to_end(key)
        built = self._built[key]
        if isinstance(built, ApiError):
            raise built
        return built
