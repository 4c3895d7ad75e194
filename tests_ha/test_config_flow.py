"""The config flow, reauth, reconfigure and options, against the real server."""

from __future__ import annotations

from homeassistant import config_entries
from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import CONF_HOST, CONF_LLM_HASS_API, CONF_PORT, CONF_TOKEN
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import llm
from homeassistant.helpers.service_info.hassio import HassioServiceInfo
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.fairlane.const import CONF_CHAT_CLASS, CONF_MAX_HISTORY, DOMAIN
from tests_ha.conftest import RunningServer


async def _closed_port(hass: HomeAssistant) -> int:
    """A port on 127.0.0.1 where nothing listens."""
    server = await hass.loop.create_server(lambda: None, "127.0.0.1", 0)  # type: ignore[arg-type,return-value]
    port = int(server.sockets[0].getsockname()[1])
    server.close()
    await server.wait_closed()
    return port


async def test_user_flow_tests_the_server_and_its_token(
    hass: HomeAssistant, fairlane_server: RunningServer
) -> None:
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    assert result["type"] is FlowResultType.FORM and result["errors"] == {}

    # Nothing listening → cannot_connect; a wrong token → invalid_auth; then it works.
    closed = await _closed_port(hass)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_HOST: "127.0.0.1", CONF_PORT: closed, CONF_TOKEN: "x"}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": "cannot_connect"}

    server = {CONF_HOST: fairlane_server.host, CONF_PORT: fairlane_server.port}
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {**server, CONF_TOKEN: "not-the-token"}
    )
    assert result["errors"] == {"base": "invalid_auth"}
    result = await hass.config_entries.flow.async_configure(result["flow_id"], server)
    assert result["errors"] == {"base": "invalid_auth"}  # no token at all

    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {**server, CONF_TOKEN: fairlane_server.token}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["data"] == {**server, CONF_TOKEN: fairlane_server.token}
    assert result["options"][CONF_LLM_HASS_API] == [llm.LLM_API_ASSIST]
    await hass.async_block_till_done()
    entry = hass.config_entries.async_entries(DOMAIN)[0]
    assert entry.state is ConfigEntryState.LOADED

    # The same server twice is refused.
    again = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    again = await hass.config_entries.flow.async_configure(
        again["flow_id"], {**server, CONF_TOKEN: fairlane_server.token}
    )
    assert again["type"] is FlowResultType.ABORT and again["reason"] == "already_configured"


async def test_hassio_discovery_creates_the_entry_once(
    hass: HomeAssistant, fairlane_server: RunningServer
) -> None:
    info = HassioServiceInfo(
        config={
            "host": fairlane_server.host,
            "port": fairlane_server.port,
            "token": fairlane_server.token,
        },
        name="Fairlane",
        slug="fairlane",
        uuid="1234abcd",
    )
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_HASSIO}, data=info
    )
    assert result["type"] is FlowResultType.FORM and result["step_id"] == "hassio_confirm"
    result = await hass.config_entries.flow.async_configure(result["flow_id"], {})
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["result"].unique_id == "1234abcd"
    assert result["data"][CONF_TOKEN] == fairlane_server.token
    await hass.async_block_till_done()

    # The add-on announces itself again (a restart): nothing new, the entry is kept.
    again = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_HASSIO}, data=info
    )
    assert again["type"] is FlowResultType.ABORT and again["reason"] == "already_configured"
    assert len(hass.config_entries.async_entries(DOMAIN)) == 1


async def test_a_refused_token_starts_reauth_and_the_new_token_loads_the_entry(
    hass: HomeAssistant, fairlane_server: RunningServer
) -> None:
    entry = MockConfigEntry(
        domain=DOMAIN,
        data={CONF_HOST: fairlane_server.host, CONF_PORT: fairlane_server.port,
              CONF_TOKEN: "old-token"},
    )
    entry.add_to_hass(hass)
    await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.SETUP_ERROR

    [flow] = hass.config_entries.flow.async_progress()
    assert flow["context"]["source"] == config_entries.SOURCE_REAUTH
    result = await hass.config_entries.flow.async_configure(
        flow["flow_id"], {CONF_TOKEN: "still-wrong"}
    )
    assert result["errors"] == {"base": "invalid_auth"}
    result = await hass.config_entries.flow.async_configure(
        flow["flow_id"], {CONF_TOKEN: fairlane_server.token}
    )
    assert result["type"] is FlowResultType.ABORT and result["reason"] == "reauth_successful"
    await hass.async_block_till_done()
    assert entry.data[CONF_TOKEN] == fairlane_server.token
    assert entry.state is ConfigEntryState.LOADED


async def test_reconfigure_moves_the_entry_to_another_address(
    hass: HomeAssistant, entry: MockConfigEntry, fairlane_server: RunningServer
) -> None:
    result = await entry.start_reconfigure_flow(hass)
    assert result["type"] is FlowResultType.FORM and result["step_id"] == "reconfigure"
    closed = await _closed_port(hass)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"],
        {CONF_HOST: "127.0.0.1", CONF_PORT: closed, CONF_TOKEN: fairlane_server.token},
    )
    assert result["errors"] == {"base": "cannot_connect"}
    new = {CONF_HOST: "127.0.0.1", CONF_PORT: fairlane_server.port, CONF_TOKEN: "renewed"}
    result = await hass.config_entries.flow.async_configure(result["flow_id"], new)
    assert result["errors"] == {"base": "invalid_auth"}
    new[CONF_TOKEN] = fairlane_server.token
    result = await hass.config_entries.flow.async_configure(result["flow_id"], new)
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reconfigure_successful"
    await hass.async_block_till_done()
    assert dict(entry.data) == new and entry.state is ConfigEntryState.LOADED


async def test_options_set_the_agent_and_reload(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    result = await hass.config_entries.options.async_init(entry.entry_id)
    assert result["type"] is FlowResultType.FORM
    result = await hass.config_entries.options.async_configure(
        result["flow_id"],
        {CONF_MAX_HISTORY: 3, CONF_CHAT_CLASS: "chat", CONF_LLM_HASS_API: []},
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    await hass.async_block_till_done()
    assert entry.options[CONF_CHAT_CLASS] == "chat"
    assert CONF_LLM_HASS_API not in entry.options  # no tools: the agent only talks
    assert entry.state is ConfigEntryState.LOADED
