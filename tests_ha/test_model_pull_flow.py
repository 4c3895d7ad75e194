"""A model pulled onto the server from the conversation agent's reconfigure step, with the
pull's progress shown in the flow, against a real server pulling from a local stand-in for the
hub (tests/hub/standin.py); and a pull that fails says why."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import EVENT_DATA_ENTRY_FLOW_PROGRESS_UPDATE, FlowResultType
from pytest_homeassistant_custom_component.common import MockConfigEntry
from tests.hub.standin import Hub

from custom_components.fairlane import config_flow
from custom_components.fairlane.const import SUBENTRY_CONVERSATION
from tests_ha.conftest import RunningServer, fairlane_entry, running_server, subentry

# A catalogue model the stand-in serves (its bytes are not a model: a pull does not load it).
MODEL = "qwen2.5-1.5b-instruct"
REPO, FILE = "Qwen/Qwen2.5-1.5B-Instruct-GGUF", "qwen2.5-1.5b-instruct-q4_k_m.gguf"


@pytest.fixture
def hub(tmp_path: Path, socket_enabled: None) -> Iterator[Hub]:
    served = tmp_path / "served.gguf"
    served.write_bytes(os.urandom(12 * 1024 * 1024))
    with Hub() as running:
        running.add(REPO, FILE, served)
        yield running


@pytest.fixture
def pulling_server(
    hub: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, socket_enabled: None
) -> Iterator[RunningServer]:
    """A server of its own that pulls from the stand-in into a model folder of its own."""
    models = tmp_path / "models"
    models.mkdir()
    default = Path.home() / ".cache" / "fairlane" / "models"
    for packaged in default.glob("*"):  # the packaged models, not assembled again
        (models / packaged.name).symlink_to(packaged)
    monkeypatch.setenv("FAIRLANE_MODEL_DIR", str(models))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setattr(config_flow, "PULL_POLL_S", 0.05)
    data = tmp_path / "data"
    data.mkdir()
    with running_server(data, "stt: {enabled: false}\ntts: {enabled: false}\n"
                              "embed: {enabled: false}\n") as server:
        yield server


async def _reconfigure(hass: HomeAssistant, server: RunningServer) -> tuple[MockConfigEntry,
                                                                             dict[str, object]]:
    entry = fairlane_entry({"host": server.host, "port": server.port, "token": server.token})
    entry.add_to_hass(hass)
    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    agent = subentry(entry, SUBENTRY_CONVERSATION)
    result = await entry.start_subentry_reconfigure_flow(hass, agent.subentry_id)
    return entry, dict(result)


async def test_a_catalogue_model_is_pulled_with_its_progress_in_the_flow(
    hass: HomeAssistant, hub: Hub, pulling_server: RunningServer
) -> None:
    entry, result = await _reconfigure(hass, pulling_server)
    schema = result["data_schema"].schema  # type: ignore[attr-defined]
    field = next(k for k in schema if str(k) == config_flow.CONF_PULL_MODEL)
    offered = [o["value"] for o in schema[field].config["options"]]
    assert MODEL in offered and "qwen2.5-coder-0.5b-instruct" not in offered  # here already
    hub.slow = True
    seen: list[float] = []  # the progress the flow reports, as the frontend hears it
    hass.bus.async_listen(EVENT_DATA_ENTRY_FLOW_PROGRESS_UPDATE,
                          lambda event: seen.append(float(event.data["progress"])))
    result = dict(await hass.config_entries.subentries.async_configure(
        str(result["flow_id"]), {config_flow.CONF_PULL_MODEL: MODEL, "max_history": 3}))
    assert result["type"] is FlowResultType.SHOW_PROGRESS and result["step_id"] == "pull"
    flow_id = str(result["flow_id"])
    while result["type"] is FlowResultType.SHOW_PROGRESS:
        await hass.async_block_till_done(wait_background_tasks=True)
        result = dict(await hass.config_entries.subentries.async_configure(flow_id))
    assert result["type"] is FlowResultType.FORM and result["step_id"] == "pull_done"
    result = dict(await hass.config_entries.subentries.async_configure(flow_id, {}))
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reconfigure_successful"
    await hass.async_block_till_done()
    assert subentry(entry, SUBENTRY_CONVERSATION).data["max_history"] == 3
    assert (Path(os.environ["FAIRLANE_MODEL_DIR"]) / "hub" / REPO / FILE).exists()
    assert seen and 0 < max(seen) <= 1  # the bar moved


async def test_a_pull_that_fails_says_why(
    hass: HomeAssistant, hub: Hub, pulling_server: RunningServer
) -> None:
    hub.corrupt = True
    _, result = await _reconfigure(hass, pulling_server)
    flow_id = str(result["flow_id"])
    result = dict(await hass.config_entries.subentries.async_configure(
        flow_id, {config_flow.CONF_PULL_MODEL: MODEL}))
    while result["type"] is FlowResultType.SHOW_PROGRESS:
        await hass.async_block_till_done(wait_background_tasks=True)
        result = dict(await hass.config_entries.subentries.async_configure(flow_id))
    assert result["type"] is FlowResultType.ABORT and result["reason"] == "pull_failed"
    assert "sha256" in str(result["description_placeholders"]["error"])  # type: ignore[index]
