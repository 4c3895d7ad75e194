"""A real Fairlane server (from the server's own .venv) for Home Assistant to talk to."""

from __future__ import annotations

import contextlib
import inspect
import os
import subprocess
import sys
import time
import wave
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from homeassistant.components import conversation, stt
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.config_entries import ConfigSubentry, ConfigSubentryData
from homeassistant.const import CONF_HOST, CONF_LLM_HASS_API, CONF_PORT, CONF_TOKEN
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import chat_session, llm
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.fairlane import default_subentries
from custom_components.fairlane.const import DOMAIN, SUBENTRY_CONVERSATION

ROOT = Path(__file__).resolve().parents[1]
FAIRLANE = ROOT / ".venv" / "bin" / "fairlane"
SPEECH = ROOT / "tests" / "fixtures" / "speech"
TOKEN = "household-secret"


# Sockets are used from child processes here: the plugin blocks this process's sockets
# outside the tests that ask for them, and this fixture lives for the whole session.
def _free_port() -> int:
    code = "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True).stdout)


def _answers(url: str) -> bool:
    probe = f"import urllib.request; urllib.request.urlopen({url!r}, timeout=2)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def voice_metadata(language: str = "en") -> stt.SpeechMetadata:
    """What a voice pipeline streams: 16 kHz, 16-bit mono PCM."""
    return stt.SpeechMetadata(
        language=language,
        format=stt.AudioFormats.WAV,
        codec=stt.AudioCodecs.PCM,
        bit_rate=stt.AudioBitRates.BITRATE_16,
        sample_rate=stt.AudioSampleRates.SAMPLERATE_16000,
        channel=stt.AudioChannels.CHANNEL_MONO,
    )


async def add_kitchen_light(hass: HomeAssistant, name: str = "Kitchen light") -> str:
    """A real light (a template light over an input_boolean) in a Kitchen area, exposed to
    Assist; returns its entity id. It starts off."""
    slug = name.lower().replace(" ", "_")
    assert await async_setup_component(
        hass, "input_boolean", {"input_boolean": {"kitchen_power": {"name": "Kitchen power"}}}
    )
    target = {"target": {"entity_id": "input_boolean.kitchen_power"}}
    # The `template:` form (the `light: - platform: template` form is gone in 2026.11).
    assert await async_setup_component(hass, "template", {"template": [{"light": [{
        "unique_id": slug,
        "name": name,
        "state": "{{ is_state('input_boolean.kitchen_power', 'on') }}",
        "turn_on": {"action": "input_boolean.turn_on", **target},
        "turn_off": {"action": "input_boolean.turn_off", **target},
    }]}]})
    await hass.async_block_till_done()
    entity_id = f"light.{slug}"
    kitchen = ar.async_get(hass).async_create("Kitchen")
    er.async_get(hass).async_update_entity(entity_id, area_id=kitchen.id)
    async_expose_entity(hass, conversation.DOMAIN, entity_id, True)
    return entity_id


def chat_session_of(hass: HomeAssistant) -> contextlib.AbstractContextManager[Any]:
    """A new chat session, as a person's turn opens one. Home Assistant 2026.11 refuses one
    without a context; releases before 2026.10 take no context."""
    parameters = inspect.signature(chat_session.async_get_chat_session).parameters
    if "context" in parameters:
        return chat_session.async_get_chat_session(hass, context=Context())
    return chat_session.async_get_chat_session(hass)


def device_of(hass: HomeAssistant, entry: MockConfigEntry, key: str) -> dr.DeviceEntry | None:
    """The entry's device with the identifier (DOMAIN, key): the server's (the entry id) or a
    subentry's. Looked up among the entry's devices (identifiers are unique per entry only
    since 2026.11, which refuses `async_get_device` outside an integration)."""
    return next(
        (
            device
            for device in dr.async_entries_for_config_entry(dr.async_get(hass), entry.entry_id)
            if (DOMAIN, key) in device.identifiers
        ),
        None,
    )


def tool_data(result: Any) -> Any:
    """What a tool answered: an llm.ToolResult's data (2026.11 and later), else the JSON."""
    return getattr(result, "data", result)


@dataclass(frozen=True)
class RunningServer:
    host: str
    port: int
    wyoming_port: int
    token: str
    data_dir: Path


