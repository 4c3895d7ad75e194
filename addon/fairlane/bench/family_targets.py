"""The targets `fairlane bench family` plays against, each started fresh for every round:
Fairlane (any policy, with or without a remote lane) and the separate stack households run
today (llama-server, wyoming-faster-whisper, an embedding server)."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import urllib.request
import wave
from pathlib import Path
from typing import Any, Protocol

import yaml

from fairlane.bench.servers import (
    ServerProcess,
    StreamTiming,
    fairlane_server,
    free_port,
    post_transcription,
    stream_chat,
)
from fairlane.engines import models
from fairlane.sim.workload import Job

TARGETS = ("fairlane", "fcfs", "separate", "fairlane+remote")
BASELINES = Path(".bench")



class Target(Protocol):
    name: str

    def transcribe(self, audio: bytes, client: str) -> str: ...

    def chat(
        self, messages: list[dict[str, str]], max_tokens: int, job: Job, stop: threading.Event
    ) -> StreamTiming: ...

    def embed(self, texts: list[str], client: str) -> None: ...

    def close(self) -> None: ...


def _post_json(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


class FairlaneTarget:
    """`fairlane serve` with a policy; every request says its class and member."""

    def __init__(
        self,
        policy: str,
        threads: int,
        extra: dict[str, Any] | None = None,
        checkout: Path | None = None,
    ) -> None:
        self.name = policy
        self.server = fairlane_server(policy, threads, 8, extra, checkout)

    def transcribe(self, audio: bytes, client: str) -> str:
        fields = {"language": "en", "user": client, "fairlane_class": "voice"}
        return str(post_transcription(self.server.url, audio, fields)["text"])

    def chat(
        self, messages: list[dict[str, str]], max_tokens: int, job: Job, stop: threading.Event
    ) -> StreamTiming:
        extra = {"fairlane_class": job.priority.label, "user": job.client}
        return stream_chat(self.server.url, messages, max_tokens, extra, stop=stop)

    def embed(self, texts: list[str], client: str) -> None:
        body = {"input": texts, "fairlane_class": "background", "user": client}
        _post_json(f"{self.server.url}/v1/embeddings", body)

    def stats(self, steps_window_s: float | None = None) -> dict[str, Any]:
        """The server's `/v1/stats`; its step figures over the last `steps_window_s`."""
        query = "" if steps_window_s is None else f"?steps_window_s={steps_window_s:.1f}"
        with urllib.request.urlopen(f"{self.server.url}/v1/stats{query}", timeout=30) as response:
            return dict(json.loads(response.read()))

    def close(self) -> None:
        self.server.close()


class RemoteLaneTarget(FairlaneTarget):
    """`fairlane+remote`: rule 10 on one machine. Two `fairlane serve` processes share the
    threads: the household's server (voice, chat, embeddings, on its half) binds `background`
    to a remote lane, and the second server (the other half, LLM only) is that remote. On a
    real second machine the remote adds its own device; here it only separates the lanes."""

    def __init__(self, threads: int) -> None:
        half = max(1, threads // 2)
        off = {"enabled": False}
        self.remote = fairlane_server(
            "fairlane", half, 8, {"stt": off, "tts": off, "embed": off, "wyoming": off}
        )
        try:
            lane = [{"name": "remote", "url": f"{self.remote.url}/v1"}]
            super().__init__("fairlane", max(1, threads - half), {"remotes": lane})
        except Exception:
            self.remote.close()
            raise
        self.name = "fairlane+remote"

    def close(self) -> None:
        super().close()
        self.remote.close()


class SeparateStack:
    """llama-server, wyoming-faster-whisper and an embedding server, as separate processes,
    each on its defaults for this machine (every one uses all the cores)."""

    name = "separate"

    def __init__(self, threads: int, parallel: int = 8) -> None:
        from fairlane.bench.llm import llama_server

        self._servers: list[ServerProcess] = []
        try:
            self.llm = llama_server(parallel, threads, unified=True)
            self._servers.append(self.llm)
            self.whisper_port = free_port()
            self._servers.append(self._whisper(threads))
            self.embedder = self._embedding_server(threads)
            self._servers.append(self.embedder)
        except Exception:
            self.close()
            raise

    def _whisper(self, threads: int) -> ServerProcess:
        python = BASELINES / "wyoming-faster-whisper/bin/python"
        if not python.is_file():
            raise ValueError(f"no {python}: run scripts/install-baselines.sh first")
        argv = [
            str(python),
            "-m",
            "wyoming_faster_whisper",
            "--uri",
            f"tcp://127.0.0.1:{self.whisper_port}",
            "--model",
            models.resolve_stt(models.DEFAULT_STT),
            "--data-dir",
            str(BASELINES / "whisper-data"),
            "--language",
            "en",
            "--cpu-threads",
            str(threads),
        ]
        return ServerProcess(argv, self.whisper_port, ready=wyoming_ready)

    def _embedding_server(self, threads: int) -> ServerProcess:
        python = BASELINES / "embedding-server/bin/python"
        if not python.is_file():
            raise ValueError(f"no {python}: run scripts/install-baselines.sh first")
        model = embedding_model_copy()
        port = free_port()
        script = Path(__file__).with_name("embedding_server.py")
        argv = [str(python), str(script), str(model), str(port), str(threads)]
        return ServerProcess(argv, port, timeout_s=600)

    def transcribe(self, audio: bytes, client: str) -> str:
        return asyncio.run(_wyoming_transcribe(self.whisper_port, audio))

    def chat(
        self, messages: list[dict[str, str]], max_tokens: int, job: Job, stop: threading.Event
    ) -> StreamTiming:
        return stream_chat(self.llm.url, messages, max_tokens, stop=stop)

    def embed(self, texts: list[str], client: str) -> None:
        _post_json(f"{self.embedder.url}/v1/embeddings", {"input": texts})

    def close(self) -> None:
        for server in self._servers:
            server.close()


def embedding_model_copy() -> Path:
    """A writable copy of the packaged embedding model: the baseline writes its int8 ONNX
    export beside it."""
    model = BASELINES / "embed-model"
    if not (model / "config.json").exists():
        shutil.copytree(models.resolve_embedder(models.DEFAULT_EMBED), model)
    return model


def wyoming_ready(port: int) -> bool:
    """A Wyoming server is ready when it answers `describe` with its `info`."""
    from wyoming.client import AsyncTcpClient
    from wyoming.info import Describe

    async def ask() -> bool:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Describe().event())
            event = await asyncio.wait_for(client.read_event(), timeout=5)
            return event is not None and event.type == "info"

    try:
        return asyncio.run(ask())
    except (TimeoutError, OSError):
        return False


