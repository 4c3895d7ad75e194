"""Tool arguments that can only name what this home has.

A small model asked to "lock the smart lock" wrote `HassTurnOn{domain: ["binary_sensor"]}`;
asked to "turn on the Backyard light" it wrote a name no entity has. Each such call fails. The
server samples a tool call under a grammar of the tool's JSON schema, so the integration writes
the home into the schema: the target slots of Assist's intents (`name`, `area`, `floor`,
`domain`) become enums of the names, aliases, areas, floors and domains of the entities
exposed to Assist, as Home Assistant's own to-do and calendar tools already list their lists'
names. A call can then only name what exists; which of them is still the model's choice.
An intent that acts (all but the `HassGet…` queries) names only entities of domains that have
actions: a lock's binary sensor, which shares the lock's name, cannot be locked.

A target slot the home has nothing for is taken out of the schema: in a home with no floors
the model filled `floor` with an area's name, and every such call failed. A slot is left free
where the home has more than MAX_WORDS for it (a very large home: the grammar and the prompt
grow with the list), and every other slot (a timer's name, an item for a list, a brightness)
as the intent declares it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from homeassistant.components import conversation
from homeassistant.components.homeassistant.exposed_entities import async_should_expose
from homeassistant.core import HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import floor_registry as fr

from .tool_args import aliases_of

MAX_WORDS = 300  # names, areas or floors an enum may list
TODO = "todo"


@dataclass(frozen=True)
class HomeWords:
    """What the exposed part of the home is called."""

    names: tuple[str, ...]  # entities' names and aliases
    areas: tuple[str, ...]  # areas' names and aliases
    floors: tuple[str, ...]
    domains: tuple[str, ...]
    lists: tuple[str, ...]  # to-do lists' names and aliases
    acting_names: tuple[str, ...]  # of entities whose domain has actions (services)
    acting_domains: tuple[str, ...]


def home_words(hass: HomeAssistant) -> HomeWords:
    """The names of the entities exposed to Assist, their areas, floors and domains."""
    entities = er.async_get(hass)
    names: dict[str, None] = {}  # ordered sets
    lists: dict[str, None] = {}
    domains: dict[str, None] = {}
    acting_names: dict[str, None] = {}
    acting_domains: dict[str, None] = {}
    for state in sorted(hass.states.async_all(), key=lambda s: s.name):
        if not async_should_expose(hass, conversation.DOMAIN, state.entity_id):
            continue
        entry = entities.async_get(state.entity_id)
        called = [state.name, *aliases_of(entry)]
        names.update(dict.fromkeys(called))
        if state.domain == TODO:
            lists.update(dict.fromkeys(called))
        domains[state.domain] = None
        if hass.services.async_services_for_domain(state.domain):
            acting_names.update(dict.fromkeys(called))
            acting_domains[state.domain] = None
    areas: dict[str, None] = {}
    for area in ar.async_get(hass).async_list_areas():
        areas.update(dict.fromkeys([area.name, *aliases_of(area)]))
    floors: dict[str, None] = {}
    for floor in fr.async_get(hass).async_list_floors():
        floors.update(dict.fromkeys([floor.name, *aliases_of(floor)]))
    return HomeWords(
        tuple(n for n in names if n), tuple(areas), tuple(floors), tuple(domains),
        tuple(lists), tuple(n for n in acting_names if n), tuple(acting_domains),
    )


def constrain(parameters: dict[str, Any], words: HomeWords, tool: str) -> dict[str, Any]:
    """An intent tool's JSON schema with its target slots limited to this home's words."""
    properties = parameters.get("properties")
    if not isinstance(properties, dict):
        return parameters
    query = tool.startswith("HassGet")  # a question: any entity; else one that can act
    names, domains = (words.names, words.domains) if query else (
        words.acting_names, words.acting_domains)
    # A list's intents (HassListAddItem, ...) name a to-do list; the others an entity, where
    # they target one (a timer's `name` is the person's to choose).
    targets_entities = bool({"area", "domain"} & properties.keys())
    choices = {
        "name": words.lists if "item" in properties else names if targets_entities else (),
        "area": words.areas,
        "floor": words.floors,
        "domain": domains,
    }
    # New dicts, never the slots' own: the serializer may share one schema among slots.
    slots = dict(properties)
    for slot, allowed in choices.items():
        schema = slots.get(slot)
        if not isinstance(schema, dict) or len(allowed) > MAX_WORDS:
            continue
        if not allowed:
            if slot in ("area", "floor"):  # nothing here could match: the slot goes
                del slots[slot]
            continue
        if schema.get("type") == "array" and isinstance(schema.get("items"), dict):
            slots[slot] = {**schema, "items": {**schema["items"], "enum": list(allowed)}}
        elif schema.get("type") == "string":
            slots[slot] = {**schema, "enum": list(allowed)}
    required = parameters.get("required")
    if isinstance(required, list):
        return {**parameters, "properties": slots,
                "required": [name for name in required if name in slots]}
    return {**parameters, "properties": slots}
