"""Repairs for the tool calls of small models, before Home Assistant runs them.

A 0.5B model calling Assist's `HassTurnOn` for "turn on the kitchen light" tends to fill
every optional slot it was shown: `{"name": "Kitchen light", "area": "Kitchen",
"floor": "None", "device_class": ["outlet"]}`. Each guessed filter that matches nothing in
this home makes the whole call fail. When the model named the entity, the name is what
identifies it, so filters that cannot be right are dropped: an area or floor that does not
exist or holds no entity of that name (`{"name": "Dining Room Light", "area": "Kitchen"}`),
a domain none of them has; without a name nothing is widened (dropping an area there could
switch on every light in the house).

Given the person's words, a target the model filled in that they did not say gives way to one
they did: "turn on the Backyard light" came back as `{"name": "Bedroom 4 Light", "area":
"Backyard"}` (the model, shown the home's names, fills every slot), and the name they never
said goes; "dining room light off" as `{"name": "Dining Room Light", "area": "Kitchen"}`, and
the area goes. Where both or neither were said, the name stands. A call that targets nothing
("set the smart curtain to 50%" came back as `{"position": 50}`, which Home Assistant refuses:
it cannot target all devices) gets the entity, or else the area, the person named. A call
that targets a place but no entity and no domain gets the domains the intent acts on (its
handler's `platforms`, where it declares them): "set the living room curtains to 50%" came
back as `{"area": "Living Room", "position": 50}`, and Home Assistant tried the area's
sensors too and failed.

Only Assist's intent tools get this, and only their targeting slots: a script's fields, a
shopping list item called "None" and other APIs' tools are passed on as the model wrote them.
"""

from __future__ import annotations

from typing import Any

from homeassistant.components import conversation
from homeassistant.components.homeassistant.exposed_entities import async_should_expose
from homeassistant.core import HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import floor_registry as fr

# What small models write for "no value".
_EMPTY = ("", "none", "null", "n/a", "unknown")
# The slots of Assist's intents that pick the target: the only ones repaired.
TARGET_SLOTS = frozenset({"name", "area", "floor", "domain", "device_class"})


def repair_args(
    hass: HomeAssistant,
    args: dict[str, Any],
    said: str | None = None,
    slots: frozenset[str] = frozenset(),
    platforms: frozenset[str] | None = None,
) -> dict[str, Any]:
    """An intent's `args` without empty target slots and, when an entity is named, without
    target filters that cannot match; `said`: the person's words this turn, `slots`: the
    intent's own (a target is only added where it has `name` and `area`), `platforms`: the
    domains its handler acts on, where it declares them."""
    args = {k: v for k, v in args.items() if k not in TARGET_SLOTS or not _empty(v)}
    if said is not None and {"name", "area"} <= slots and not (
        {"name", "area", "floor"} & args.keys()
    ):
        args.update(_target_in(hass, said))
    if said is not None and isinstance(args.get("name"), str) and not _in(args["name"], said):
        places = [args.get(slot) for slot in ("area", "floor")]
        if any(isinstance(place, str) and _in(place, said) for place in places):
            del args["name"]  # a guess beside a place they named: the place is the target
    if (
        platforms
        and "domain" in slots
        and "name" not in args
        and not args.get("domain")
        and {"area", "floor"} & args.keys()
    ):
        args["domain"] = sorted(platforms)
    if "name" not in args:
        return args
    if isinstance(args.get("area"), str) and not _area_exists(hass, args["area"]):
        del args["area"]
    if isinstance(args.get("floor"), str) and not _floor_exists(hass, args["floor"]):
        del args["floor"]
    # A named entity needs no class filter, and a guessed one (lights have none) only fails.
    args.pop("device_class", None)
    named = _named(hass, args["name"]) if isinstance(args["name"], str) else []
    if named:
        if isinstance(args.get("area"), str) and not any(
            _called(args["area"], where.areas) for where in named
        ):
            del args["area"]
        if isinstance(args.get("floor"), str) and not any(
            _called(args["floor"], where.floors) for where in named
        ):
            del args["floor"]
        domains = args.get("domain")
        listed = [domains] if isinstance(domains, str) else domains
        if isinstance(listed, list) and not any(where.domain in listed for where in named):
            del args["domain"]
    return args


class _Where:
    """An exposed entity's domain, and the names of its area and floor (with aliases)."""

    def __init__(self, domain: str, areas: list[str], floors: list[str]) -> None:
        self.domain, self.areas, self.floors = domain, areas, floors


def _named(hass: HomeAssistant, name: str) -> list[_Where]:
    """Where the exposed entities called `name` (their name or an alias) are."""
    entities, devices = er.async_get(hass), dr.async_get(hass)
    areas, floors = ar.async_get(hass), fr.async_get(hass)
    found = []
    for state in hass.states.async_all():
        entry = entities.async_get(state.entity_id)
        called = [state.name, *aliases_of(entry)]
        if not _called(name, called) or not async_should_expose(
            hass, conversation.DOMAIN, state.entity_id
        ):
            continue
        area_id = entry.area_id if entry is not None else None
        if area_id is None and entry is not None and entry.device_id is not None:
            device = devices.async_get(entry.device_id)
            area_id = device.area_id if device is not None else None
        area = areas.async_get_area(area_id) if area_id is not None else None
        floor = floors.async_get_floor(area.floor_id) if area and area.floor_id else None
        found.append(_Where(
            state.domain,
            [area.name, *aliases_of(area)] if area else [],
            [floor.name, *aliases_of(floor)] if floor else [],
        ))
    return found


def _target_in(hass: HomeAssistant, said: str) -> dict[str, str]:
    """The exposed entity the person's words name (the longest name or alias in them), else
    the area they name; {} if neither."""
    entities = er.async_get(hass)
    names: list[str] = []
    for state in hass.states.async_all():
        if async_should_expose(hass, conversation.DOMAIN, state.entity_id):
            entry = entities.async_get(state.entity_id)
            names += [state.name, *aliases_of(entry)]
    if found := _longest_in(names, said):
        return {"name": found}
    areas = [n for a in ar.async_get(hass).async_list_areas() for n in (a.name, *aliases_of(a))]
    if found := _longest_in(areas, said):
        return {"area": found}
    return {}


def _longest_in(names: list[str], said: str) -> str | None:
    inside = [name for name in names if name.strip() and _in(name, said)]
    return max(inside, key=len) if inside else None


def aliases_of(entry: Any) -> list[str]:
    """A registry entry's aliases that are words: since 2026.11 an entity's may also hold a
    marker standing for its own name (which is counted already)."""
    return sorted(a for a in getattr(entry, "aliases", None) or () if isinstance(a, str))


def _in(value: str, words: str) -> bool:
    """Whether the person's words hold this value (case and spacing aside)."""
    return " ".join(value.casefold().split()) in " ".join(words.casefold().split())


def _called(name: str, names: list[str]) -> bool:
    wanted = name.strip().casefold()
    return any(wanted == other.strip().casefold() for other in names)


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
