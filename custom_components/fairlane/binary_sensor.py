"""Whether the server answers (available when the server does not, to say so), and whether
its remote lanes (engines on other machines, when it has any) are failing."""

from __future__ import annotations

from typing import Any

from homeassistant.components.binary_sensor import (
    BinarySensorDeviceClass,
    BinarySensorEntity,
)
from homeassistant.const import EntityCategory
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .coordinator import FairlaneConfigEntry
from .entity import FairlaneEntity

PARALLEL_UPDATES = 0


async def async_setup_entry(
    hass: HomeAssistant,
    entry: FairlaneConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    entities: list[BinarySensorEntity] = [FairlaneReachable(entry, "reachable")]
    if entry.runtime_data.coordinator.data.get("remotes"):
        entities.append(FairlaneRemoteLanes(entry, "remote_lanes"))
    async_add_entities(entities)


class FairlaneReachable(FairlaneEntity, BinarySensorEntity):
    """On while the last poll of `/v1/stats` succeeded."""

    _attr_device_class = BinarySensorDeviceClass.CONNECTIVITY
    _attr_entity_category = EntityCategory.DIAGNOSTIC
    _attr_translation_key = "reachable"

    @property
    def available(self) -> bool:
        return True

    @property
    def is_on(self) -> bool:
        return self.coordinator.last_update_success


class FairlaneRemoteLanes(FairlaneEntity, BinarySensorEntity):
    """On while a remote lane's circuit breaker is not closed: its engine failed and the
    server refuses (or probes) that lane's work. Each lane's state is an attribute."""

    _attr_device_class = BinarySensorDeviceClass.PROBLEM
    _attr_entity_category = EntityCategory.DIAGNOSTIC
    _attr_translation_key = "remote_lanes"

    @property
    def _lanes(self) -> dict[str, Any]:
        return dict(self.coordinator.data.get("remotes") or {})

    @property
    def is_on(self) -> bool:
        return any(lane.get("state") != "closed" for lane in self._lanes.values())

    @property
    def extra_state_attributes(self) -> dict[str, Any]:
        # "closed", or e.g. "open: the remote engine 'attic' failed: …"
        return {name: _describe(lane) for name, lane in self._lanes.items()}


def _describe(lane: dict[str, Any]) -> str:
    state = str(lane.get("state"))
    return f"{state}: {lane['error']}" if lane.get("error") else state
