"""Repairs of small models' tool arguments: only filters that cannot match, only with a name."""

from __future__ import annotations

from homeassistant.core import HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import floor_registry as fr

from custom_components.fairlane.tool_args import repair_args
from tests_ha.conftest import add_kitchen_light


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


async def test_a_target_the_person_did_not_say_gives_way_to_one_they_did(
    hass: HomeAssistant,
) -> None:
    """Shown the home's names, the small model fills every slot: "turn on the Backyard light"
    came back naming a bedroom's light, "dining room light off" with the kitchen as its area."""
    await add_kitchen_light(hass, "Dining Room Light")  # in the Kitchen area...
    ar.async_get(hass).async_create("Backyard")
    said = "Turn on the Backyard light"
    assert repair_args(hass, {"name": "Dining Room Light", "area": "Backyard",
                              "domain": ["light"]}, said) == {
        "area": "Backyard", "domain": ["light"]}
    # ...so a named entity that is not where the model put it keeps its name, not the area.
    said = "Dining room light off"
    assert repair_args(hass, {"name": "Dining Room Light", "area": "Backyard"}, said) == {
        "name": "Dining Room Light"}
    # A domain none of the named entities has goes; one they have stays.
    assert repair_args(hass, {"name": "Dining Room Light", "domain": ["binary_sensor"]},
                       said) == {"name": "Dining Room Light"}
    assert repair_args(hass, {"name": "Dining Room Light", "domain": ["light"]}, said) == {
        "name": "Dining Room Light", "domain": ["light"]}
    # Neither said: the name stands, as without the words.
    assert repair_args(hass, {"name": "Dining Room Light", "area": "Kitchen"}, "do it") == {
        "name": "Dining Room Light", "area": "Kitchen"}


async def test_a_call_that_targets_nothing_gets_what_the_person_named(
    hass: HomeAssistant,
) -> None:
    """"Set the smart curtain to 50%" came back as {"position": 50}: Home Assistant refuses a
    call that targets every device."""
    await add_kitchen_light(hass, "Kitchen light")
    ar.async_get(hass).async_create("Living room")
    slots = frozenset({"name", "area", "floor", "domain", "position"})
    assert repair_args(hass, {"position": 50}, "Set the kitchen light to 50%", slots) == {
        "position": 50, "name": "Kitchen light"}
    assert repair_args(hass, {"position": 50}, "Set the living room curtains to 50%",
                       slots) == {"position": 50, "area": "Living room"}
    assert repair_args(hass, {"position": 50}, "Set it to 50%", slots) == {"position": 50}
    # An intent without targeting slots (a timer's, a list's) gets none.
    assert repair_args(hass, {"minutes": 5}, "Kitchen light timer for 5 minutes",
                       frozenset({"name", "minutes"})) == {"minutes": 5}


async def test_a_place_without_a_domain_gets_the_domains_the_intent_acts_on(
    hass: HomeAssistant,
) -> None:
    """"Set the living room curtains to 50%" came back as an area alone, and Home Assistant
    tried the area's sensors too."""
    slots = frozenset({"name", "area", "floor", "domain", "position"})
    ar.async_get(hass).async_create("Living room")
    said = "Set the living room curtains to 50%"
    assert repair_args(hass, {"area": "Living room", "position": 50}, said, slots,
                       frozenset({"cover", "valve"})) == {
        "area": "Living room", "position": 50, "domain": ["cover", "valve"]}
    # A domain the model gave, a named entity, or an intent for every domain: left as they are.
    assert repair_args(hass, {"area": "Living room", "domain": ["cover"]}, said, slots,
                       frozenset({"cover", "valve"}))["domain"] == ["cover"]
    assert "domain" not in repair_args(hass, {"area": "Living room"}, said, slots, None)
