"""A real Fairlane server (from the server's own .venv) for Home Assistant to talk to."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAIRLANE = ROOT / ".venv" / "bin" / "fairlane"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class RunningServer:
    url: str
    wyoming_port: int


@pytest.fixture
def fairlane_server(
    socket_enabled: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    # The plugin blocks sockets unless `socket_enabled` is in use, and then only to 127.0.0.1.
    port, wyoming = _free_port(), _free_port()
    config = tmp_path_factory.mktemp("fairlane") / "fairlane.yaml"
    config.write_text(
        f"server: {{host: 127.0.0.1, port: {port}, data_dir: {config.parent}}}\n"
        f"wyoming: {{port: {wyoming}}}\n"
        "llm: {n_ctx: 2048}\n"
        "embed: {enabled: false}\n"
    )
    log = tmp_path_factory.mktemp("logs") / "fairlane.log"
    with log.open("w") as out:
        process = subprocess.Popen([str(FAIRLANE), "serve", "--config", str(config)],
                                   stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError as err:
                if process.poll() is not None or time.monotonic() > deadline:
                    message = f"fairlane did not start: {log.read_text()[-2000:]}"
                    raise RuntimeError(message) from err
                time.sleep(0.2)
        yield RunningServer(f"http://127.0.0.1:{port}", wyoming)
    finally:
        process.terminate()
        process.wait(timeout=30)
