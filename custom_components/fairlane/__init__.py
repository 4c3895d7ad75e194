"""Fairlane: a household's own AI on one GPU, behind one scheduler."""

from __future__ import annotations

import logging
from types import MappingProxyType
from typing import Any

from awesomeversion import AwesomeVersion
from homeassistant.config_entries import ConfigEntry, ConfigSubentry
from homeassistant.const import CONF_HOST, CONF_LLM_HASS_API, CONF_PORT, CONF_TOKEN, Platform
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ConfigEntryNotReady
from homeassistant.helpers import config_validation as cv
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import issue_registry as ir
from homeassistant.helpers import llm
from homeassistant.helpers.aiohttp_client import async_get_clientsession
from homeassistant.helpers.typing import ConfigType

from .client import FairlaneClient, FairlaneError, ServerInfo
from .const import (
    CONF_AI_TASK_CLASS,
    CONF_CHAT_CLASS,
    CONF_MAX_HISTORY,
    CONF_MAX_TOKENS,
    CONF_PROMPT,
    CONF_TEMPERATURE,
    DEFAULT_AI_TASK_NAME,
    DEFAULT_CONVERSATION_NAME,
    DEFAULT_STT_NAME,
    DEFAULT_TTS_NAME,
    DOMAIN,
    SUBENTRY_AI_TASK,
    SUBENTRY_CONVERSATION,
    SUBENTRY_STT,
    SUBENTRY_TTS,
    SUPPORTED_MAJOR,
)
from .coordinator import FairlaneConfigEntry, FairlaneCoordinator, FairlaneData
from .entity import device_info
from .guess import TurnGuess
from .llm_api import DocumentsAPI
from .services import async_setup_services

__all__ = ["FairlaneConfigEntry", "FairlaneData"]

_LOGGER = logging.getLogger(__name__)

PLATFORMS = (
    Platform.AI_TASK,
    Platform.BINARY_SENSOR,
    Platform.CONVERSATION,
    Platform.SENSOR,
    Platform.STT,
    Platform.TTS,
)
CONFIG_SCHEMA = cv.config_entry_only_config_schema(DOMAIN)


async def async_setup(hass: HomeAssistant, config: ConfigType) -> bool:
    """The actions and the household documents' LLM API, once, whatever entries exist."""
    async_setup_services(hass)
    llm.async_register_api(hass, DocumentsAPI(hass))
    return True


async def async_setup_entry(hass: HomeAssistant, entry: FairlaneConfigEntry) -> bool:
    """Connect to the server, check it is this entry's server, its version and token, then
    set up the platforms."""
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
    _check_identity(hass, entry, info)
    _check_version(hass, entry, info)

    coordinator = FairlaneCoordinator(hass, entry, client)
    await coordinator.async_config_entry_first_refresh()
    entry.runtime_data = FairlaneData(client, info, coordinator)
    entry.runtime_data.guess = TurnGuess(client, "speculative_turns" in info.features)
    # The server's device first: each subentry's device names it as the one it is served by.
    server = dr.async_get(hass).async_get_or_create(
        config_entry_id=entry.entry_id, **device_info(entry)
    )
    entry.runtime_data.device_id = server.id
    await hass.config_entries.async_forward_entry_setups(entry, PLATFORMS)
    # A subentry added, changed or removed: load the entities anew.
    entry.async_on_unload(entry.add_update_listener(_async_reload))
    return True


async def async_unload_entry(hass: HomeAssistant, entry: FairlaneConfigEntry) -> bool:
    return await hass.config_entries.async_unload_platforms(entry, PLATFORMS)


async def _async_reload(hass: HomeAssistant, entry: FairlaneConfigEntry) -> None:
    hass.config_entries.async_schedule_reload(entry.entry_id)


def _check_identity(hass: HomeAssistant, entry: ConfigEntry, info: ServerInfo) -> None:
    """The server at the entry's address must be the entry's server (its instance id).

    An entry made before servers had ids takes the id of the server it finds. Another server
    at the address (its data directory was reset, or the address went to another machine)
    is not adopted silently: a repair issue says what happened and the entry waits.
    """
    issue_id = f"wrong_server_{entry.entry_id}"
    if info.instance_id is None or entry.unique_id == info.instance_id:
        ir.async_delete_issue(hass, DOMAIN, issue_id)
        return
    taken = hass.config_entries.async_entry_for_domain_unique_id(DOMAIN, info.instance_id)
    if entry.unique_id is None and taken is None:
        hass.config_entries.async_update_entry(entry, unique_id=info.instance_id)
        return
    placeholders = {"host": f"{entry.data[CONF_HOST]}:{entry.data[CONF_PORT]}"}
    _not_ready(hass, issue_id, "wrong_server", placeholders)


