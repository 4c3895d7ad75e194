"""Speech synthesis in the voice lane, on the real default voice: HTTP, Wyoming, priority."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import threading
import time
import urllib.request
import wave

import av
import openai
import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.info import Describe, Info
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
)

from fairlane.policy import Kind, Priority
from fairlane.runtime.metrics import word_error_rate
from fairlane.server import BackgroundServer
from tests.server.conftest import TOKEN
from tests.server.test_chat_api import http

HOUSEHOLD = [
    "Turn on the kitchen lights.",
    "The front door is locked.",
    "Good morning, the coffee machine is warming up.",
    "Your package was delivered to the porch.",
    "The thermostat is now set to heat.",
    "I closed the blinds in the bedroom.",
    "The washing machine will finish in twenty minutes.",
    "It is raining outside, so take an umbrella.",
    "The garage door has been open for an hour.",
    "Dinner is ready in the dining room.",
]


def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=TOKEN, max_retries=0)


def speak(server: BackgroundServer, body: dict) -> tuple[int, bytes, str]:
    request = urllib.request.Request(
        f"{server.url}/v1/audio/speech", data=json.dumps(body).encode(), method="POST"
    )
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", f"Bearer {TOKEN}")
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, response.read(), response.headers["Content-Type"]
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers["Content-Type"]


def transcribe(server: BackgroundServer, audio: bytes, filename: str = "a.wav") -> str:
    return client(server).audio.transcriptions.create(
        model="whisper-base", file=(filename, audio), language="en"
    ).text


def test_spoken_household_sentences_transcribe_back_to_the_text(server) -> None:
    texts = []
    for sentence in HOUSEHOLD:
        status, audio, content_type = speak(
            server, {"input": sentence, "voice": "alloy", "response_format": "wav"}
        )
        assert status == 200 and content_type == "audio/wav"
        with wave.open(io.BytesIO(audio)) as wav:
            assert wav.getframerate() == 22050 and wav.getnframes() > 22050 // 2
        texts.append(transcribe(server, audio))
    wer = word_error_rate(HOUSEHOLD, texts)
    assert wer <= 0.2, list(zip(HOUSEHOLD, texts, strict=True))


def test_openai_client_formats_and_the_voice_list(server) -> None:
    mp3 = client(server).audio.speech.create(
        model="tts-1", voice="alloy", input="The front door is locked."
    ).content
    with av.open(io.BytesIO(mp3)) as container:
        assert container.format.name == "mp3"
        assert 0.5 < float(container.duration or 0) / 1e6 < 4
    assert "door" in transcribe(server, mp3, "a.mp3").lower()
    status, pcm, content_type = speak(
        server, {"input": "Dinner is ready.", "response_format": "pcm"}
    )
    assert status == 200 and content_type == "audio/pcm" and len(pcm) % 2 == 0
    assert 0.4 < len(pcm) / 2 / 24_000 < 3  # OpenAI's pcm: 24 kHz, 16-bit
    status, body = http(server, "GET", "/v1/audio/voices")
    assert status == 200 and body["data"][0]["id"] == "en_US-joe-medium"
    status, health = http(server, "GET", "/health", token=None)
    assert health["models"]["tts"] == "en_US-joe-medium"


def test_streamed_speech_sends_the_first_sentence_before_the_last_is_synthesised(server) -> None:
    text = " ".join(HOUSEHOLD[:5])
    request = urllib.request.Request(
        f"{server.url}/v1/audio/speech",
        data=json.dumps(
            {"input": text, "response_format": "wav", "stream_format": "audio"}
        ).encode(),
        method="POST",
    )
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", f"Bearer {TOKEN}")
    sent = time.monotonic()
    arrivals: list[tuple[float, int]] = []
    with urllib.request.urlopen(request, timeout=300) as response:
        header = response.read(44)
        while chunk := response.read1(65536):
            arrivals.append((time.monotonic(), len(chunk)))
    assert header[:4] == b"RIFF"
    steps = [r for r in server.services.device.records if r.kind is Kind.TTS and r.start >= sent]
    assert len(steps) == 5  # one bounded step per sentence
    assert arrivals[0][0] < steps[-1].start  # heard before the last sentence was even begun
    assert sum(n for _, n in arrivals) > 5 * 22050  # several seconds of 16-bit audio


def test_sse_stream_carries_base64_pcm_deltas_and_a_done_event(server) -> None:
    status, raw, content_type = speak(
        server,
        {"input": "Turn on the lights. Then lock the door.", "stream_format": "sse"},
    )
    assert status == 200 and content_type.startswith("text/event-stream")
    lines = raw.decode().splitlines()
    events = [json.loads(line[6:]) for line in lines if line.startswith("data:")]
    assert [e["type"] for e in events] == ["speech.audio.delta"] * 2 + ["speech.audio.done"]
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert len(audio) / 2 / 24_000 > 1.0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": " ... !! "}, "input"),
        ({"input": "x" * 100_000}, "input"),
        ({"input": "Hello.", "voice": "no-such-voice"}, "voice"),
        ({"input": "Hello.", "response_format": "wma"}, "response_format"),
        ({"input": "Hello.", "speed": 9}, "speed"),
        ({"input": "Hello.", "response_format": "flac", "stream_format": "audio"},
         "response_format"),
        ({"voice": "alloy"}, "input"),
    ],
)
def test_bad_speech_requests_get_a_clear_400(server, body, param) -> None:
    status, raw, content_type = speak(server, body)
    assert status == 400 and content_type.startswith("application/json")
    error = json.loads(raw)["error"]
    assert error["param"] == param and error["message"]


# --- Wyoming ---------------------------------------------------------------------------------


async def _wyoming_speak(port: int, text: str, streamed: bool) -> tuple[Info, list]:
    async with AsyncTcpClient("127.0.0.1", port) as wy:
        await wy.write_event(Describe().event())
        info = Info.from_event(await wy.read_event())
    events = []
    async with AsyncTcpClient("127.0.0.1", port) as wy:
        if streamed:  # as Home Assistant streams an agent's reply
            await wy.write_event(SynthesizeStart().event())
            for word in text.split(" "):
                await wy.write_event(SynthesizeChunk(text=word + " ").event())
            await wy.write_event(Synthesize(text=text).event())
            await wy.write_event(SynthesizeStop().event())
        else:
            await wy.write_event(Synthesize(text=text).event())
        end = SynthesizeStopped if streamed else AudioStop
        while (event := await wy.read_event()) is not None:
            events.append(event)
            if end.is_type(event.type) or Error.is_type(event.type):
                break
    return info, events


@pytest.mark.parametrize("streamed", [True, False])
def test_wyoming_client_hears_the_text_spoken(server, streamed) -> None:
    text = "The front door is locked. Dinner is ready in the dining room."
    info, events = asyncio.run(_wyoming_speak(server.services.wyoming_port, text, streamed))
    program = info.tts[0]
    assert program.supports_synthesize_streaming
    assert program.voices[0].name == "en_US-joe-medium" and info.asr  # one server, both ways
    assert AudioStart.is_type(events[0].type)
    assert AudioStop.is_type(events[-2 if streamed else -1].type)
    chunks = [AudioChunk.from_event(e) for e in events if AudioChunk.is_type(e.type)]
    pcm = b"".join(c.audio for c in chunks)
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(chunks[0].rate)
        wav.writeframes(pcm)
    assert len(pcm) / 2 / chunks[0].rate > 2.5  # both sentences (their wording: the WER test)
    assert "front door" in transcribe(server, buffer.getvalue()).lower()


def test_wyoming_synthesis_of_nothing_gets_an_error_event(server) -> None:
    _, events = asyncio.run(_wyoming_speak(server.services.wyoming_port, " ", False))
    assert Error.is_type(events[-1].type)


# --- priority --------------------------------------------------------------------------------


def test_speech_during_a_large_ingestion_runs_at_the_next_step(server, monkeypatch) -> None:
    """2,000 texts to embed as background work; a sentence to speak arrives in the middle."""
    device = server.services.device
    engine = server.services.voice.engine
    registered: list[float] = []  # when the sentence reached the device (under its lock)
    add = engine.add

    def timed_add(request_id, speech) -> None:  # type: ignore[no-untyped-def]
        registered.append(time.monotonic())
        add(request_id, speech)

    monkeypatch.setattr(engine, "add", timed_add)
    texts = [f"Note {i}: the boiler was serviced and the filter replaced." for i in range(2000)]
    done = threading.Event()

    def ingest() -> None:
        http(server, "POST", "/v1/embeddings",
             {"input": texts, "model": "x", "fairlane_class": "background"})
        done.set()

    thread = threading.Thread(target=ingest)
    thread.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(
        r.kind is Kind.EMBED for r in list(device.records)[-5:]
    ):
        time.sleep(0.005)
    status, _, _ = speak(server, {"input": "The front door is open.", "response_format": "wav"})
    thread.join(timeout=300)
    assert status == 200 and done.is_set()
    arrival = registered[-1]
    records = list(device.records)
    tts_step = next(r for r in records if r.kind is Kind.TTS and r.start >= arrival)
    assert [r for r in records if arrival <= r.start < tts_step.start] == []
    assert tts_step.classes == (Priority.VOICE,)
    assert any(r.kind is Kind.EMBED and r.start >= tts_step.end for r in records)


def test_a_wyoming_client_that_leaves_mid_stream_drops_its_queued_sentences(server) -> None:
    """Ten sentences streamed, the connection closed at the first audio: at most the sentence
    already on the device is still synthesised, nothing after it."""
    device = server.services.device
    left: list[float] = []

    async def leave() -> None:
        async with AsyncTcpClient("127.0.0.1", server.services.wyoming_port) as wy:
            await wy.write_event(SynthesizeStart().event())
            for sentence in HOUSEHOLD:
                await wy.write_event(SynthesizeChunk(text=sentence + " ").event())
            while (event := await wy.read_event()) is not None:
                if AudioChunk.is_type(event.type):
                    break  # the first audio came: hang up
        left.append(time.monotonic())

    asyncio.run(leave())
    time.sleep(3)  # long enough for several more sentences, had they stayed queued
    after = [r for r in device.records if r.kind is Kind.TTS and r.start > left[0]]
    assert len(after) <= 1, len(after)
    assert device.snapshot()["waiting"]["voice"] == 0
