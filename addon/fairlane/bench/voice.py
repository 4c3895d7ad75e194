"""`fairlane bench voice`: the voice lane's two ends, as a satellite meets them.

1. **Recognition while speaking.** Each household command is streamed over Wyoming in real time
   (32 ms chunks) followed by 0.7 s of silence, the time Home Assistant's VAD waits (default
   sensitivity) before it ends the utterance. Two servers, one transcribing at the speaker's
   first pause (`wyoming.early_transcript: true`, the default) and one only at audio-stop,
   take turns command by command. Reported from the end of the speech (the recording's last
   sample) and from audio-stop to the transcript.
2. **Speech synthesis.** Household replies of one to three sentences through
   `/v1/audio/speech` with `stream_format: audio`: time to the first audio, whole reply, and the
   real-time factor; then the same with the device busy with background work (two long
   summaries in flight and documents being embedded, as `background`), idle and loaded
   alternating.
3. **Beside a separate voice server** (`--targets separate`, after
   `scripts/install-baselines.sh`): the same replies over Wyoming `synthesize` to Fairlane and to
   `wyoming-piper` 2.5.2 (Piper's own server, GPL, in its own venv under `.bench/`) speaking the
   same voice file, taking turns reply by reply; idle, then with the same background load on
   the Fairlane server, which the separate voice server shares the two cores with.

Every round is printed; the tables give p50 / p95 and the ratios.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import threading
import time
import urllib.request
import uuid
import wave
from pathlib import Path
from typing import Any

from fairlane.bench.family_targets import BASELINES, wyoming_ready
from fairlane.bench.servers import ServerProcess, fairlane_server, free_port
from fairlane.engines import models
from fairlane.runtime.metrics import percentile

SILENCE_S = 0.7  # Home Assistant's VAD: silence before it ends an utterance (default sensitivity)
CHUNK = 1024  # bytes: 32 ms of 16 kHz 16-bit audio
REPLIES = [
    "The kitchen lights are on.",
    "The front door is locked, and the garage door is closed.",
    "Tomorrow will be cloudy with a high of twelve degrees. Rain is likely in the evening. "
    "Take an umbrella if you go out.",
    "I set a timer for ten minutes.",
    "Your package was delivered to the porch this afternoon. I turned on the porch light.",
]
NOTE = "The boiler was serviced in March and the filter replaced; the invoice is in the drawer. "


def _post(url: str, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        f"{url}{path}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    return urllib.request.urlopen(request, timeout=600)


async def _stream_command(port: int, audio: bytes) -> tuple[float, float]:
    """Seconds from the end of speech and from audio-stop to the transcript."""
    from wyoming.asr import Transcribe, Transcript
    from wyoming.audio import AudioChunk, AudioStart, AudioStop
    from wyoming.client import AsyncTcpClient

    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Transcribe(language="en").event())
        await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
        padded = audio + bytes(int(SILENCE_S * 16000) * 2)
        start = time.perf_counter()
        speech_end = start + len(audio) / 32000
        for offset in range(0, len(padded), CHUNK):
            due = start + (offset + CHUNK) / 32000  # a chunk is sent once it has been spoken
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            piece = padded[offset : offset + CHUNK]
            await client.write_event(
                AudioChunk(rate=16000, width=2, channels=1, audio=piece).event()
            )
        stopped = time.perf_counter()
        await client.write_event(AudioStop().event())
        while (event := await client.read_event()) is not None:
            if Transcript.is_type(event.type):
                done = time.perf_counter()
                return done - speech_end, done - stopped
    raise RuntimeError("the server closed the connection without a transcript")


def _wyoming_port(server: ServerProcess) -> int:
    with urllib.request.urlopen(f"{server.url}/health", timeout=30) as response:
        return int(json.loads(response.read())["wyoming_port"])


def recognition(fixtures: Path, threads: int, rounds: int) -> dict[str, Any]:
    names = sorted(p.name for p in fixtures.glob("*.wav"))
    audio = {}
    for name in names:
        with wave.open(str(fixtures / name)) as wav:
            audio[name] = wav.readframes(wav.getnframes())
    results: dict[str, dict[str, list[float]]] = {}
    with (
        fairlane_server("fairlane", threads, 8, {"wyoming": {"early_transcript": True}}) as early,
        fairlane_server("fairlane", threads, 8, {"wyoming": {"early_transcript": False}}) as late,
    ):
        targets = {"at the pause": _wyoming_port(early), "at audio-stop": _wyoming_port(late)}
        for port in targets.values():  # equal warm-up
            asyncio.run(_stream_command(port, audio[names[0]]))
        for round_ in range(rounds):
            for name in names:
                for label, port in targets.items():
                    from_speech, from_stop = asyncio.run(_stream_command(port, audio[name]))
                    row = results.setdefault(label, {"speech": [], "stop": []})
                    row["speech"].append(from_speech)
                    row["stop"].append(from_stop)
                    print(
                        f"round {round_ + 1} {name} {label:14} end of speech → transcript "
                        f"{from_speech:.2f} s, audio-stop → transcript {from_stop:.2f} s",
                        flush=True,
                    )
    return results


class Load:
    """Background work: summaries in flight (a closed loop) and documents embedded."""

    def __init__(self, url: str, summaries: int = 2) -> None:
        self.url, self.stop = url, threading.Event()
        self.threads = [
            threading.Thread(target=self._summaries, daemon=True) for _ in range(summaries)
        ]
        self.threads.append(threading.Thread(target=self._documents, daemon=True))

    def _summaries(self) -> None:
        while not self.stop.is_set():
            prompt = f"{uuid.uuid4().hex} Summarise these household notes:\n" + NOTE * 40
            body = {
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 64,
                "fairlane_class": "background",
                "user": "summaries",
            }
            with _post(self.url, "/v1/chat/completions", body) as response:
                response.read()

    def _documents(self) -> None:
        while not self.stop.is_set():
            texts = [f"{uuid.uuid4().hex} {NOTE * 3}" for _ in range(64)]
            body = {
                "input": texts,
                "model": "x",
                "fairlane_class": "background",
                "user": "documents",
            }
            with _post(self.url, "/v1/embeddings", body) as response:
                response.read()

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        time.sleep(5)  # the summaries' prompts are being prefilled
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=600)


def _loaded(url: str, condition: str) -> contextlib.AbstractContextManager[object]:
    """The background load for a "loaded" round; nothing for an idle one."""
    return Load(url) if condition == "loaded" else contextlib.nullcontext()


def _speak(url: str, text: str) -> dict[str, float]:
    body = {"input": text, "response_format": "wav", "stream_format": "audio"}
    sent = time.perf_counter()
    first = None
    received = 0
    with _post(url, "/v1/audio/speech", body) as response:
        response.read(44)  # the WAV header
        while chunk := response.read1(65536):
            received += len(chunk)
            first = first or time.perf_counter()
    done = time.perf_counter()
    audio_s = received / 2 / 22050
    return {
        "first_audio": (first or done) - sent,
        "whole": done - sent,
        "rtf": (done - sent) / audio_s if audio_s else 0.0,
    }


def synthesis(threads: int, rounds: int) -> dict[str, Any]:
    results: dict[str, dict[str, list[float]]] = {}
    with fairlane_server("fairlane", threads, 8) as server:
        _speak(server.url, REPLIES[0])  # warm-up
        for round_ in range(rounds):
            for condition in ("idle", "loaded"):
                with _loaded(server.url, condition):
                    for text in REPLIES:
                        row = _speak(server.url, text)
                        values = results.setdefault(condition, {})
                        for key, value in row.items():
                            values.setdefault(key, []).append(value)
                        print(
                            f"round {round_ + 1} {condition:6} {len(text):3} chars: first audio "
                            f"{row['first_audio']:.2f} s, whole {row['whole']:.2f} s, "
                            f"RTF {row['rtf']:.3f}",
                            flush=True,
                        )
    return results


async def _wyoming_speak(port: int, text: str) -> dict[str, float]:
    from wyoming.audio import AudioChunk, AudioStop
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize

    async with AsyncTcpClient("127.0.0.1", port) as client:
        sent = time.perf_counter()
        await client.write_event(Synthesize(text=text).event())
        first = None
        while (event := await client.read_event()) is not None:
            if AudioChunk.is_type(event.type):
                first = first or time.perf_counter()
            elif AudioStop.is_type(event.type):
                done = time.perf_counter()
                return {"first_audio": (first or done) - sent, "whole": done - sent}
    raise RuntimeError("the voice server closed the connection")


def _piper_server() -> ServerProcess:
    program = BASELINES / "wyoming-piper/bin/wyoming-piper"
    if not program.is_file():
        raise ValueError(f"no {program}: run scripts/install-baselines.sh first")
    voice = models.resolve_voice(models.DEFAULT_VOICE)
    port = free_port()
    argv = [
        str(program),
        "--voice",
        voice.name.removesuffix(".onnx"),
        "--data-dir",
        str(voice.parent),
        "--uri",
        f"tcp://127.0.0.1:{port}",
    ]
    return ServerProcess(argv, port, ready=wyoming_ready)


def against_separate(threads: int, rounds: int) -> dict[str, Any]:
    results: dict[str, dict[str, list[float]]] = {}
    with fairlane_server("fairlane", threads, 8) as server, _piper_server() as piper:
        targets = {"fairlane": _wyoming_port(server), "wyoming-piper": piper.port}
        for port in targets.values():  # equal warm-up
            asyncio.run(_wyoming_speak(port, REPLIES[0]))
        for round_ in range(rounds):
            for condition in ("idle", "loaded"):
                with _loaded(server.url, condition):
                    for text in REPLIES:
                        for label, port in targets.items():
                            row = asyncio.run(_wyoming_speak(port, text))
                            values = results.setdefault(f"{label} {condition}", {})
                            for key, value in row.items():
                                values.setdefault(key, []).append(value)
                            print(
                                f"round {round_ + 1} {label:13} {condition:6} {len(text):3} "
                                f"chars: first audio {row['first_audio']:.2f} s, whole "
                                f"{row['whole']:.2f} s",
                                flush=True,
                            )
    return results


def _cell(values: list[float]) -> str:
    return f"{percentile(values, 50) or 0:.2f} / {percentile(values, 95) or 0:.2f}"


def voice(fixtures: Path, threads: int, rounds: int, targets: str = "fairlane") -> dict[str, Any]:
    if "separate" in targets.split(","):
        beside = against_separate(threads, rounds)
        print("\nover Wyoming, seconds p50 / p95     first audio      whole reply")
        for label, row in beside.items():
            print(f"  {label:22} {_cell(row['first_audio']):>14} {_cell(row['whole']):>16}")
        for condition in ("idle", "loaded"):
            ratio = statistics.median(beside[f"fairlane {condition}"]["first_audio"]) / (
                statistics.median(beside[f"wyoming-piper {condition}"]["first_audio"])
            )
            print(f"  first audio, fairlane ÷ wyoming-piper, {condition} (p50): {ratio:.2f}")
        return {"against_separate": beside}
    heard = recognition(fixtures, threads, rounds)
    spoken = synthesis(threads, rounds)
    print(
        "\nrecognition, seconds p50 / p95      end of speech → transcript  audio-stop → transcript"
    )
    for label, row in heard.items():
        print(f"  transcribed {label:14} {_cell(row['speech']):>26} {_cell(row['stop']):>24}")
    ratio = statistics.median(heard["at the pause"]["speech"]) / statistics.median(
        heard["at audio-stop"]["speech"]
    )
    print(f"  end of speech → transcript, at the pause ÷ at audio-stop (p50): {ratio:.2f}")
    print("\nsynthesis, seconds p50 / p95   first audio      whole reply    real-time factor")
    for condition, row in spoken.items():
        print(
            f"  {condition:6} {_cell(row['first_audio']):>22} {_cell(row['whole']):>16} "
            f"{_cell(row['rtf']):>18}"
        )
    loaded = statistics.median(spoken["loaded"]["first_audio"]) / statistics.median(
        spoken["idle"]["first_audio"]
    )
    print(f"  first audio loaded ÷ idle (p50): {loaded:.2f} (goal ≤ 1.3)")
    return {"recognition": heard, "synthesis": spoken, "early_ratio": ratio, "loaded_ratio": loaded}