def _check_version(hass: HomeAssistant, entry: ConfigEntry, info: ServerInfo) -> None:
    """A server of another major version speaks another API: say so as a repair issue."""
    issue_id = f"incompatible_server_{entry.entry_id}"
    version = AwesomeVersion(info.version)
    if version.valid and version.major is not None and int(version.major) == SUPPORTED_MAJOR:
        ir.async_delete_issue(hass, DOMAIN, issue_id)
        return
    placeholders = {"version": info.version, "supported": f"{SUPPORTED_MAJOR}.x"}
    _not_ready(hass, issue_id, "incompatible_server", placeholders)


def _not_ready(hass: HomeAssistant, issue_id: str, key: str, placeholders: dict[str, str]) -> None:
    """A repair issue that says what is wrong, and the entry waits (set-up is retried)."""
    ir.async_create_issue(
        hass,
        DOMAIN,
        issue_id,
        is_fixable=False,
        severity=ir.IssueSeverity.ERROR,
        translation_key=key,
        translation_placeholders=placeholders,
    )
    raise ConfigEntryNotReady(
        translation_domain=DOMAIN, translation_key=key, translation_placeholders=placeholders
    )


# --- version 1 → 2: the options become subentries ----------------------------------------------

# Version 1 kept the agent's and the AI task's settings in the entry's options, and made one
# conversation, AI task, speech-to-text and text-to-speech entity per entry (unique id
# "<entry_id>_<key>"). Version 2 makes each of them a subentry with its own device; the
# entities keep their entity ids (pipelines and automations name them), moved to their
# subentry. Unique ids of entries from the add-on's discovery were the discovery's id; they
# are cleared here, and the next start takes the server's instance id (`_check_identity`).
_AGENT_KEYS = (CONF_PROMPT, CONF_LLM_HASS_API, CONF_MAX_HISTORY, CONF_MAX_TOKENS, CONF_TEMPERATURE)
_TASK_KEYS = (CONF_MAX_TOKENS, CONF_TEMPERATURE)


def default_subentries(
    options: dict[str, Any], stt: bool = True, tts: bool = True
) -> list[tuple[str, str, dict[str, Any]]]:
    """(type, title, data) of the subentries a new entry gets (or a version 1 entry becomes)."""
    agent = {key: options[key] for key in _AGENT_KEYS if key in options}
    agent[CONF_CHAT_CLASS] = options.get(CONF_CHAT_CLASS, "auto")
    task = {key: options[key] for key in _TASK_KEYS if key in options}
    task[CONF_AI_TASK_CLASS] = options.get(CONF_AI_TASK_CLASS, "auto")
    subentries = [
        (SUBENTRY_CONVERSATION, DEFAULT_CONVERSATION_NAME, agent),
        (SUBENTRY_AI_TASK, DEFAULT_AI_TASK_NAME, task),
    ]
    if stt:
        subentries.append((SUBENTRY_STT, DEFAULT_STT_NAME, {}))
    if tts:
        subentries.append((SUBENTRY_TTS, DEFAULT_TTS_NAME, {}))
    return subentries


# The version 1 entity of each subentry type: (domain, unique id suffix).
_V1_ENTITIES = {
    SUBENTRY_CONVERSATION: ("conversation", "conversation"),
    SUBENTRY_AI_TASK: ("ai_task", "ai_task"),
    SUBENTRY_STT: ("stt", "stt"),
    SUBENTRY_TTS: ("tts", "tts"),
}


async def async_migrate_entry(hass: HomeAssistant, entry: ConfigEntry) -> bool:
    if entry.version > 2:
        return False  # a downgrade from a future version
    if entry.version == 1:
        registry = er.async_get(hass)
        for kind, title, data in default_subentries(dict(entry.options)):
            subentry = ConfigSubentry(
                data=MappingProxyType(data), subentry_type=kind, title=title, unique_id=None
            )
            hass.config_entries.async_add_subentry(entry, subentry)
            domain, suffix = _V1_ENTITIES[kind]
            entity_id = registry.async_get_entity_id(domain, DOMAIN, f"{entry.entry_id}_{suffix}")
            if entity_id is not None:
                registry.async_update_entity(
                    entity_id,
                    config_subentry_id=subentry.subentry_id,
                    new_unique_id=subentry.subentry_id,
                )
        unique_id = None if entry.source == "hassio" else entry.unique_id
        hass.config_entries.async_update_entry(
            entry, options={}, unique_id=unique_id, version=2, minor_version=1
        )
        _LOGGER.info("Moved the settings of %s into subentries", entry.title)
    return True