@contextlib.contextmanager
def running_server(data_dir: Path, more_config: str = "") -> Iterator[RunningServer]:
    """`fairlane serve` on the default models, with `more_config` (YAML) added."""
    port, wyoming = _free_port(), _free_port()
    config = data_dir / "fairlane.yaml"
    config.write_text(
        f"server: {{host: 127.0.0.1, port: {port}, data_dir: {data_dir}}}\n"
        f"wyoming: {{port: {wyoming}}}\n"
        "llm: {n_ctx: 8192}\n" + more_config
    )
    log = data_dir / "fairlane.log"
    env = {**os.environ, "FAIRLANE_TOKEN": TOKEN}
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(FAIRLANE), "serve", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + 300
        while not _answers(f"http://127.0.0.1:{port}/health"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"fairlane did not start: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield RunningServer("127.0.0.1", port, wyoming, TOKEN, data_dir)
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="session")
def _server_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the whole run: loading the three default models takes a while."""
    with running_server(tmp_path_factory.mktemp("fairlane")) as server:
        yield server


@pytest.fixture
def fairlane_server(_server_process: RunningServer, socket_enabled: None) -> RunningServer:
    """The running server, with sockets to 127.0.0.1 allowed for this test."""
    return _server_process


@pytest.fixture(autouse=True)
async def _home_assistant(hass: HomeAssistant, enable_custom_integrations: None) -> None:
    """Load `custom_components/fairlane`; the core `homeassistant` component first, as
    conversation (a dependency) needs its exposed-entities store."""
    assert await async_setup_component(hass, "homeassistant", {})


@pytest.fixture
def entry_data(fairlane_server: RunningServer) -> dict[str, object]:
    return {
        CONF_HOST: fairlane_server.host,
        CONF_PORT: fairlane_server.port,
        CONF_TOKEN: fairlane_server.token,
    }


def fairlane_entry(
    data: dict[str, object], agent: dict[str, object] | None = None, **kwargs: object
) -> MockConfigEntry:
    """A version 2 entry as the config flow makes it: the server, and its subentries (an
    agent with `agent`'s settings, Assist's tools by default; the AI task; STT; TTS)."""
    options: dict[str, object] = {CONF_LLM_HASS_API: [llm.LLM_API_ASSIST]}
    if agent is not None:
        options = agent
    subentries = [
        ConfigSubentryData(data=settings, subentry_type=kind, title=title, unique_id=None)
        for kind, title, settings in default_subentries(options)
    ]
    kwargs.setdefault("title", "Fairlane")
    return MockConfigEntry(
        domain=DOMAIN, data=data, version=2, minor_version=1,
        subentries_data=subentries, **kwargs,  # type: ignore[arg-type]
    )


def subentry(entry: MockConfigEntry, kind: str) -> ConfigSubentry:
    """The entry's (first) subentry of a kind."""
    return next(s for s in entry.subentries.values() if s.subentry_type == kind)


async def set_agent(hass: HomeAssistant, entry: MockConfigEntry, **settings: object) -> None:
    """Change the agent's settings as its reconfigure step does, and wait for the reload."""
    agent = subentry(entry, SUBENTRY_CONVERSATION)
    hass.config_entries.async_update_subentry(entry, agent, data={**agent.data, **settings})
    await hass.async_block_till_done()


@pytest.fixture
async def entry(hass: HomeAssistant, entry_data: dict[str, object]) -> MockConfigEntry:
    """A loaded Fairlane entry with Assist's tools on, as a new entry has them."""
    entry = fairlane_entry(entry_data)
    entry.add_to_hass(hass)
    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    return entry


async def spoken(name: str, chunk: int = 1024) -> AsyncIterator[bytes]:
    """A recorded command in the chunks a satellite streams (1024 bytes: 32 ms)."""
    with wave.open(str(SPEECH / name)) as wav:
        audio = wav.readframes(wav.getnframes())
    for offset in range(0, len(audio), chunk):
        yield audio[offset : offset + chunk]


async def add_wyoming(hass: HomeAssistant, port: int) -> MockConfigEntry:
    """Home Assistant's own Wyoming integration, set up against the Fairlane server."""
    entry = MockConfigEntry(
        domain="wyoming", data={"host": "127.0.0.1", "port": port}, title="Fairlane"
    )
    entry.add_to_hass(hass)
    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    return entry


async def voice_pipeline(
    hass: HomeAssistant, tts_engine: str | None = None, prefer_local_intents: bool = False
) -> str:
    """An assist pipeline of Fairlane's STT and agent (and TTS, if named); returns its id.
    `prefer_local_intents`: Home Assistant handles the commands its own sentences match, and
    only the rest reaches the agent (the pipeline's "prefer handling commands locally")."""
    from homeassistant.components.assist_pipeline.const import DOMAIN as PIPELINE
    from homeassistant.components.assist_pipeline.pipeline import KEY_ASSIST_PIPELINE

    assert await async_setup_component(hass, PIPELINE, {})
    store = hass.data[KEY_ASSIST_PIPELINE].pipeline_store
    pipeline = await store.async_create_item({
        "name": "Fairlane", "language": "en", "conversation_engine": "conversation.fairlane",
        "conversation_language": "en", "stt_engine": "stt.fairlane_speech_to_text",
        "stt_language": "en", "tts_engine": tts_engine,
        "tts_language": "en-US" if tts_engine else None, "tts_voice": None,
        "wake_word_entity": None, "wake_word_id": None,
        "prefer_local_intents": prefer_local_intents,
    })
    return str(pipeline.id)
