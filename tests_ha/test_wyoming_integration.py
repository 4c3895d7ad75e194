"""Home Assistant's own Wyoming integration, unchanged, against the Fairlane server."""

from __future__ import annotations

import wave
from collections.abc import AsyncIterator
from pathlib import Path

from homeassistant.components import stt
from homeassistant.core import HomeAssistant
from homeassistant.helpers import entity_registry as er

from tests_ha.conftest import add_wyoming, voice_metadata

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "speech" / "command-00.wav"


async def _audio() -> AsyncIterator[bytes]:
    with wave.open(str(FIXTURE)) as wav:
        frames = wav.readframes(wav.getnframes())
    for offset in range(0, len(frames), 4096):
        yield frames[offset:offset + 4096]


async def test_home_assistant_wyoming_sets_up_and_transcribes(
    hass: HomeAssistant, fairlane_server, socket_enabled
) -> None:
    entry = await add_wyoming(hass, fairlane_server.wyoming_port)

    entities = er.async_entries_for_config_entry(er.async_get(hass), entry.entry_id)
    stt_entity = next(e.entity_id for e in entities if e.domain == "stt")
    engine = stt.async_get_speech_to_text_engine(hass, stt_entity)
    assert engine is not None and "en" in engine.supported_languages

    metadata = voice_metadata()
    result = await engine.async_process_audio_stream(metadata, _audio())
    assert result.result is stt.SpeechResultState.SUCCESS
    assert "kitchen" in (result.text or "").lower()

    assert await hass.config_entries.async_unload(entry.entry_id)
    await hass.async_block_till_done()
