"""The config flow, reauth, reconfigure, subentries and the migration, against the real server."""

from __future__ import annotations

from homeassistant import config_entries
from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import CONF_HOST, CONF_LLM_HASS_API, CONF_PORT, CONF_TOKEN
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import llm
from homeassistant.helpers.aiohttp_client import async_get_clientsession
from homeassistant.helpers.service_info.hassio import HassioServiceInfo
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.fairlane.const import (
    CONF_ADDON_SLUG,
    CONF_AI_TASK_CLASS,
    CONF_CHAT_CLASS,
    CONF_MAX_HISTORY,
    CONF_PROMPT,
    DOMAIN,
    SUBENTRY_AI_TASK,
    SUBENTRY_CONVERSATION,
    SUBENTRY_STT,
    SUBENTRY_TTS,
)
from tests_ha.conftest import RunningServer, device_of, fairlane_entry, subentry


async def _instance_id(hass: HomeAssistant, server: RunningServer) -> str:
    session = async_get_clientsession(hass)
    async with session.get(f"http://{server.host}:{server.port}/health") as response:
        return str((await response.json())["instance_id"])


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
    # Not a host at all: said on the field, not "Unknown error".
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_HOST: "http://a b/", CONF_PORT: 8844}
    )
    assert result["errors"] == {CONF_HOST: "invalid_host"}

    server = {CONF_HOST: fairlane_server.host, CONF_PORT: fairlane_server.port}
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {**server, CONF_TOKEN: "not-the-token"}
    )
    assert result["errors"] == {"base": "invalid_auth"}
    result = await hass.config_entries.flow.async_configure(result["flow_id"], server)
    assert result["errors"] == {"base": "invalid_auth"}  # no token at all

    # A URL pasted into the host field, with its port, is read as the host and the port.
    pasted = {CONF_HOST: f"http://{fairlane_server.host}:{fairlane_server.port}/",
              CONF_PORT: 8844, CONF_TOKEN: fairlane_server.token}
    result = await hass.config_entries.flow.async_configure(result["flow_id"], pasted)
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["data"] == {**server, CONF_TOKEN: fairlane_server.token}
    entry = result["result"]
    assert entry.unique_id == await _instance_id(hass, fairlane_server)
    # The subentries a new server gets: an agent with Assist, the AI task, STT and the voice.
    kinds = sorted(sub.subentry_type for sub in entry.subentries.values())
    assert kinds == sorted([SUBENTRY_AI_TASK, SUBENTRY_CONVERSATION, SUBENTRY_STT, SUBENTRY_TTS])
    agent = subentry(entry, SUBENTRY_CONVERSATION)
    assert agent.data[CONF_LLM_HASS_API] == [llm.LLM_API_ASSIST]
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.LOADED

    # The same server twice is refused (by its instance id).
    again = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    again = await hass.config_entries.flow.async_configure(
        again["flow_id"], {**server, CONF_TOKEN: fairlane_server.token}
    )
    assert again["type"] is FlowResultType.ABORT and again["reason"] == "already_configured"


def _discovery(server: RunningServer, uuid: str = "1234abcd") -> HassioServiceInfo:
    return HassioServiceInfo(
        config={"host": server.host, "port": server.port, "token": server.token},
        name="Fairlane", slug="fairlane", uuid=uuid,
    )


async def test_hassio_discovery_creates_the_entry_once(
    hass: HomeAssistant, fairlane_server: RunningServer
) -> None:
    info = _discovery(fairlane_server)
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_HASSIO}, data=info
    )
    assert result["type"] is FlowResultType.FORM and result["step_id"] == "hassio_confirm"
    result = await hass.config_entries.flow.async_configure(result["flow_id"], {})
    assert result["type"] is FlowResultType.CREATE_ENTRY
    entry = result["result"]
    assert entry.unique_id == await _instance_id(hass, fairlane_server)
    assert result["data"][CONF_TOKEN] == fairlane_server.token
    assert result["data"][CONF_ADDON_SLUG] == "fairlane"
    await hass.async_block_till_done()
    # The server's device links to the add-on's page.
    server_device = device_of(hass, entry, entry.entry_id)
    assert server_device is not None
    assert server_device.configuration_url == "homeassistant://hassio/addon/fairlane/info"

    # The add-on announces itself again (a restart): nothing new, the entry is kept.
    again = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_HASSIO}, data=info
    )
    assert again["type"] is FlowResultType.ABORT and again["reason"] == "already_configured"
    assert len(hass.config_entries.async_entries(DOMAIN)) == 1


