"""The speech lane on the real default model (Whisper base): HTTP, Wyoming, priority, batching."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
import wave
from pathlib import Path

import numpy as np
import openai
import pytest
from wyoming.asr import Transcribe, Transcript, TranscriptChunk, TranscriptStart, TranscriptStop
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe, Info

from fairlane.policy import Kind, Priority
from fairlane.runtime.metrics import word_error_rate
from fairlane.server import BackgroundServer
from tests.server.conftest import TOKEN
from tests.server.test_chat_api import http

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "speech"
COMMANDS: dict[str, str] = json.loads((FIXTURES / "commands.json").read_text())


def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=TOKEN, max_retries=0)


def pcm(name: str) -> bytes:
    with wave.open(str(FIXTURES / name)) as wav:
        return wav.readframes(wav.getnframes())


def multipart(fields: dict[str, str], file: bytes | None, filename: str = "a.wav",
              content_type: str = "audio/wav") -> tuple[bytes, str]:
    boundary = "fairlane-test-boundary"
    parts = []
    for key, value in fields.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"\r\n\r\n'
                     f"{value}\r\n".encode())
    if file is not None:
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
                     f'filename="{filename}"\r\nContent-Type: {content_type}\r\n\r\n'.encode()
                     + file + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def post_audio(server, fields, file, filename="a.wav", content_type="audio/wav"):
    body, header = multipart(fields, file, filename, content_type)
    return http(server, "POST", "/v1/audio/transcriptions", body,
                headers={"Content-Type": header})


def test_household_commands_are_transcribed_with_low_wer(server) -> None:
    names = sorted(COMMANDS)
    texts = [client(server).audio.transcriptions.create(
        model="whisper-base", file=(FIXTURES / name).open("rb"), language="en").text
        for name in names]
    wer = word_error_rate([COMMANDS[n] for n in names], texts)
    assert len(names) >= 8 and wer <= 0.2, list(zip(names, texts, strict=True))


def test_response_formats_and_detected_language(server) -> None:
    audio = (FIXTURES / "command-00.wav").read_bytes()
    status, text = post_audio(server, {"response_format": "text"}, audio)
    assert status == 200 and "kitchen" in text.lower()
    verbose = client(server).audio.transcriptions.create(
        model="whisper-base", file=("a.wav", audio), response_format="verbose_json")
    assert verbose.language == "en" and verbose.duration == pytest.approx(1.9, abs=0.6)
    assert "kitchen" in verbose.segments[0].text.lower()


def _flac(samples: np.ndarray) -> bytes:
    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="flac") as container:
        stream = container.add_stream("flac", rate=16000)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = 16000
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


def test_flac_and_raw_pcm_at_another_rate_are_decoded_and_resampled(server) -> None:
    samples = np.frombuffer(pcm("command-05.wav"), dtype="<i2")
    status, body = post_audio(server, {}, _flac(samples), "door.flac", "audio/flac")
    assert status == 200 and "lock" in body["text"].lower()
    upsampled = np.interp(np.arange(0, len(samples), 16000 / 24000), np.arange(len(samples)),
                          samples).astype("<i2")
    status, body = post_audio(server, {"sample_rate": "24000"}, upsampled.tobytes(),
                              "door.pcm", "audio/pcm")
    assert status == 200 and "door" in body["text"].lower()


@pytest.mark.parametrize(
    ("fields", "file", "filename", "content_type", "message"),
    [
        ({}, b"", "a.wav", "audio/wav", "empty"),
        ({}, b"this is not audio at all" * 10, "a.wav", "audio/wav", "could not decode"),
        ({}, b"\x00\x01" * 400, "a.pcm", "audio/pcm", "too short"),
        ({}, b"\x00\x01\x02", "a.pcm", "audio/pcm", "16-bit"),
        ({}, b"\x00\x00" * 16000 * 40, "long.pcm", "audio/pcm", "30 s"),
        ({"response_format": "srt"}, b"\x00\x00" * 16000, "a.pcm", "audio/pcm",
         "response_format"),
        ({"fairlane_class": "urgent"}, b"\x00\x00" * 16000, "a.pcm", "audio/pcm",
         "unknown class"),
        ({"language": "xx"}, b"\x00\x00" * 16000, "a.pcm", "audio/pcm", "not supported"),
        ({}, None, "", "", "no `file` part"),
    ],
)
def test_bad_audio_gets_a_4xx_with_a_message(server, fields, file, filename, content_type,
                                               message) -> None:
    status, body = post_audio(server, fields, file, filename, content_type)
    assert status == 400, body
    assert message in body["error"]["message"]


def test_truncated_upload_and_non_multipart_body_are_refused(server) -> None:
    body, header = multipart({}, (FIXTURES / "command-01.wav").read_bytes())
    status, reply = http(server, "POST", "/v1/audio/transcriptions", body[: len(body) // 2],
                         headers={"Content-Type": header})
    assert status == 400 and reply["error"]["message"]
    status, reply = http(server, "POST", "/v1/audio/transcriptions", {"file": "x"})
    assert status == 400 and "multipart" in reply["error"]["message"]


# --- Wyoming -----------------------------------------------------------------------------------


async def _wyoming_transcribe(port: int, audio: bytes) -> tuple[Info, list]:
    async with AsyncTcpClient("127.0.0.1", port) as wy:
        await wy.write_event(Describe().event())
        info = Info.from_event(await wy.read_event())
    events = []
    async with AsyncTcpClient("127.0.0.1", port) as wy:
        await wy.write_event(Transcribe(language="en").event())
        await wy.write_event(AudioStart(rate=16000, width=2, channels=1).event())
        for offset in range(0, len(audio), 3200):
            chunk = AudioChunk(rate=16000, width=2, channels=1, audio=audio[offset:offset + 3200])
            await wy.write_event(chunk.event())
        await wy.write_event(AudioStop().event())
        while (event := await wy.read_event()) is not None:
            events.append(event)
            if Transcript.is_type(event.type):
                break
    return info, events


def test_wyoming_client_gets_info_and_a_streamed_transcript(server) -> None:
    info, events = asyncio.run(
        _wyoming_transcribe(server.services.wyoming_port, pcm("command-04.wav"))
    )
    program = info.asr[0]
    assert program.supports_transcript_streaming and "sv" in program.models[0].languages
    kinds = [e.type for e in events]
    assert kinds == [TranscriptStart(language="en").event().type,
                     TranscriptChunk(text="").event().type, TranscriptStop().event().type,
                     Transcript(text="").event().type]
    assert "dish" in Transcript.from_event(events[-1]).text.lower()


# --- priority and batching on the device -----------------------------------------------------


def _keep_device_busy(server) -> threading.Thread:
    """A background summary with a long prompt: many steps of background prefill."""
    prompt = "Summarise the household notes:\n" + "The boiler was serviced in March. " * 180

    def run() -> None:
        client(server).chat.completions.create(
            model="x", messages=[{"role": "user", "content": prompt}], max_tokens=2,
            extra_body={"fairlane_class": "background"})

    thread = threading.Thread(target=run)
    thread.start()
    device = server.services.device
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
        r.priority is Priority.BACKGROUND for r in device.policy.running.values()
    ):
        time.sleep(0.005)
    return thread


def test_utterance_during_a_background_job_runs_at_the_next_step_boundary(server) -> None:
    device = server.services.device
    busy = _keep_device_busy(server)
    text = client(server).audio.transcriptions.create(
        model="whisper-base", file=(FIXTURES / "command-05.wav").open("rb")).text
    busy.join(timeout=300)
    assert "door" in text.lower()
    arrival = [r for r in server.services.telemetry.done if r.kind is Kind.STT][-1].arrival
    records = list(device.records)
    stt_step = next(r for r in records if r.kind is Kind.STT and r.start >= arrival)
    started_between = [r for r in records if arrival <= r.start < stt_step.start]
    assert started_between == []  # nothing else started between its arrival and its step
    assert any(r.kind is Kind.LLM and Priority.BACKGROUND in r.classes and r.start > stt_step.end
               for r in records)  # and the background job went on after it


def test_concurrent_utterances_on_a_cpu_do_not_wait_for_one_batch_of_all(server) -> None:
    """Four commands spoken while the device is busy: on a 2-core CPU a Whisper batch shares
    nothing (it costs what its utterances do one by one), so the first speaker does not wait
    for everyone's words in one step; each utterance is transcribed, and well."""
    device = server.services.device
    busy = _keep_device_busy(server)
    names = ["command-00.wav", "command-03.wav", "command-06.wav", "command-08.wav"]
    texts: dict[str, str] = {}

    def send(name: str) -> None:
        texts[name] = client(server).audio.transcriptions.create(
            model="whisper-base", file=(FIXTURES / name).open("rb"), language="en").text

    threads = [threading.Thread(target=send, args=(n,)) for n in names]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    busy.join(timeout=300)
    steps = [r for r in device.records if r.kind is Kind.STT and r.start >= started]
    assert sum(len(r.request_ids) for r in steps) == 4
    assert len(steps) > 1
    assert min(r.end for r in steps) < max(r.start for r in steps)
    assert word_error_rate([COMMANDS[n] for n in names], [texts[n] for n in names]) <= 0.25


