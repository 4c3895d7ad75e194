"""Home Assistant 2026.9 and later: probatio, not voluptuous, and no voluptuous_openapi.

Those releases need Python 3.14, which this machine cannot run, so their conditions are made
here: `voluptuous_openapi` cannot be imported, tool parameters and AI task structures are
probatio schemas, and the selector serializer answers `probatio.UNSUPPORTED` for what it
does not know, as core's does there. The turns run for real against the server.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import probatio
import pytest
from homeassistant.components import ai_task
from homeassistant.const import CONF_LLM_HASS_API
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import llm
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.fairlane.llm_api import tool_answer
from custom_components.fairlane.schema import to_json_schema
from tests_ha.conftest import set_agent

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_voluptuous_openapi(monkeypatch: pytest.MonkeyPatch) -> None:
    """`import voluptuous_openapi` fails from here on, as on 2026.9 (core's own modules that
    import it are loaded already; the integration's must not need it), and core's selector
    serializer answers with probatio's sentinel, as it does there. On those releases
    themselves there is nothing to change."""
    try:
        import voluptuous_openapi
    except ImportError:
        return

    of_this_release = llm.selector_serializer

    def selector_serializer(schema: Any) -> Any:
        answer = of_this_release(schema)
        return probatio.UNSUPPORTED if answer is voluptuous_openapi.UNSUPPORTED else answer

    monkeypatch.setattr(llm, "selector_serializer", selector_serializer)
    monkeypatch.setitem(sys.modules, "voluptuous_openapi", None)


def serializer_of_2026_9(schema: Any) -> Any:
    """What core's `llm.selector_serializer` answers there for what is not a selector."""
    return probatio.UNSUPPORTED


class ShoppingList(llm.API):
    """An LLM API of the 2026.9 kind: probatio parameters, probatio's serializer."""

    added: ClassVar[list[str]] = []

    async def async_get_api_instance(self, llm_context: llm.LLMContext) -> llm.APIInstance:
        return llm.APIInstance(
            api=self,
            api_prompt="Add what the user asks for to the shopping list with add_item.",
            llm_context=llm_context,
            tools=[AddItem()],
            custom_serializer=serializer_of_2026_9,
        )


class AddItem(llm.Tool):
    name = "add_item"
    description = "Add an item to the shopping list"
    parameters = probatio.Schema(
        {probatio.Required("item", description="What to buy"): str}
    )

    async def async_call(
        self, hass: HomeAssistant, tool_input: llm.ToolInput, llm_context: llm.LLMContext
    ) -> Any:
        ShoppingList.added.append(str(tool_input.tool_args.get("item")))
        return tool_answer({"success": True})


def test_the_integration_imports_without_voluptuous_openapi() -> None:
    """A fresh interpreter: core's modules loaded, then voluptuous_openapi made unimportable,
    then every module of the integration."""
    code = (
        "import sys, importlib, pkgutil\n"
        "import homeassistant.helpers.llm\n"
        "sys.modules['voluptuous_openapi'] = None\n"
        "import custom_components.fairlane as pkg\n"
        "for m in pkgutil.iter_modules(pkg.__path__):\n"
        "    importlib.import_module(f'custom_components.fairlane.{m.name}')\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_probatio_schemas_convert_with_probatio(no_voluptuous_openapi: None) -> None:
    schema = to_json_schema(AddItem.parameters, serializer_of_2026_9)
    assert schema["properties"]["item"] == {"type": "string", "description": "What to buy"}
    assert schema["required"] == ["item"]


async def test_a_tool_call_with_probatio_parameters(
    hass: HomeAssistant, entry: MockConfigEntry, no_voluptuous_openapi: None
) -> None:
    from homeassistant.components import conversation

    llm.async_register_api(hass, ShoppingList(hass=hass, id="shopping", name="Shopping"))
    await set_agent(hass, entry, **{CONF_LLM_HASS_API: ["shopping"]})
    ShoppingList.added = []
    await conversation.async_converse(
        hass, "Add milk to the shopping list.", None, Context(), agent_id="conversation.fairlane"
    )
    assert any("milk" in item.lower() for item in ShoppingList.added), ShoppingList.added


async def test_an_ai_task_with_a_probatio_structure(
    hass: HomeAssistant, entry: MockConfigEntry, no_voluptuous_openapi: None
) -> None:
    structure = probatio.Schema(
        {
            probatio.Required("item", description="What to buy"): str,
            probatio.Required("quantity", description="How many"): int,
        }
    )
    result = await ai_task.async_generate_data(
        hass,
        task_name="shopping",
        entity_id="ai_task.fairlane_ai_task",
        instructions="We need three lemons.",
        structure=structure,
    )
    assert isinstance(result.data, dict) and set(result.data) == {"item", "quantity"}
    assert isinstance(result.data["quantity"], int)