async def test_discovery_never_takes_over_an_entry_of_another_server(
    hass: HomeAssistant, fairlane_server: RunningServer
) -> None:
    """An entry the user pointed at another server (it keeps that server's id) is left alone
    when the add-on announces itself; before, the discovery's id matched and moved it back."""
    other = fairlane_entry(
        {CONF_HOST: "192.0.2.7", CONF_PORT: 8844, CONF_TOKEN: "t"},
        unique_id="the-other-server", source=config_entries.SOURCE_HASSIO,
    )
    other.add_to_hass(hass)
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_HASSIO},
        data=_discovery(fairlane_server, uuid="the-other-server"),
    )
    assert result["type"] is FlowResultType.FORM  # a new server to confirm, not an update
    assert other.data[CONF_HOST] == "192.0.2.7"


async def test_discovery_does_not_duplicate_an_entry_still_without_an_id(
    hass: HomeAssistant, fairlane_server: RunningServer
) -> None:
    """An entry moved from version 1 has no id until it next loads; the add-on announcing
    itself first (Home Assistant starting) must not offer the same server a second time."""
    waiting = fairlane_entry(
        {CONF_HOST: fairlane_server.host, CONF_PORT: fairlane_server.port, CONF_TOKEN: "t"}
    )
    waiting.add_to_hass(hass)
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_HASSIO}, data=_discovery(fairlane_server)
    )
    assert result["type"] is FlowResultType.ABORT and result["reason"] == "already_configured"


