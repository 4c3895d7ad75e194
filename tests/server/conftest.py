"""A real Fairlane server (real model, real HTTP on 127.0.0.1) for the API tests."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from fairlane import config
from fairlane.server import BackgroundServer
from tests.pdf import pdf_bytes

__all__ = ["TOKEN", "pdf_bytes", "server_config"]

TOKEN = "test-token"


def server_config(policy: str = "fairlane", **llm: object) -> config.Config:
    data_dir = tempfile.mkdtemp(prefix="fairlane-test-")
    cfg = config.parse({"server": {"port": 0, "token": TOKEN, "data_dir": data_dir},
                        "wyoming": {"port": 0},
                        "llm": {"n_ctx": 4096, "n_seq_max": 8, "max_tokens": 64, **llm}})
    return replace(cfg, policy_name=policy)


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    with BackgroundServer(server_config()) as running:
        yield running


# How long a test waits for a model's answer or a server's state: a generous bound, never a
# measure of speed. A CI machine with another process on its cores runs llama.cpp several
# times slower (a 2,800-token prompt once timed out at 120 s there).
MODEL_WAIT_S = 600.0


def wait_for(
    what: Callable[[], Any], timeout_s: float = MODEL_WAIT_S, poll_s: float = 0.02
) -> Any:
    """Poll `what` until it returns something true (and return that); fail after `timeout_s`.
    For waiting on a server's state, never for timing it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := what():
            return result
        time.sleep(poll_s)
    raise AssertionError(f"not reached in {timeout_s:.0f} s")
