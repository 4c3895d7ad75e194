"""Faults around the device loop. One outside its engines (a bug in the policy's bookkeeping):
the loop stops, but no client waits for it forever. Its requests end with an error, new ones
get a 503 at once, and /health fails so that the add-on's watchdog restarts the server. And
/v1/stats, read while the loop appends its steps."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from fairlane import server as server_module
from fairlane.policy import Kind
from fairlane.server import BackgroundServer
from tests.server.conftest import server_config, wait_for
from tests.server.test_chat_api import http

CHAT = "/v1/chat/completions"


def test_a_fault_in_the_device_loop_ends_its_requests_and_fails_health() -> None:
    with BackgroundServer(server_config()) as running:
        loop = running.services.device.loop_for(Kind.LLM)
        apply = loop.policy.update_from_output
        steps = 0

        def faulty(plan: Any, result: Any, now: float) -> Any:
            nonlocal steps
            steps += 1
            if steps == 3:  # the request's prefill and first decodes have run
                raise RuntimeError("a bookkeeping bug")
            return apply(plan, result, now)

        loop.policy.update_from_output = faulty  # type: ignore[method-assign]
        answered: dict[str, Any] = {}

        def ask() -> None:
            body = {"messages": [{"role": "user", "content": "Count to twenty."}],
                    "max_tokens": 32, "temperature": 0}
            answered["reply"] = http(running, "POST", CHAT, body)

        asker = threading.Thread(target=ask)
        asker.start()
        # The request in flight when the loop stopped gets an error, not silence.
        wait_for(lambda: "reply" in answered)
        asker.join()
        status, reply = answered["reply"]
        assert status == 500, reply
        assert "loop stopped" in reply["error"]["message"]
        assert "a bookkeeping bug" in reply["error"]["message"]
        assert steps == 3

        status, health = http(running, "GET", "/health", token=None)
        assert status == 503
        assert health["status"] == "failed"
        assert "a bookkeeping bug" in health["faults"][loop.name]

        # Work for the stopped loop is refused at once, with a reason, and nothing runs.
        status, reply = http(running, "POST", CHAT, {
            "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
        assert status == 503, reply
        assert reply["error"]["code"] == "device_failed"
        assert "restarted" in reply["error"]["message"]
        assert steps == 3


def test_stats_read_a_copy_of_the_steps_the_device_loop_appends_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by `bench family`: /v1/stats answered 500 ("deque mutated during iteration")
    when the device loop appended a step while the handler read the loop's records. The
    loop's append is made to happen mid-read here."""
    with BackgroundServer(server_config()) as running:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert http(running, "POST", CHAT, body)[0] == 200  # some steps to read
        loop = running.services.device.loop_for(Kind.LLM)
        read = server_module.background_steps

        def while_the_loop_appends(records: Any, *args: Any) -> Any:
            def appending() -> Any:
                for index, record in enumerate(records):
                    if index == 0:
                        loop.records.append(record)  # the device thread's next step
                    yield record

            return read(appending(), *args)

        monkeypatch.setattr(server_module, "background_steps", while_the_loop_appends)
        status, stats = http(running, "GET", "/v1/stats")
        assert status == 200, stats
        assert "background_steps" in stats
