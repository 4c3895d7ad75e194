"""Diagnostics: the entry and its subentries (token redacted), what the server says about
itself, its stats."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from homeassistant.components.diagnostics import async_redact_data
from homeassistant.const import CONF_TOKEN
from homeassistant.core import HomeAssistant

from .coordinator import FairlaneConfigEntry

TO_REDACT = {CONF_TOKEN}


async def async_get_config_entry_diagnostics(
    hass: HomeAssistant, entry: FairlaneConfigEntry
) -> dict[str, Any]:
    data = entry.runtime_data
    return {
        "entry": {
            "data": async_redact_data(dict(entry.data), TO_REDACT),
            "subentries": [
                {"type": sub.subentry_type, "title": sub.title, "data": dict(sub.data)}
                for sub in entry.subentries.values()
            ],
        },
        "server": asdict(data.info),
        "stats": data.coordinator.data,
    }