# --- streaming recognition over Wyoming --------------------------------------------------------

SILENCE = bytes(16000 * 2 * 8 // 10)  # 0.8 s: what a client's VAD waits before ending speech


async def _wyoming_stream(server, audio: bytes) -> tuple[str, float, float]:
    """Stream `audio`, wait until the device has started a speech step (at the pause), then
    end the utterance; returns the transcript, when the audio began and when it ended."""
    device = server.services.device
    async with AsyncTcpClient("127.0.0.1", server.services.wyoming_port) as wy:
        await wy.write_event(Transcribe(language="en").event())
        await wy.write_event(AudioStart(rate=16000, width=2, channels=1).event())
        sent = time.monotonic()
        for offset in range(0, len(audio), 1024):
            chunk = AudioChunk(rate=16000, width=2, channels=1, audio=audio[offset:offset + 1024])
            await wy.write_event(chunk.event())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
            r.kind is Kind.STT and r.start >= sent for r in list(device.records)
        ):
            await asyncio.sleep(0.01)
        stopped = time.monotonic()
        await wy.write_event(AudioStop().event())
        while (event := await wy.read_event()) is not None:
            if Transcript.is_type(event.type):
                return Transcript.from_event(event).text, sent, stopped
    raise AssertionError("no transcript")


def test_wyoming_transcribes_at_the_pause_before_the_utterance_ends(server) -> None:
    device = server.services.device
    text, sent, stopped = asyncio.run(
        _wyoming_stream(server, pcm("command-05.wav") + SILENCE)
    )
    assert "door" in text.lower()
    steps = [r for r in device.records if r.kind is Kind.STT and r.start >= sent]
    assert len(steps) == 1 and steps[0].start < stopped  # one step, begun before the end


def test_speech_after_the_pause_is_transcribed_too(server) -> None:
    """A second command after a pause: the early transcript of the first is dropped."""
    audio = pcm("command-05.wav") + SILENCE + pcm("command-00.wav") + SILENCE
    text, _, _ = asyncio.run(_wyoming_stream(server, audio))
    assert "door" in text.lower() and "kitchen" in text.lower()
