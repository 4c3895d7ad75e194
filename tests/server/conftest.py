"""A real Fairlane server (real model, real HTTP on 127.0.0.1) for the API tests."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import replace

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
