"""Error paths, without the Fairlane server: a real HTTP server on 127.0.0.1 that answers the
way a broken, half-upgraded or foreign server would. The integration must turn each answer
into a clear error for the person (or a form error, or an unknown sensor), never a traceback.
The real server's own behaviour is tested against it elsewhere; this is what it cannot do.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from homeassistant import config_entries
from homeassistant.components import conversation
from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import CONF_HOST, CONF_PORT, CONF_TOKEN
from homeassistant.core import Context, HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import intent

from custom_components.fairlane.const import DOMAIN
from tests_ha.conftest import fairlane_entry, tool_data

HEALTH = {"status": "ok", "version": "0.1.0", "instance_id": "f" * 32, "policy": "fairlane",
          "models": {"llm": "model", "stt": None, "tts": None}, "wyoming_port": None}


def _health() -> dict[str, Any]:
    return json.loads(json.dumps(HEALTH))


@dataclass
class Misbehaviour:
    """What the server answers; a test changes it."""

    health: Any = field(default_factory=_health)
    stats: Any = field(default_factory=lambda: {"classes": {}})
    stream: list[bytes] = field(default_factory=list)
    status: int = 200
    summaries: list[dict[str, Any]] = field(default_factory=list)
    speech: tuple[int, bytes] = (200, b"RIFF but not really a WAV file")


@pytest.fixture
async def server(socket_enabled: None) -> AsyncIterator[tuple[Misbehaviour, int]]:
    state = Misbehaviour()

    def answer(value: Callable[[], Any]) -> Any:
        async def handler(request: web.Request) -> web.StreamResponse:
            body = value()
            if isinstance(body, bytes):
                return web.Response(body=body, content_type="application/json")
            return web.json_response(body)

        return handler

    async def chat(request: web.Request) -> web.StreamResponse:
        if state.status != 200:
            return web.Response(status=state.status, text="<html>proxy error</html>")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for line in state.stream:
            await response.write(line)
        return response

    async def summary(request: web.Request) -> web.Response:
        return web.json_response(state.summaries.pop(0) if state.summaries else
                                 {"id": "s", "status": "running"})

    async def speech(request: web.Request) -> web.Response:
        status, body = state.speech
        return web.Response(status=status, body=body, content_type="audio/wav")

    app = web.Application()
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/health", answer(lambda: state.health))
    app.router.add_get("/v1/stats", answer(lambda: state.stats))
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/summaries", answer(lambda: {"id": "s", "status": "queued"}))
    app.router.add_get("/v1/summaries/{id}", summary)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    yield state, port
    await runner.cleanup()


async def _loaded(hass: HomeAssistant, port: int) -> Any:
    entry = fairlane_entry({CONF_HOST: "127.0.0.1", CONF_PORT: port, CONF_TOKEN: "t"})
    entry.add_to_hass(hass)
    await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    return entry


def sse(*chunks: Any) -> list[bytes]:
    return [f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n".encode() for c in chunks]


@pytest.mark.parametrize(
    ("stream", "said"),
    [
        (sse("{not json"), "malformed stream data"),
        (sse({"choices": "everything"}), "malformed stream chunk"),
        (sse({"choices": [{"delta": {"tool_calls": [{"index": "first"}]}}]}),
         "malformed stream chunk"),
        (sse([1, 2]), "malformed stream data"),
        (sse({"error": {"message": "the engine failed"}}), "the engine failed"),
        (sse({"error": "overloaded"}), "overloaded"),
    ],
)
async def test_malformed_stream_data_is_a_clear_error(
    hass: HomeAssistant, server: tuple[Misbehaviour, int], stream: list[bytes], said: str
) -> None:
    state, port = server
    entry = await _loaded(hass, port)
    assert entry.state is ConfigEntryState.LOADED
    state.stream = stream
    result = await conversation.async_converse(
        hass, "Hello", None, Context(), agent_id="conversation.fairlane"
    )
    assert result.response.response_type is intent.IntentResponseType.ERROR
    assert said in result.response.speech["plain"]["speech"]


async def test_a_server_error_page_is_a_clear_error(
    hass: HomeAssistant, server: tuple[Misbehaviour, int]
) -> None:
    state, port = server
    await _loaded(hass, port)
    state.status = 502
    result = await conversation.async_converse(
        hass, "Hello", None, Context(), agent_id="conversation.fairlane"
    )
    assert result.response.response_type is intent.IntentResponseType.ERROR
    assert "server error 502" in result.response.speech["plain"]["speech"]


@pytest.mark.parametrize("health", [b"<html>router login</html>", b"[]", {"status": "ok"}])
async def test_something_else_at_the_address_is_not_a_server(
    hass: HomeAssistant, server: tuple[Misbehaviour, int], health: Any
) -> None:
    state, port = server
    state.health = health
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_HOST: "127.0.0.1", CONF_PORT: port, CONF_TOKEN: "t"}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": "cannot_connect"}
    entry = await _loaded(hass, port)
    assert entry.state is ConfigEntryState.SETUP_RETRY


async def test_a_server_without_an_instance_id_still_sets_up(
    hass: HomeAssistant, server: tuple[Misbehaviour, int]
) -> None:
    """A server from before instance ids: the entry is known by its address then."""
    state, port = server
    state.health = {k: v for k, v in HEALTH.items() if k != "instance_id"}
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_HOST: "127.0.0.1", CONF_PORT: port, CONF_TOKEN: "t"}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY and result["result"].unique_id is None
    # No speech-to-text or voice on this server: no subentries for them.
    kinds = {sub.subentry_type for sub in result["result"].subentries.values()}
    assert kinds == {"conversation", "ai_task_data"}


async def test_stats_of_another_shape_leave_the_sensors_unknown(
    hass: HomeAssistant, server: tuple[Misbehaviour, int]
) -> None:
    state, port = server
    state.stats = {"classes": {"voice": [], "chat": {"ttft_ms": None}}, "device": "busy"}
    entry = await _loaded(hass, port)
    assert entry.state is ConfigEntryState.LOADED
    state_of = hass.states.get("sensor.fairlane_chat_time_to_first_token_p95")
    assert state_of is not None and state_of.state == "unknown"


async def test_the_summary_wait_has_a_deadline_and_ends_with_the_entry(
    hass: HomeAssistant, server: tuple[Misbehaviour, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_homeassistant_custom_component.common import async_capture_events

    from custom_components.fairlane import services
    from custom_components.fairlane.const import EVENT_SUMMARY_DONE

    _, port = server
    entry = await _loaded(hass, port)
    events = async_capture_events(hass, EVENT_SUMMARY_DONE)
    monkeypatch.setattr(services, "SUMMARY_POLL_S", 0.01)
    monkeypatch.setattr(services, "SUMMARY_DEADLINE_S", 0.2)
    await hass.services.async_call(DOMAIN, "summarize", {"text": "A note."}, blocking=True,
                                   return_response=True)
    for _ in range(500):  # the server never finishes it: the deadline ends the wait
        if events:
            break
        await asyncio.sleep(0.01)
    assert [e.data["status"] for e in events] == ["timeout"]
    assert "stays on the server" in events[0].data["error"]

    # A wait still running when the entry unloads is cancelled with it.
    monkeypatch.setattr(services, "SUMMARY_DEADLINE_S", 3600)
    await hass.services.async_call(DOMAIN, "summarize", {"text": "Another."}, blocking=True,
                                   return_response=True)
    waits = [t for t in entry._background_tasks if "summary" in t.get_name()]
    assert len(waits) == 1 and not waits[0].done()
    assert await hass.config_entries.async_unload(entry.entry_id)
    await hass.async_block_till_done()
    assert waits[0].cancelled()
    with pytest.raises(HomeAssistantError):
        await hass.services.async_call(DOMAIN, "summarize", {"text": "x"}, blocking=True,
                                       return_response=True)


async def test_the_voice_says_why_it_cannot_speak(
    hass: HomeAssistant, server: tuple[Misbehaviour, int]
) -> None:
    from homeassistant.components import tts
    from homeassistant.components.tts.entity import TTSAudioRequest

    state, port = server
    state.health["models"]["tts"] = "en_US-joe-medium"
    await _loaded(hass, port)
    engine = hass.data[tts.DATA_COMPONENT].get_entity("tts.fairlane_text_to_speech")
    assert isinstance(engine, tts.TextToSpeechEntity)
    assert engine.async_get_supported_voices("de-DE") is None

    async def text() -> AsyncIterator[str]:
        yield "Hello there. "

    # Not WAV: the stream ends with an error, not a wave.Error traceback.
    response = await engine.async_stream_tts_audio(
        TTSAudioRequest(language="en-US", options={}, message_gen=text())
    )
    with pytest.raises(HomeAssistantError, match="not WAV audio"):
        async for _ in response.data_gen:
            pass

    state.speech = (500, b"engine down")
    with pytest.raises(HomeAssistantError, match="could not speak the text"):
        await engine.async_get_tts_audio("Hello.", "en-US", {})
    response = await engine.async_stream_tts_audio(
        TTSAudioRequest(language="en-US", options={}, message_gen=text())
    )
    with pytest.raises(HomeAssistantError, match="could not speak"):
        async for _ in response.data_gen:
            pass

    async def broken() -> AsyncIterator[str]:
        yield "Half a sent"
        raise RuntimeError("the agent failed")

    response = await engine.async_stream_tts_audio(
        TTSAudioRequest(language="en-US", options={}, message_gen=broken())
    )
    with pytest.raises(RuntimeError, match="the agent failed"):
        async for _ in response.data_gen:
            pass


async def test_speech_parts_a_server_lacks_are_not_offered(
    hass: HomeAssistant, server: tuple[Misbehaviour, int]
) -> None:
    _, port = server
    entry = await _loaded(hass, port)  # no speech-to-text, no voice on this server
    for kind, reason in (("stt", "no_stt"), ("tts", "no_tts")):
        result = await hass.config_entries.subentries.async_init(
            (entry.entry_id, kind), context={"source": config_entries.SOURCE_USER}
        )
        assert result["type"] is FlowResultType.ABORT and result["reason"] == reason
    assert hass.states.get("stt.fairlane_speech_to_text") is None


async def test_the_document_search_tool_reports_failures_and_empty_results(
    hass: HomeAssistant, server: tuple[Misbehaviour, int]
) -> None:
    from homeassistant.helpers import llm

    from custom_components.fairlane.llm_api import SearchDocumentsTool

    _, port = server
    entry = await _loaded(hass, port)
    tool = SearchDocumentsTool([entry.runtime_data.client])
    context = llm.LLMContext(platform=DOMAIN, context=None, language="en", assistant=None,
                             device_id=None)
    assert "error" in tool_data(await tool.async_call(
        hass, llm.ToolInput(tool_name=tool.name, tool_args={"query": " "}), context
    ))
    with pytest.raises(HomeAssistantError, match="document search failed"):
        # This server has no document index (404).
        await tool.async_call(
            hass, llm.ToolInput(tool_name=tool.name, tool_args={"query": "boiler"}), context
        )
    assert tool_data(await SearchDocumentsTool([]).async_call(
        hass, llm.ToolInput(tool_name=tool.name, tool_args={"query": "boiler"}), context
    )) == {"results": [], "note": "nothing in the household documents matches"}


async def test_an_agent_whose_api_went_away_says_so(
    hass: HomeAssistant, server: tuple[Misbehaviour, int]
) -> None:
    from homeassistant.const import CONF_LLM_HASS_API

    from tests_ha.conftest import set_agent

    _, port = server
    entry = await _loaded(hass, port)
    await set_agent(hass, entry, **{CONF_LLM_HASS_API: ["an_api_that_was_removed"]})
    result = await conversation.async_converse(
        hass, "Hello", None, Context(), agent_id="conversation.fairlane"
    )
    assert result.response.response_type is intent.IntentResponseType.ERROR
    agent = conversation.async_get_agent(hass, "conversation.fairlane")
    assert agent is not None and agent.supported_languages == "*"


async def test_a_discovery_while_the_add_on_is_down_waits_for_the_next(
    hass: HomeAssistant, socket_enabled: None
) -> None:
    from homeassistant.helpers.service_info.hassio import HassioServiceInfo

    info = HassioServiceInfo(config={"host": "127.0.0.1", "port": 9, "token": "t"},
                             name="Fairlane", slug="fairlane", uuid="1234")
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_HASSIO}, data=info
    )
    assert result["type"] is FlowResultType.ABORT and result["reason"] == "cannot_connect"
