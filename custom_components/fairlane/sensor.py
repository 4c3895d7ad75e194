"""Sensors: what each lane feels like (TTFT, ITL, queue, tokens/s) and what the device does."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from homeassistant.components.sensor import (
    SensorDeviceClass,
    SensorEntity,
    SensorEntityDescription,
    SensorStateClass,
)
from homeassistant.const import PERCENTAGE, EntityCategory, UnitOfTime
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .const import CLASSES
from .coordinator import FairlaneConfigEntry
from .entity import FairlaneEntity

PARALLEL_UPDATES = 0

type Stats = dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class FairlaneSensorDescription(SensorEntityDescription):
    """A sensor and how to read its value from `/v1/stats`."""

    value: Callable[[Stats], float | int | None]


def _lane(name: str) -> Callable[[Stats], dict[str, Any]]:
    return lambda stats: stats["classes"][name]


def _lane_sensors(name: str) -> tuple[FairlaneSensorDescription, ...]:
    """The four figures every lane has; p95 over the server's window (5 minutes)."""
    lane = _lane(name)
    return (
        FairlaneSensorDescription(
            key=f"{name}_ttft_p95",
            translation_key=f"{name}_ttft_p95",
            device_class=SensorDeviceClass.DURATION,
            native_unit_of_measurement=UnitOfTime.MILLISECONDS,
            state_class=SensorStateClass.MEASUREMENT,
            suggested_display_precision=0,
            value=lambda stats: lane(stats)["ttft_ms"]["p95"],
        ),
        FairlaneSensorDescription(
            key=f"{name}_itl_p95",
            translation_key=f"{name}_itl_p95",
            device_class=SensorDeviceClass.DURATION,
            native_unit_of_measurement=UnitOfTime.MILLISECONDS,
            state_class=SensorStateClass.MEASUREMENT,
            suggested_display_precision=0,
            value=lambda stats: lane(stats)["itl_ms"]["p95"],
        ),
        FairlaneSensorDescription(
            key=f"{name}_queue",
            translation_key=f"{name}_queue",
            state_class=SensorStateClass.MEASUREMENT,
            value=lambda stats: lane(stats)["waiting"],
        ),
        FairlaneSensorDescription(
            key=f"{name}_tokens_per_s",
            translation_key=f"{name}_tokens_per_s",
            state_class=SensorStateClass.MEASUREMENT,
            suggested_display_precision=1,
            entity_category=EntityCategory.DIAGNOSTIC,
            entity_registry_enabled_default=False,
            value=lambda stats: lane(stats)["output_tokens_per_s"],
        ),
    )


def _indexing(stats: Stats) -> dict[str, Any]:
    return (stats.get("background") or {}).get("indexing") or {}


def _progress(stats: Stats) -> float | None:
    indexing = _indexing(stats)
    total = indexing.get("chunks_total")
    if not total:
        return None  # nothing was ever given to index
    return round(100 * float(indexing["chunks_done"]) / float(total), 1)


def _backlog(stats: Stats) -> int | None:
    indexing = _indexing(stats)
    if "chunks_total" not in indexing:
        return None
    return int(indexing["chunks_total"] - indexing["chunks_done"])


SENSORS: tuple[FairlaneSensorDescription, ...] = (
    *(description for name in CLASSES for description in _lane_sensors(name)),
    FairlaneSensorDescription(
        key="speech_ttft_p95",
        translation_key="speech_ttft_p95",
        device_class=SensorDeviceClass.DURATION,
        native_unit_of_measurement=UnitOfTime.MILLISECONDS,
        state_class=SensorStateClass.MEASUREMENT,
        suggested_display_precision=0,
        # Speech-to-text's TTFT: end of the utterance → its transcript, in the voice lane.
        value=lambda stats: stats["classes"]["voice"]["stt"]["ttft_ms"]["p95"],
    ),
    FairlaneSensorDescription(
        key="background_backlog",
        translation_key="background_backlog",
        state_class=SensorStateClass.MEASUREMENT,
        value=_backlog,
    ),
    FairlaneSensorDescription(
        key="background_progress",
        translation_key="background_progress",
        state_class=SensorStateClass.MEASUREMENT,
        native_unit_of_measurement=PERCENTAGE,
        value=_progress,
    ),
    FairlaneSensorDescription(
        key="device_busy",
        translation_key="device_busy",
        state_class=SensorStateClass.MEASUREMENT,
        native_unit_of_measurement=PERCENTAGE,
        suggested_display_precision=0,
        entity_category=EntityCategory.DIAGNOSTIC,
        entity_registry_enabled_default=False,
        value=lambda stats: round(100 * stats["device"]["busy"], 1),
    ),
)


async def async_setup_entry(
    hass: HomeAssistant,
    entry: FairlaneConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    async_add_entities(FairlaneSensor(entry, description) for description in SENSORS)


class FairlaneSensor(FairlaneEntity, SensorEntity):
    """One figure from the server's stats."""

    entity_description: FairlaneSensorDescription

    def __init__(self, entry: FairlaneConfigEntry, description: FairlaneSensorDescription) -> None:
        super().__init__(entry, description.key)
        self.entity_description = description

    @property
    def native_value(self) -> float | int | None:
        """The figure, or unknown when this server's stats do not have it (an older server,
        a lane that has not served anything yet, a component that is switched off)."""
        try:
            value = self.entity_description.value(self.coordinator.data)
        except (KeyError, TypeError, AttributeError, ValueError):
            return None
        return value if isinstance(value, int | float) else None
