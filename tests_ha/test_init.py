"""Set-up, unload, the coordinator's error mapping, sensors, diagnostics and the version check."""

from __future__ import annotations

from unittest.mock import patch

import pytest
from homeassistant.components import conversation
from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import STATE_OFF, STATE_ON, STATE_UNAVAILABLE, STATE_UNKNOWN
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import issue_registry as ir
from pytest_homeassistant_custom_component.common import MockConfigEntry
from pytest_homeassistant_custom_component.components.diagnostics import (
    get_diagnostics_for_config_entry,
)
from pytest_homeassistant_custom_component.typing import ClientSessionGenerator

from custom_components.fairlane.client import (
    FairlaneAuthError,
    FairlaneClient,
    FairlaneConnectionError,
    ServerInfo,
)
from custom_components.fairlane.const import DOMAIN
from custom_components.fairlane.sensor import SENSORS
from tests_ha.conftest import device_of, fairlane_entry


def _entity_ids(hass: HomeAssistant, entry: MockConfigEntry) -> dict[str, str]:
    """key → entity id: the server's sensors by unique-id suffix, a subentry's entity by the
    subentry's type."""
    kinds = {sub.subentry_id: sub.subentry_type for sub in entry.subentries.values()}
    return {
        kinds.get(e.unique_id) or e.unique_id.removeprefix(f"{entry.entry_id}_"): e.entity_id
        for e in er.async_entries_for_config_entry(er.async_get(hass), entry.entry_id)
    }


