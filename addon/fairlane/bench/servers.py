"""Servers as separate processes, and a streaming client that measures what a person feels."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """A server started as a subprocess, ready once /health answers (or `ready(port)` says so);
    stopped on exit."""

    def __init__(
        self,
        argv: list[str],
        port: int,
        env: dict[str, str] | None = None,
        ready_path: str = "/health",
        timeout_s: float = 180,
        ready: Callable[[int], bool] | None = None,
    ) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)  # noqa: SIM115
        self.process = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        is_ready = ready or (lambda _: self._http_ready(ready_path))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {Path(self.log.name).read_text()[-2000:]}")
            if is_ready(port):
                return
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"server not ready in {timeout_s:.0f} s")

    def _http_ready(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(self.url + path, timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def fairlane_server(
    policy: str,
    threads: int,
    n_seq_max: int,
    extra: dict[str, Any] | None = None,
    checkout: Path | None = None,
) -> ServerProcess:
    """`fairlane serve` on the default model, configured by a temporary YAML file; `checkout`:
    the server's code from another checkout (an earlier commit), on this environment."""
    port = free_port()
    path = Path(tempfile.mkdtemp()) / "fairlane.yaml"
    path.write_text(yaml.safe_dump(server_config(port, threads, n_seq_max, extra)))
    argv = [sys.executable, "-m", "fairlane", "serve", "--config", str(path), "--policy", policy]
    env = {**os.environ, "PYTHONPATH": str(checkout.resolve() / "addon")} if checkout else None
    return ServerProcess(argv, port, env)


def server_config(
    port: int, threads: int, n_seq_max: int, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A bench server's config. `threads` equal to the cores this process owns is the
    server's own choice (`llm.threads: 0`), so it runs as it ships: it sizes its threads and
    gives one up while a neighbour holds a core (`llm.give_way`); fewer are fixed."""
    owned = len(os.sched_getaffinity(0))
    cfg: dict[str, Any] = {
        "server": {"port": port, "data_dir": tempfile.mkdtemp(prefix="fairlane-bench-")},
        "wyoming": {"port": 0},
        "llm": {"threads": 0 if threads == owned else threads, "n_seq_max": n_seq_max,
                "n_ctx": 8192},
    }
    for section, values in (extra or {}).items():
        if isinstance(values, dict):
            cfg.setdefault(section, {}).update(values)
        else:  # a list section (`remotes`)
            cfg[section] = values
    return cfg


@dataclass
class StreamTiming:
    """One streamed completion as the client saw it."""

    sent: float
    token_times: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.sent if self.token_times else None

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:], strict=False)]


def stream_chat(
    url: str,
    messages: list[dict[str, Any]],
    max_tokens: int,
    extra: dict[str, Any] | None = None,
    token: str | None = None,
    stop: threading.Event | None = None,
) -> StreamTiming:
    """POST a streaming chat completion and time every content chunk (plain HTTP, no SDK).

    When `stop` is set the client hangs up (the server cancels the stream), and the timing
    says it was stopped."""
    body = {
        "model": "default",
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0,
        **(extra or {}),
    }
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    timing = StreamTiming(time.monotonic())
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            for raw in response:
                if stop is not None and stop.is_set():
                    timing.error = "stopped by the client"
                    break
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                choices = chunk.get("choices") or []
                if choices and (choices[0].get("delta") or {}).get("content"):
                    timing.token_times.append(time.monotonic())
    except OSError as err:
        timing.error = str(err)
    return timing


def post_transcription(
    url: str,
    audio: bytes,
    fields: dict[str, str] | None = None,
    filename: str = "speech.wav",
    token: str | None = None,
) -> dict[str, Any]:
    """POST one file to /v1/audio/transcriptions as multipart (plain HTTP, no SDK)."""
    boundary = "fairlane-bench"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in (fields or {}).items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
        f'filename="{filename}"\r\nContent-Type: audio/wav\r\n\r\n'.encode()
        + audio
        + f"\r\n--{boundary}--\r\n".encode()
    )
    request = urllib.request.Request(
        f"{url}/v1/audio/transcriptions",
        data=b"".join(parts),
        method="POST",
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=600) as response:
        return dict(json.loads(response.read()))