async def test_a_refused_token_starts_reauth_and_the_new_token_loads_the_entry(
    hass: HomeAssistant, fairlane_server: RunningServer
) -> None:
    entry = fairlane_entry(
        {CONF_HOST: fairlane_server.host, CONF_PORT: fairlane_server.port,
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


async def test_reconfigure_refuses_another_server(
    hass: HomeAssistant, fairlane_server: RunningServer
) -> None:
    entry = fairlane_entry(
        {CONF_HOST: "192.0.2.7", CONF_PORT: 8844, CONF_TOKEN: "t"}, unique_id="the-other-server"
    )
    entry.add_to_hass(hass)
    result = await entry.start_reconfigure_flow(hass)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"],
        {CONF_HOST: fairlane_server.host, CONF_PORT: fairlane_server.port,
         CONF_TOKEN: fairlane_server.token},
    )
    assert result["type"] is FlowResultType.ABORT and result["reason"] == "wrong_server"
    assert entry.data[CONF_HOST] == "192.0.2.7"


async def test_subentries_add_a_second_agent_and_change_one(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    """A children's agent without device control next to the one with Assist."""
    result = await hass.config_entries.subentries.async_init(
        (entry.entry_id, SUBENTRY_CONVERSATION), context={"source": config_entries.SOURCE_USER}
    )
    assert result["type"] is FlowResultType.FORM and result["step_id"] == "user"
    result = await hass.config_entries.subentries.async_configure(
        result["flow_id"],
        {"name": "Kids", CONF_PROMPT: "Answer like a friendly teacher.", CONF_LLM_HASS_API: [],
         CONF_MAX_HISTORY: 4, CONF_CHAT_CLASS: "chat"},
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    await hass.async_block_till_done()
    kids = next(s for s in entry.subentries.values() if s.title == "Kids")
    assert CONF_LLM_HASS_API not in kids.data  # no tools: the agent only talks
    assert entry.state is ConfigEntryState.LOADED
    registry = er.async_get(hass)
    kids_entity = registry.async_get_entity_id("conversation", DOMAIN, kids.subentry_id)
    assert kids_entity == "conversation.kids"
    state = hass.states.get(kids_entity)
    assert state is not None and not state.attributes.get("supported_features")
    # Its own device, linked to the server's.
    device = device_of(hass, entry, kids.subentry_id)
    server = device_of(hass, entry, entry.entry_id)
    assert device is not None and server is not None and device.via_device_id == server.id

    # Removed: its device and entity go with it; the other agent stays.
    assert hass.config_entries.async_remove_subentry(entry, kids.subentry_id)
    await hass.async_block_till_done()
    assert device_of(hass, entry, kids.subentry_id) is None
    assert registry.async_get(kids_entity) is None
    assert hass.states.get("conversation.fairlane") is not None

    task = subentry(entry, SUBENTRY_AI_TASK)
    result = await entry.start_subentry_reconfigure_flow(hass, task.subentry_id)
    assert result["step_id"] == "reconfigure"
    result = await hass.config_entries.subentries.async_configure(
        result["flow_id"], {CONF_AI_TASK_CLASS: "background"}
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reconfigure_successful"
    await hass.async_block_till_done()  # the entry reloads with the change
    assert subentry(entry, SUBENTRY_AI_TASK).data[CONF_AI_TASK_CLASS] == "background"

    # Speech-to-text is the server's: a second one is not offered.
    result = await hass.config_entries.subentries.async_init(
        (entry.entry_id, SUBENTRY_STT), context={"source": config_entries.SOURCE_USER}
    )
    assert result["type"] is FlowResultType.ABORT and result["reason"] == "already_configured"
    # Removed, it can be added again, by name only.
    assert hass.config_entries.async_remove_subentry(
        entry, subentry(entry, SUBENTRY_STT).subentry_id
    )
    await hass.async_block_till_done()
    assert hass.states.get("stt.fairlane_speech_to_text") is None
    result = await hass.config_entries.subentries.async_init(
        (entry.entry_id, SUBENTRY_STT), context={"source": config_entries.SOURCE_USER}
    )
    result = await hass.config_entries.subentries.async_configure(
        result["flow_id"], {"name": "Kitchen speech"}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    await hass.async_block_till_done()
    assert hass.states.get("stt.kitchen_speech") is not None


async def test_a_version_1_entry_moves_its_options_into_subentries(
    hass: HomeAssistant, entry_data: dict[str, object]
) -> None:
    """The entities keep their ids (pipelines name them) and move to their subentries."""
    old = MockConfigEntry(
        domain=DOMAIN, data=entry_data, version=1, title="Fairlane", unique_id="discovery-uuid",
        source=config_entries.SOURCE_HASSIO,
        options={CONF_LLM_HASS_API: [llm.LLM_API_ASSIST], CONF_PROMPT: "Be brief.",
                 CONF_MAX_HISTORY: 3, CONF_CHAT_CLASS: "chat", CONF_AI_TASK_CLASS: "background"},
    )
    old.add_to_hass(hass)
    registry = er.async_get(hass)
    for domain, key, object_id in (("conversation", "conversation", "fairlane"),
                                   ("ai_task", "ai_task", "fairlane_ai_task"),
                                   ("stt", "stt", "fairlane_speech_to_text"),
                                   ("tts", "tts", "fairlane_text_to_speech")):
        registry.async_get_or_create(domain, DOMAIN, f"{old.entry_id}_{key}",
                                     config_entry=old, suggested_object_id=object_id)
    assert await hass.config_entries.async_setup(old.entry_id)
    await hass.async_block_till_done()

    assert old.version == 2 and old.state is ConfigEntryState.LOADED and not old.options
    agent = subentry(old, SUBENTRY_CONVERSATION)
    assert agent.data[CONF_PROMPT] == "Be brief." and agent.data[CONF_MAX_HISTORY] == 3
    assert agent.data[CONF_CHAT_CLASS] == "chat"
    assert subentry(old, SUBENTRY_AI_TASK).data[CONF_AI_TASK_CLASS] == "background"
    for kind, entity_id in ((SUBENTRY_CONVERSATION, "conversation.fairlane"),
                            (SUBENTRY_AI_TASK, "ai_task.fairlane_ai_task"),
                            (SUBENTRY_STT, "stt.fairlane_speech_to_text"),
                            (SUBENTRY_TTS, "tts.fairlane_text_to_speech")):
        moved = registry.async_get(entity_id)
        assert moved is not None and moved.config_subentry_id == subentry(old, kind).subentry_id
        assert moved.unique_id == subentry(old, kind).subentry_id
        assert hass.states.get(entity_id) is not None
    # The discovery's id gave way to the server's own.
    assert old.unique_id is not None and old.unique_id != "discovery-uuid"