async def test_setup_makes_the_server_and_a_device_per_subentry_and_unloads(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    assert entry.state is ConfigEntryState.LOADED
    devices = dr.async_get(hass)
    server = device_of(hass, entry, entry.entry_id)
    assert server is not None
    assert server.manufacturer == "Fairlane" and server.sw_version == "0.1.0"
    assert server.model and "qwen" in server.model.lower()
    ids = _entity_ids(hass, entry)
    kinds = {"conversation", "stt", "tts", "ai_task_data"}
    assert set(ids) == {d.key for d in SENSORS} | {"reachable"} | kinds
    registry = er.async_get(hass)
    for key, entity_id in ids.items():
        entity = registry.async_get(entity_id)
        assert entity is not None
        if key in kinds:  # on its subentry's device, which the server serves
            device = devices.async_get(entity.device_id or "")
            assert device is not None and device.via_device_id == server.id
            assert entity.config_subentry_id == entity.unique_id
        else:
            assert entity.device_id == server.id
    assert ids["conversation"] == "conversation.fairlane"
    assert ids["tts"] == "tts.fairlane_text_to_speech"

    assert await hass.config_entries.async_unload(entry.entry_id)
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.NOT_LOADED
    assert hass.states.get(ids["reachable"]).state == STATE_UNAVAILABLE


async def test_an_entry_of_another_server_waits_with_a_repair_issue(
    hass: HomeAssistant, entry_data: dict[str, object]
) -> None:
    """The server at the address is not the entry's (its id differs): not adopted silently."""
    entry = fairlane_entry(entry_data, unique_id="the-server-this-entry-was-made-for")
    entry.add_to_hass(hass)
    await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.SETUP_RETRY
    issue = ir.async_get(hass).async_get_issue(DOMAIN, f"wrong_server_{entry.entry_id}")
    assert issue is not None and issue.translation_key == "wrong_server"


async def test_sensors_show_the_servers_stats(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    # A typed turn, so the chat lane has figures.
    await conversation.async_converse(
        hass, "Say hello.", None, Context(), agent_id="conversation.fairlane"
    )
    coordinator = entry.runtime_data.coordinator
    await coordinator.async_refresh()
    await hass.async_block_till_done()
    stats = coordinator.data
    ids = _entity_ids(hass, entry)

    chat = stats["classes"]["chat"]
    assert chat["requests"] >= 1
    assert float(hass.states.get(ids["chat_ttft_p95"]).state) == chat["ttft_ms"]["p95"]
    assert float(hass.states.get(ids["chat_itl_p95"]).state) == chat["itl_ms"]["p95"]
    assert int(hass.states.get(ids["chat_queue"]).state) == chat["waiting"] == 0
    assert hass.states.get(ids["chat_ttft_p95"]).attributes["unit_of_measurement"] == "ms"
    assert hass.states.get(ids["reachable"]).state == STATE_ON


async def test_coordinator_maps_errors_once(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    ids = _entity_ids(hass, entry)
    coordinator = entry.runtime_data.coordinator

    with patch.object(FairlaneClient, "stats", side_effect=FairlaneConnectionError("refused")):
        await coordinator.async_refresh()
        await hass.async_block_till_done()
    assert hass.states.get(ids["reachable"]).state == STATE_OFF
    assert hass.states.get(ids["chat_ttft_p95"]).state == STATE_UNAVAILABLE

    await coordinator.async_refresh()  # the server is back
    await hass.async_block_till_done()
    assert hass.states.get(ids["reachable"]).state == STATE_ON
    assert hass.states.get(ids["chat_queue"]).state != STATE_UNAVAILABLE

    # A refused token starts reauthentication.
    with patch.object(FairlaneClient, "stats", side_effect=FairlaneAuthError("bad token")):
        await coordinator.async_refresh()
        await hass.async_block_till_done()
    flows = hass.config_entries.flow.async_progress_by_handler(DOMAIN)
    assert [f["context"]["source"] for f in flows] == ["reauth"]


async def test_a_server_of_another_major_version_is_a_repair_issue(
    hass: HomeAssistant, entry_data: dict[str, object]
) -> None:
    future = ServerInfo("1.0.0", "fairlane", "model", None, None)
    entry = fairlane_entry(entry_data)
    entry.add_to_hass(hass)
    with patch.object(FairlaneClient, "health", return_value=future):
        await hass.config_entries.async_setup(entry.entry_id)
        await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.SETUP_RETRY
    issue = ir.async_get(hass).async_get_issue(DOMAIN, f"incompatible_server_{entry.entry_id}")
    assert issue is not None and issue.translation_placeholders["version"] == "1.0.0"

    # The right server: the issue goes away.
    await hass.config_entries.async_reload(entry.entry_id)
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.LOADED
    issue_id = f"incompatible_server_{entry.entry_id}"
    assert ir.async_get(hass).async_get_issue(DOMAIN, issue_id) is None


async def test_an_unreachable_server_is_retried(
    hass: HomeAssistant, entry_data: dict[str, object]
) -> None:
    entry = fairlane_entry(entry_data)
    entry.add_to_hass(hass)
    with patch.object(FairlaneClient, "health", side_effect=FairlaneConnectionError("down")):
        await hass.config_entries.async_setup(entry.entry_id)
        await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.SETUP_RETRY


async def test_diagnostics_redact_the_token(
    hass: HomeAssistant, entry: MockConfigEntry, hass_client: ClientSessionGenerator
) -> None:
    diagnostics = await get_diagnostics_for_config_entry(hass, hass_client, entry)
    assert diagnostics["entry"]["data"]["token"] == "**REDACTED**"
    assert entry.data["token"] not in str(diagnostics)
    assert diagnostics["server"]["version"] == "0.1.0"
    assert set(diagnostics["stats"]["classes"]) == {"voice", "chat", "background"}


@pytest.mark.parametrize("key", ["voice_ttft_p95", "background_progress", "chat_queue"])
async def test_sensors_have_translated_names_and_units(
    hass: HomeAssistant, entry: MockConfigEntry, key: str
) -> None:
    state = hass.states.get(_entity_ids(hass, entry)[key])
    assert state is not None and state.name.startswith("Fairlane ")
    assert state.name != "Fairlane"  # the translation was found
    if key == "chat_queue":
        assert state.attributes["unit_of_measurement"] == "requests"  # a translated unit


async def test_diagnostic_sensors_are_disabled_by_default(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    ids = _entity_ids(hass, entry)
    registry = er.async_get(hass)
    for key in ("device_busy", "chat_tokens_per_s"):
        entity = registry.async_get(ids[key])
        assert entity is not None and entity.disabled_by is er.RegistryEntryDisabler.INTEGRATION
        assert hass.states.get(ids[key]) is None


async def test_a_sensor_whose_figure_is_missing_is_unknown(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    """An older server, or a lane not in its stats: unknown, not an error in the log."""
    coordinator = entry.runtime_data.coordinator
    stats = {"classes": {"voice": {"ttft_ms": {}}, "chat": None}, "device": {}}
    with patch.object(FairlaneClient, "stats", return_value=stats):
        await coordinator.async_refresh()
        await hass.async_block_till_done()
    ids = _entity_ids(hass, entry)
    for key in ("voice_ttft_p95", "chat_queue", "speech_ttft_p95", "background_backlog"):
        assert hass.states.get(ids[key]).state == STATE_UNKNOWN, key