async def _wyoming_transcribe(port: int, audio: bytes) -> str:
    """Send a recording as a satellite's pipeline does (transcribe, audio, stop)."""
    import io

    from wyoming.asr import Transcribe, Transcript
    from wyoming.audio import AudioChunk, AudioStart, AudioStop
    from wyoming.client import AsyncTcpClient

    with wave.open(io.BytesIO(audio), "rb") as wav:
        rate, width, channels = wav.getframerate(), wav.getsampwidth(), wav.getnchannels()
        pcm = wav.readframes(wav.getnframes())
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Transcribe(language="en").event())
        await client.write_event(AudioStart(rate, width, channels).event())
        step = rate * width * channels // 10  # 100 ms chunks
        for offset in range(0, len(pcm), step):
            chunk = AudioChunk(rate, width, channels, pcm[offset : offset + step])
            await client.write_event(chunk.event())
        await client.write_event(AudioStop().event())
        while True:
            event = await client.read_event()
            if event is None:
                raise OSError("the speech server closed the connection")
            if Transcript.is_type(event.type):
                return str(Transcript.from_event(event).text)


def start_target(name: str, threads: int) -> Target:
    """A target by name; `fairlane:PROFILE` is Fairlane planning with that cost profile (a
    shipped name or a YAML path), and `fairlane@SETTING=VALUE` (repeatable) with a policy
    setting changed, to compare profiles or settings on one load, rounds interleaved;
    `fairlane@checkout=DIR`: the server's code from another checkout of Fairlane (an earlier
    commit: `git worktree add DIR COMMIT`), for a before-and-after on one load; a dotted
    setting is another section's (`fairlane@llm.give_way=true`)."""
    if name == "separate":
        return SeparateStack(threads)
    if name == "fairlane+remote":
        return RemoteLaneTarget(threads)
    policy, extra, checkout = target_config(name)
    target = FairlaneTarget(policy, threads, extra or None, checkout)
    target.name = name
    return target


def target_config(name: str) -> tuple[str, dict[str, Any], Path | None]:
    """A Fairlane target's policy, the config sections it sets over the bench's, and the
    checkout whose server it runs (None: this one)."""
    policy, profile, settings = target_parts(name)
    extra: dict[str, Any] = {}
    if profile:
        extra["server"] = {"profile": profile}
    checkout = settings.pop("checkout", None)
    for key in [k for k in settings if "." in k]:
        section, _, setting = key.partition(".")
        extra.setdefault(section, {})[setting] = settings.pop(key)
    if settings:
        extra["policy"] = settings
    return policy, extra, Path(checkout) if checkout else None


def target_parts(name: str) -> tuple[str, str, dict[str, Any]]:
    """`policy[:profile][@setting=value...]` as its policy, profile ("" for the default) and
    policy settings; a malformed setting raises ValueError."""
    head, *assignments = name.split("@")
    policy, _, profile = head.partition(":")
    settings: dict[str, Any] = {}
    for assignment in assignments:
        key, sep, value = assignment.partition("=")
        if not sep or not key:
            raise ValueError(f"target {name!r}: expected @SETTING=VALUE, got {assignment!r}")
        settings[key] = yaml.safe_load(value)
    return policy, profile, settings
