"""Fairlane: a household's own AI on one GPU, behind one scheduler."""

from __future__ import annotations

from dataclasses import dataclass

from awesomeversion import AwesomeVersion
from homeassistant.config_entries import ConfigEntry
from homeassistant.const import CONF_HOST, CONF_PORT, CONF_TOKEN, Platform
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ConfigEntryNotReady
from homeassistant.helpers import config_validation as cv
from homeassistant.helpers import issue_registry as ir
from homeassistant.helpers.aiohttp_client import async_get_clientsession
from homeassistant.helpers.typing import ConfigType

from .client import FairlaneClient, FairlaneError, ServerInfo
from .const import DOMAIN, SUPPORTED_MAJOR
from .coordinator import FairlaneCoordinator
from .services import async_setup_services

PLATFORMS = (
    Platform.AI_TASK,
    Platform.BINARY_SENSOR,
    Platform.CONVERSATION,
    Platform.SENSOR,
    Platform.STT,
    Platform.TTS,
)
CONFIG_SCHEMA = cv.config_entry_only_config_schema(DOMAIN)


@dataclass
class FairlaneData:
    """What a loaded entry holds: the client, the server's identity and the stats."""

    client: FairlaneClient
    info: ServerInfo
    coordinator: FairlaneCoordinator


type FairlaneConfigEntry = ConfigEntry[FairlaneData]


async def async_setup(hass: HomeAssistant, config: ConfigType) -> bool:
    """Register the actions once, whatever entries exist."""
    async_setup_services(hass)
    return True


async def async_setup_entry(hass: HomeAssistant, entry: FairlaneConfigEntry) -> bool:
    """Connect to the server, check its version and token, then set up the platforms."""
    client = FairlaneClient(
        async_get_clientsession(hass),
        entry.data[CONF_HOST],
        entry.data[CONF_PORT],
        entry.data.get(CONF_TOKEN),
    )
    try:
        info = await client.health()
    except FairlaneError as err:
        raise ConfigEntryNotReady(
            translation_domain=DOMAIN,
            translation_key="cannot_connect",
            translation_placeholders={"error": str(err)},
        ) from err
    _check_version(hass, entry, info)

    coordinator = FairlaneCoordinator(hass, entry, client)
    await coordinator.async_config_entry_first_refresh()
    entry.runtime_data = FairlaneData(client, info, coordinator)
    await hass.config_entries.async_forward_entry_setups(entry, PLATFORMS)
    return True


async def async_unload_entry(hass: HomeAssistant, entry: FairlaneConfigEntry) -> bool:
    return await hass.config_entries.async_unload_platforms(entry, PLATFORMS)


def _check_version(hass: HomeAssistant, entry: ConfigEntry, info: ServerInfo) -> None:
    """A server of another major version speaks another API: say so as a repair issue."""
    issue_id = f"incompatible_server_{entry.entry_id}"
    version = AwesomeVersion(info.version)
    if version.valid and version.major is not None and int(version.major) == SUPPORTED_MAJOR:
        ir.async_delete_issue(hass, DOMAIN, issue_id)
        return
    ir.async_create_issue(
        hass,
        DOMAIN,
        issue_id,
        is_fixable=False,
        severity=ir.IssueSeverity.ERROR,
        translation_key="incompatible_server",
        translation_placeholders={"version": info.version, "supported": f"{SUPPORTED_MAJOR}.x"},
    )
    raise ConfigEntryNotReady(
        translation_domain=DOMAIN,
        translation_key="incompatible_server",
        translation_placeholders={"version": info.version, "supported": f"{SUPPORTED_MAJOR}.x"},
    )


