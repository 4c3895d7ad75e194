"""Who may claim which class: each client token's ceiling (`server.clients`), and what the
server says at start when it listens beyond this machine without authentication."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from fairlane import config
from fairlane.api.common import request_class
from fairlane.policy import Priority
from fairlane.server import auth_middleware, error_middleware
from fairlane.startup import exposure_warnings

SERVER = config.parse({
    "server": {
        "token": "household-admin",
        "clients": [
            {"name": "automations", "token": "automations-token", "max_class": "background"},
            {"name": "kids-tablet", "token": "kids-tablet-token", "max_class": "chat"},
        ],
    }
}).server


async def _classes(requests: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """The class each request would run at, as a handler resolves it behind the real auth."""

    async def which(request: web.Request) -> web.Response:
        priority = request_class(request, await request.json(), Priority.CHAT)
        return web.json_response(priority.label)

    app = web.Application(middlewares=[error_middleware, auth_middleware(SERVER)])
    app.router.add_post("/v1/chat/completions", which)
    answers = []
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        for token, body in requests:
            reply = await client.post(
                "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {token}"}
            )
            answers.append(await reply.json() if reply.status == 200 else reply.status)
    return answers


def test_a_client_token_runs_at_most_at_its_ceiling() -> None:
    answers = asyncio.run(_classes([
        ("household-admin", {"fairlane_class": "voice"}),
        ("automations-token", {"fairlane_class": "voice"}),
        ("automations-token", {"priority": -5}),
        ("automations-token", {}),
        ("kids-tablet-token", {"fairlane_class": "voice"}),
        ("kids-tablet-token", {"fairlane_class": "background"}),
        ("kids-tablet-token", {}),
        ("not-a-token", {"fairlane_class": "background"}),
    ]))
    assert answers == [
        "voice",  # the main token may claim every class
        "background", "background", "background",  # automations: never above background
        "chat", "background", "chat",  # the tablet: chat at most, lower when asked
        401,
    ]


def test_client_tokens_are_checked_when_no_main_token_is_set() -> None:
    server = config.parse(
        {"server": {"clients": [{"name": "automations", "token": "automations-token",
                                 "max_class": "background"}]}}
    ).server
    assert server.authenticated
    assert not config.parse({}).server.authenticated


def test_listening_beyond_this_machine_without_a_token_is_said_at_start() -> None:
    local = config.parse({})
    assert exposure_warnings(local) == []
    open_http = config.parse({"server": {"host": "0.0.0.0"}, "wyoming": {"host": "127.0.0.1"}})
    (warning,) = exposure_warnings(open_http)
    assert "without a token" in warning and "voice" in warning
    guarded = config.parse({"server": {"host": "0.0.0.0", "token": "a-long-token"}})
    (wyoming,) = exposure_warnings(guarded)
    assert "Wyoming" in wyoming and "without authentication" in wyoming
    assert "8 connections" in wyoming
