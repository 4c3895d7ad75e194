"""What a person hears: a spoken turn through Home Assistant's assist pipeline, end to end
(a benchmark, not a test).

    .venv-ha/bin/pytest -c tests_ha/pytest.ini tests_ha/bench_spoken_turn.py -s

A committed recording is streamed in real time (32 ms chunks, as a satellite sends them) into
HA's pipeline: Fairlane's speech-to-text → Fairlane's agent with Assist's tools → Fairlane's
text-to-speech, streamed (HA hands the agent's text to the TTS entity as it is written). The
pipeline's own TTS stream is read as a satellite reads it. Per turn it records, from the end
of speech (the last audio chunk the pipeline took):

- the transcript (HA's `stt-end` event), and when the transcription it came from was sent to
  the server and came back (sent before the end of speech: the early transcript),
- the first audio (the first PCM bytes after the WAV header of the TTS stream),
- the whole turn (the last audio byte).

Three turns: a command ("turn on the kitchen lights": a tool call, then a short reply), a
question ("what is the weather tomorrow": an answer in words), and the command again through
a pipeline that prefers local intents ("local": Home Assistant's own sentence matching runs the
command and answers; the model is not called). The agent samples at
temperature 0, so a turn makes the same model calls idle and loaded (the table shows them).
Each runs with the device idle
and with background load (two long summaries in flight as a closed loop, and documents being
indexed), rounds alternating idle, loaded, idle, loaded. Every round is printed, then
p50 / max per condition and the loaded/idle ratio of the p50s.
Not collected by `make test` (the name does not start with `test_`).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import statistics
import subprocess
import time
import uuid
import wave
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp
from homeassistant.components import assist_pipeline, tts
from homeassistant.core import Context, HomeAssistant
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.fairlane.const import CONF_TEMPERATURE
from tests_ha.conftest import (
    SPEECH,
    add_kitchen_light,
    set_agent,
    voice_metadata,
    voice_pipeline,
)

ROUNDS = int(os.environ.get("FAIRLANE_ROUNDS", "3"))
# label: the recording, and whether the pipeline prefers local intents (Home Assistant's own
# sentence matching answers the commands it knows; the agent gets the rest).
TURNS = {
    "command": ("command-00.wav", False),
    "question": ("command-03.wav", False),
    "local": ("command-00.wav", True),
}
CHUNK = 1024  # 32 ms of 16 kHz 16-bit audio
NOTE = "The boiler was serviced in March and the filter replaced; the invoice is in the drawer. "


async def _model_calls(entry: MockConfigEntry) -> int:
    stats = await entry.runtime_data.client.stats()
    return int(stats["classes"]["voice"]["requests"])


CALLS: list[dict[str, Any]] = []  # each model call: sent, first token, last token, text
TRANSCRIBED: list[dict[str, Any]] = []  # each transcription: sent, ready, seconds of audio


def _record_calls(entry: MockConfigEntry) -> None:
    """Time each model call of the agent as Home Assistant sees it, with its usage."""
    client = entry.runtime_data.client
    plain = client.chat_stream

    async def chat_stream(body: dict[str, Any]) -> AsyncGenerator[dict[str, Any]]:
        call: dict[str, Any] = {"sent": time.perf_counter()}
        CALLS.append(call)
        async for chunk in plain({**body, "stream_options": {"include_usage": True}}):
            now = time.perf_counter()
            if choices := chunk.get("choices"):
                call.setdefault("first", now)
                call["last"] = now
                delta = choices[0].get("delta") or {}
                call["text"] = call.get("text", "") + (delta.get("content") or "") + "".join(
                    f"[{c['function']['name']} {c['function'].get('arguments', '')}]"
                    for c in delta.get("tool_calls") or [] if c.get("function", {}).get("name"))
            if usage := chunk.get("usage"):
                call["prompt"] = usage["prompt_tokens"]
                call["cached"] = usage["prompt_tokens_details"]["cached_tokens"]
            yield chunk

    client.chat_stream = chat_stream  # type: ignore[method-assign]
    transcribe = client.transcribe

    async def timed_transcribe(audio: bytes, **fields: Any) -> str:
        call: dict[str, Any] = {"sent": time.perf_counter(), "audio_s": len(audio) / 32_000}
        TRANSCRIBED.append(call)
        text = await transcribe(audio, **fields)
        call["ready"] = time.perf_counter()
        return str(text)

    client.transcribe = timed_transcribe  # type: ignore[method-assign]


async def _run_turn(
    hass: HomeAssistant, entry: MockConfigEntry, pipeline_id: str, recording: str
) -> dict[str, float]:
    calls = await _model_calls(entry)
    first_call, first_transcription = len(CALLS), len(TRANSCRIBED)
    with wave.open(str(SPEECH / recording)) as wav:
        audio = wav.readframes(wav.getnframes())
    marks: dict[str, float] = {}
    reader: list[asyncio.Task[None]] = []

    async def spoken() -> AsyncGenerator[bytes]:
        for offset in range(0, len(audio), CHUNK):
            await asyncio.sleep(CHUNK / 32_000)  # real time
            marks["end_of_speech"] = time.perf_counter()
            yield audio[offset : offset + CHUNK]

    async def read_tts(token: str) -> None:
        stream = tts.async_get_stream(hass, token)
        assert stream is not None
        received = 0
        async for chunk in stream.async_stream_result():
            received += len(chunk)
            if received > 44 and "first_audio" not in marks:
                marks["first_audio"] = time.perf_counter()
        marks["last_audio"] = time.perf_counter()

    def on_event(event: assist_pipeline.PipelineEvent) -> None:
        if event.type is assist_pipeline.PipelineEventType.RUN_START and event.data:
            token = (event.data.get("tts_output") or {}).get("token")
            if token:  # streamed TTS: the satellite starts reading now
                reader.append(hass.async_create_task(read_tts(token)))
        elif event.type is assist_pipeline.PipelineEventType.STT_END:
            marks["transcript"] = time.perf_counter()
        elif event.type is assist_pipeline.PipelineEventType.TTS_END and not reader:
            token = event.data["tts_output"]["token"]
            reader.append(hass.async_create_task(read_tts(token)))
        elif event.type is assist_pipeline.PipelineEventType.ERROR:
            marks["error"] = 1.0

    await assist_pipeline.async_pipeline_from_audio_stream(
        hass,
        context=Context(),
        event_callback=on_event,
        stt_metadata=voice_metadata(),
        stt_stream=spoken(),
        pipeline_id=pipeline_id,
        conversation_id=uuid.uuid4().hex,
        device_id="kitchen-satellite",
        # WAV as the voice makes it: no ffmpeg conversion (a satellite may ask for another
        # format; Home Assistant then converts with its ffmpeg).
        tts_audio_output={tts.ATTR_PREFERRED_FORMAT: "wav"},
        end_stage=assist_pipeline.PipelineStage.TTS,
    )
    await asyncio.gather(*reader)
    end = marks["end_of_speech"]
    for call in CALLS[first_call:]:
        print(f"    model call: sent {call['sent'] - end:5.2f} s, first token "
              f"{call.get('first', 0) - call['sent']:5.2f} s later, last "
              f"{call.get('last', 0) - call['sent']:5.2f} s, {call.get('cached', 0):.0f} of "
              f"{call.get('prompt', 0):.0f} prompt tokens cached: {call.get('text', '')!r:.400}",
              flush=True)
    # The speculation window: when the transcript Home Assistant gets was sent and ready, from
    # the end of speech. One sent before the end is the early transcript (at the first pause).
    transcriptions = TRANSCRIBED[first_transcription:]
    for t in transcriptions:
        print(f"    transcription of {t['audio_s']:.2f} s of audio: sent {t['sent'] - end:5.2f} s, "
              f"ready {t.get('ready', math.nan) - end:5.2f} s", flush=True)
    used = transcriptions[-1] if transcriptions else None
    return {
        "transcript_sent": used["sent"] - end if used else math.nan,
        "transcript_ready": used.get("ready", math.nan) - end if used else math.nan,
        "transcript": marks["transcript"] - end,
        "first_audio": marks["first_audio"] - end,
        "turn": marks["last_audio"] - end,
        "calls": float(await _model_calls(entry) - calls),
        "error": marks.get("error", 0.0),
    }


class BackgroundLoad:
    """Two long summaries in flight (a closed loop) and documents indexed, as `background`."""

    def __init__(self, base: str, token: str) -> None:
        self.base, self.headers = base, {"Authorization": f"Bearer {token}"}
        self.tasks: list[asyncio.Task[None]] = []
        self.done = {"summaries": 0, "documents": 0}

    async def _summaries(self, session: aiohttp.ClientSession) -> None:
        while True:
            prompt = f"{uuid.uuid4().hex} Summarise these household notes:\n" + NOTE * 40
            body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 64,
                    "fairlane_class": "background", "user": "summaries"}
            async with session.post(f"{self.base}/v1/chat/completions", json=body,
                                    headers=self.headers) as response:
                await response.read()
            self.done["summaries"] += 1

    async def _documents(self, session: aiohttp.ClientSession) -> None:
        while True:
            texts = [f"{uuid.uuid4().hex} {NOTE * 3}" for _ in range(64)]
            body = {"input": texts, "model": "x", "fairlane_class": "background",
                    "user": "documents"}
            async with session.post(f"{self.base}/v1/embeddings", json=body,
                                    headers=self.headers) as response:
                await response.read()
            self.done["documents"] += len(texts)

    async def __aenter__(self) -> BackgroundLoad:
        self.session = aiohttp.ClientSession()
        self.tasks = [asyncio.create_task(self._summaries(self.session)) for _ in range(2)]
        self.tasks.append(asyncio.create_task(self._documents(self.session)))
        await asyncio.sleep(5)  # the summaries' prompts are being prefilled
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.session.close()


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False).stdout.strip()


async def test_bench_spoken_turns(hass: HomeAssistant, entry: MockConfigEntry,
                                  fairlane_server: Any) -> None:
    await add_kitchen_light(hass, "Kitchen lights")
    await set_agent(hass, entry, **{CONF_TEMPERATURE: 0.0})
    _record_calls(entry)
    pipelines = {
        local: await voice_pipeline(hass, "tts.fairlane_text_to_speech", local)
        for local in (False, True)
    }
    base = f"http://{fairlane_server.host}:{fairlane_server.port}"
    for recording, local in TURNS.values():  # equal warm-up: each turn once, idle
        await _run_turn(hass, entry, pipelines[local], recording)
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for round_ in range(ROUNDS):
        for condition in ("idle", "loaded"):
            for label, (recording, local) in TURNS.items():
                if condition == "idle":
                    row = await _run_turn(hass, entry, pipelines[local], recording)
                else:
                    async with BackgroundLoad(base, fairlane_server.token):
                        row = await _run_turn(hass, entry, pipelines[local], recording)
                results.setdefault((label, condition), []).append(row)
                print(f"round {round_ + 1} {label:8} {condition:6} "
                      + " ".join(f"{k} {v:.2f} s" for k, v in row.items()
                                 if k not in ("error", "calls"))
                      + f" model calls {row['calls']:.0f}"
                      + (" ERROR" if row["error"] else ""), flush=True)
    print(f"\ncommit {_commit()}; {ROUNDS} rounds; seconds from the end of speech")
    print(f"{'turn':9} {'condition':9} {'transcript p50/max':>19} {'first audio p50/max':>20} "
          f"{'whole turn p50/max':>19}")
    summary: dict[str, Any] = {}
    for (label, condition), rows in results.items():
        cells = []
        for key in ("transcript", "first_audio", "turn"):
            values = [r[key] for r in rows]
            cells.append(f"{statistics.median(values):8.2f} / {max(values):5.2f}")
            summary.setdefault(label, {}).setdefault(condition, {})[key] = statistics.median(
                values)
        print(f"{label:9} {condition:9} {cells[0]:>19} {cells[1]:>20} {cells[2]:>19}")
    print("the transcript Home Assistant got, from the end of speech (p50 / max; sent before 0: "
          "the early transcript, started at the first pause):")
    for (label, condition), rows in results.items():
        sent = [r["transcript_sent"] for r in rows]
        ready = [r["transcript_ready"] for r in rows]
        print(f"  {label:9} {condition:9} sent {statistics.median(sent):5.2f} / {max(sent):5.2f}"
              f"  ready {statistics.median(ready):5.2f} / {max(ready):5.2f}")
    for label, conditions in summary.items():
        ratio = conditions["loaded"]["first_audio"] / conditions["idle"]["first_audio"]
        print(f"{label}: first audio loaded/idle = {ratio:.2f} (goal ≤ 1.3)")
    print(json.dumps(summary))
    # Where the time went, as the server saw it (its last 5 minutes: every turn above).
    async with aiohttp.ClientSession() as session, session.get(
        f"{base}/v1/stats", headers={"Authorization": f"Bearer {fairlane_server.token}"}
    ) as response:
        turns = (await response.json())["spoken_turns"]
    print(f"\nthe server's stages, ms (p50 / p95), over {turns['turns']} turns "
          f"({turns['with_tool']} with a tool):")
    for stage, figures in turns["stages_ms"].items():
        print(f"  {stage:19} {figures['p50']} / {figures['p95']}  ({figures['count']} turns)")
    assert not any(r["error"] for rows in results.values() for r in rows)
