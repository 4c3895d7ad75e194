"""Repairs of small models' tool arguments: only filters that cannot match, only with a name."""

from __future__ import annotations

from homeassistant.core import HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import floor_registry as fr

from custom_components.fairlane.tool_args import repair_args


async def test_guessed_filters_are_dropped_when_the_entity_is_named(hass: HomeAssistant) -> None:
    ar.async_get(hass).async_create("Kitchen")
    fr.async_get(hass).async_create("Ground floor", aliases={"downstairs"})
    guessed = {"name": "Kitchen light", "area": "Kitchen", "floor": "1", "domain": "light",
               "device_class": ["outlet"], "brightness": ""}
    # Only the target slots: brightness is the model's to get right.
    assert repair_args(hass, guessed) == {"name": "Kitchen light", "area": "Kitchen",
                                          "domain": "light", "brightness": ""}
    assert repair_args(hass, {"name": "Lamp", "floor": "downstairs", "area": "Attic"}) == {
        "name": "Lamp", "floor": "downstairs"}
    assert repair_args(hass, {"name": "Lamp", "area": "None", "floor": "null"}) == {"name": "Lamp"}


async def test_nothing_is_widened_without_a_name(hass: HomeAssistant) -> None:
    # "Turn on the lights in the attic" with no attic must fail, not light the whole house.
    args = {"area": "Attic", "domain": ["light"], "device_class": ["outlet"]}
    assert repair_args(hass, args) == args
    assert repair_args(hass, {"area": "Attic", "floor": ""}) == {"area": "Attic"}
