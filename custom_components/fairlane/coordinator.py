"""The coordinator that polls the server's `/v1/stats` for the sensors, and the entry's data."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from homeassistant.config_entries import ConfigEntry
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ConfigEntryAuthFailed
from homeassistant.helpers.update_coordinator import DataUpdateCoordinator, UpdateFailed

from .client import FairlaneAuthError, FairlaneClient, FairlaneError, ServerInfo
from .const import DOMAIN, SCAN_INTERVAL
from .guess import TurnGuess

_LOGGER = logging.getLogger(__name__)


@dataclass
class FairlaneData:
    """What a loaded entry holds: the client, the server's identity and the stats."""

    client: FairlaneClient
    info: ServerInfo
    coordinator: FairlaneCoordinator
    device_id: str = ""  # the server's device in the registry, which subentries' devices name
    guess: TurnGuess | None = None  # the next spoken turn, begun on the early transcript


type FairlaneConfigEntry = ConfigEntry[FairlaneData]


class FairlaneCoordinator(DataUpdateCoordinator[dict[str, Any]]):
    """Polls `/v1/stats`; client errors become coordinator errors here and nowhere else."""

    config_entry: FairlaneConfigEntry

    def __init__(
        self, hass: HomeAssistant, entry: FairlaneConfigEntry, client: FairlaneClient
    ) -> None:
        super().__init__(
            hass,
            _LOGGER,
            config_entry=entry,
            name=DOMAIN,
            update_interval=SCAN_INTERVAL,
        )
        self.client = client

    async def _async_update_data(self) -> dict[str, Any]:
        try:
            return await self.client.stats()
        except FairlaneAuthError as err:
            raise ConfigEntryAuthFailed(
                translation_domain=DOMAIN, translation_key="invalid_auth"
            ) from err
        except FairlaneError as err:
            raise UpdateFailed(
                translation_domain=DOMAIN,
                translation_key="cannot_connect",
                translation_placeholders={"error": str(err)},
            ) from err
