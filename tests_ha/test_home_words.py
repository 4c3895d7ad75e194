"""Tool arguments constrained to the home: the target slots of Assist's intents are enums of
what the exposed home is called, in the tools the agent sends (the server samples a call under
them), so a small model can only name what exists (issue 43)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from homeassistant.components import conversation
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import floor_registry as fr
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.fairlane.const import CONF_TEMPERATURE
from custom_components.fairlane.home_words import constrain, home_words
from tests_ha.conftest import add_kitchen_light, set_agent
from tests_ha.test_conversation import AGENT, _record_requests


async def _home(hass: HomeAssistant) -> None:
    """A kitchen light, a hidden switch, a read-only sensor, an area with an alias, a floor."""
    await add_kitchen_light(hass)
    floor = fr.async_get(hass).async_create("Ground floor", aliases={"downstairs"})
    ar.async_get(hass).async_update(
        ar.async_get(hass).async_get_area_by_name("Kitchen").id,  # type: ignore[union-attr]
        aliases={"cookery"}, floor_id=floor.floor_id,
    )
    assert await async_setup_component(hass, "input_boolean", {})
    hass.states.async_set("sensor.kitchen_temperature", "21",
                          {"friendly_name": "Kitchen temperature"})
    async_expose_entity(hass, conversation.DOMAIN, "sensor.kitchen_temperature", True)
    async_expose_entity(hass, conversation.DOMAIN, "input_boolean.kitchen_power", False)
    await hass.async_block_till_done()


async def test_the_home_s_words_are_what_is_exposed(hass: HomeAssistant) -> None:
    await _home(hass)
    words = home_words(hass)
    assert words.names == ("Kitchen light", "Kitchen temperature")
    assert "Kitchen power" not in words.names  # not exposed
    assert words.acting_names == ("Kitchen light",)  # a sensor has no actions
    assert set(words.areas) == {"Kitchen", "cookery"}
    assert words.floors == ("Ground floor", "downstairs")
    assert set(words.domains) == {"light", "sensor"} and words.acting_domains == ("light",)


async def test_an_intent_s_targets_become_enums_and_its_other_slots_stay(
    hass: HomeAssistant,
) -> None:
    await _home(hass)
    words = home_words(hass)
    turn_on = {"type": "object", "properties": {
        "name": {"type": "string"}, "area": {"type": "string"}, "floor": {"type": "string"},
        "domain": {"type": "array", "items": {"type": "string"}},
        "brightness": {"type": "integer"}}}
    acting = constrain(turn_on, words, "HassTurnOn")
    assert acting["properties"]["name"]["enum"] == ["Kitchen light"]
    assert acting["properties"]["domain"]["items"]["enum"] == ["light"]
    assert acting["properties"]["area"]["enum"] == list(words.areas)
    assert acting["properties"]["floor"]["enum"] == ["Ground floor", "downstairs"]
    assert acting["properties"]["brightness"] == {"type": "integer"}
    assert "enum" not in turn_on["properties"]["name"]  # a copy: the original is untouched
    shared = {"type": "string"}  # as the serializer may write it: one schema for three slots
    alike = constrain({"type": "object", "properties": {"name": shared, "area": shared}},
                      words, "HassTurnOn")
    assert alike["properties"]["name"]["enum"] == ["Kitchen light"]
    assert alike["properties"]["area"]["enum"] == list(words.areas)
    query = constrain(turn_on, words, "HassGetState")
    assert query["properties"]["name"]["enum"] == ["Kitchen light", "Kitchen temperature"]
    no_floors = replace(words, floors=())  # a home without floors: nothing to name
    assert "floor" not in constrain(turn_on, no_floors, "HassTurnOn")["properties"]
    timer = {"type": "object", "properties": {"name": {"type": "string"},
                                              "minutes": {"type": "integer"}}}
    assert constrain(timer, words, "HassStartTimer") == timer  # a timer's name is free


async def test_the_agent_samples_its_calls_under_the_home_s_names(
    hass: HomeAssistant, entry: MockConfigEntry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tools sent to the server hold the enums; and a light the person names by an area
    alias is still switched on."""
    await _home(hass)
    await set_agent(hass, entry, **{CONF_TEMPERATURE: 0.0})
    sent = _record_requests(entry, monkeypatch)
    await conversation.async_converse(
        hass, "Turn on the kitchen light", None, Context(), agent_id=AGENT
    )
    await hass.async_block_till_done()
    assert hass.states.get("light.kitchen_light").state == "on"  # type: ignore[union-attr]
    # `intent__HassTurnOn` since 2026.11 (Assist's tools are namespaced there)
    tools: dict[str, Any] = {t["function"]["name"].rpartition("__")[2]: t["function"]
                             for t in sent[0]["tools"]}
    name = tools["HassTurnOn"]["parameters"]["properties"]["name"]
    assert name["enum"] == ["Kitchen light"]
