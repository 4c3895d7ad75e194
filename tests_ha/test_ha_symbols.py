"""Every Home Assistant symbol the integration uses, imported from the list kept beside the code
(`custom_components/fairlane/ha_symbols.txt`): on a release where one moved or went away this
fails with its name, and the list is checked against the code, so it cannot go stale."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

INTEGRATION = Path(__file__).resolve().parents[1] / "custom_components" / "fairlane"
# Packages the integration takes from Home Assistant's own requirements, not its manifest.
FROM_CORE = ("homeassistant", "voluptuous_openapi", "home_assistant_intents")


def listed() -> list[str]:
    lines = (INTEGRATION / "ha_symbols.txt").read_text().splitlines()
    symbols = [line.partition("#")[0].strip() for line in lines]
    return [symbol for symbol in symbols if symbol]


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def used_by_the_code() -> set[str]:
    """`module:name` for each symbol imported from core, or read off a core module."""
    used: set[str] = set()
    for path in sorted(INTEGRATION.glob("*.py")):
        tree = ast.parse(path.read_text())
        modules: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(FROM_CORE):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if _is_module(full):
                        modules[alias.asname or alias.name] = full
                    else:
                        used.add(f"{node.module}:{alias.name}")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
            ):
                used.add(f"{modules[node.value.id]}:{node.attr}")
    return used


# Imported only on the releases that have them: the code picks its path by release.
ONLY_SOME_RELEASES = {
    "voluptuous_openapi": "Home Assistant 2026.9 and later do not install voluptuous_openapi",
}


@pytest.mark.parametrize("symbol", listed())
def test_each_listed_symbol_imports(symbol: str) -> None:
    module, _, name = symbol.partition(":")
    if module in ONLY_SOME_RELEASES and not _is_module(module):
        pytest.skip(ONLY_SOME_RELEASES[module])
    assert hasattr(importlib.import_module(module), name), symbol


def test_the_list_is_what_the_code_uses() -> None:
    # probatio is imported as a module (only on the releases that have it), so it is listed
    # by hand; everything else is read off the code.
    assert set(listed()) == used_by_the_code() | {"probatio:to_openapi"}


def test_tool_results_are_read_from_result_where_core_has_it() -> None:
    """Core renamed `ToolResultContent.tool_result` to `result` (the old name is a deprecated
    alias until 2027.11); the agent reads whichever the running release has."""
    import dataclasses

    from homeassistant.components import conversation

    from custom_components.fairlane.entity import _message

    fields = {f.name for f in dataclasses.fields(conversation.ToolResultContent)}
    if "result" in fields:  # 2026.11 and later: `result`, an llm.ToolResult
        from homeassistant.helpers import llm

        this_release = conversation.ToolResultContent(
            agent_id="a", tool_call_id="c1", tool_name="HassTurnOn",
            result=llm.ToolResult(data={"ok": 1}),
        )
        # As core's own OpenAI-style agents (llama_cpp) send it.
        expected = '{"data":{"ok":1},"error":false}'
    else:  # before: `tool_result`, the tool's JSON
        this_release = conversation.ToolResultContent(
            agent_id="a", tool_call_id="c1", tool_name="HassTurnOn", tool_result={"ok": 1}
        )
        expected = '{"ok":1}'
    assert _message(this_release, {}) == {"role": "tool", "tool_call_id": "c1", "content": expected}
