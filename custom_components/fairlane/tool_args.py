"""Repairs for the tool calls of small models, before Home Assistant runs them.

A 0.5B model calling Assist's `HassTurnOn` for "turn on the kitchen light" tends to fill
every optional slot it was shown: `{"name": "Kitchen light", "area": "Kitchen",
"floor": "None", "device_class": ["outlet"]}`. Each guessed filter that matches nothing in
this home makes the whole call fail. When the model named the entity, the name is what
identifies it, so filters that cannot be right are dropped; without a name nothing is
widened (dropping an area there could switch on every light in the house).

Only Assist's intent tools get this, and only their targeting slots: a script's fields, a
shopping list item called "None" and other APIs' tools are passed on as the model wrote them.
"""

from __future__ import annotations

from typing import Any

from homeassistant.core import HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import floor_registry as fr

# What small models write for "no value".
_EMPTY = ("", "none", "null", "n/a", "unknown")
# The slots of Assist's intents that pick the target: the only ones repaired.
TARGET_SLOTS = frozenset({"name", "area", "floor", "domain", "device_class"})


def repair_args(hass: HomeAssistant, args: dict[str, Any]) -> dict[str, Any]:
    """An intent's `args` without empty target slots and, when an entity is named, without
    target filters that cannot match."""
    args = {k: v for k, v in args.items() if k not in TARGET_SLOTS or not _empty(v)}
    if "name" not in args:
        return args
    if isinstance(args.get("area"), str) and not _area_exists(hass, args["area"]):
        del args["area"]
    if isinstance(args.get("floor"), str) and not _floor_exists(hass, args["floor"]):
        del args["floor"]
    # A named entity needs no class filter, and a guessed one (lights have none) only fails.
    args.pop("device_class", None)
    return args


def _empty(value: Any) -> bool:
    if value is None or value == [] or value == {}:
        return True
    return isinstance(value, str) and value.strip().lower() in _EMPTY


def _area_exists(hass: HomeAssistant, name: str) -> bool:
    areas = ar.async_get(hass)
    return areas.async_get_area_by_name(name) is not None or bool(
        areas.async_get_areas_by_alias(name)
    )


def _floor_exists(hass: HomeAssistant, name: str) -> bool:
    floors = fr.async_get(hass)
    return floors.async_get_floor_by_name(name) is not None or bool(
        floors.async_get_floors_by_alias(name)
    )
