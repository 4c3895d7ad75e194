"""The remote lane's own rules, without a network: order, window and the breaker's states.
(The lane against a real second server is in tests/server/test_workers.py.)"""

from __future__ import annotations

import asyncio

import pytest

from fairlane.config import RemoteConfig
from fairlane.policy import Kind, PolicyConfig, Priority, Request
from fairlane.runtime.remote import Breaker, RemoteError, RemoteLane


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _lane(clock: Clock, **settings: object) -> RemoteLane:
    config = RemoteConfig("attic", "http://127.0.0.1:9", **settings)  # type: ignore[arg-type]
    return RemoteLane(config, PolicyConfig(), clock=clock)


def _request(name: str, priority: Priority = Priority.BACKGROUND, client: str = "a") -> Request:
    return Request(name, Kind.LLM, priority, client, 0.0, prompt_tokens=100)


def test_the_breaker_opens_after_failures_in_a_row_and_one_probe_closes_it() -> None:
    breaker = Breaker(failures_to_open=3, open_s=30)
    assert not breaker.failure(0, "refused") and not breaker.failure(1, "refused")
    breaker.success()  # a success in between: the count starts again
    assert not breaker.failure(2, "refused") and not breaker.failure(3, "refused")
    assert breaker.failure(4, "refused") and breaker.state(5) == "open"
    assert breaker.state(34) == "half-open" and breaker.retry_after(20) == 14
    breaker.probing = True
    assert breaker.failure(35, "refused") and breaker.state(36) == "open"  # the probe failed
    breaker.success()
    assert breaker.state(37) == "closed"


def test_an_open_breaker_refuses_at_once_and_fails_the_waiting() -> None:
    async def run() -> None:
        clock = Clock()
        lane = _lane(clock, max_in_flight=1, failures_to_open=1, open_s=10)
        async with lane.slot(_request("r1")):
            waiting = asyncio.ensure_future(lane.slot(_request("r2")).__aenter__())
            await asyncio.sleep(0)
            assert len(lane.queues[Priority.BACKGROUND]) == 1
            lane.count_failure(RemoteError(502, "connection refused", "remote_failed"))
            with pytest.raises(RemoteError) as err:
                await waiting
            assert err.value.status == 503 and err.value.code == "remote_unavailable"
        with pytest.raises(RemoteError):
            async with lane.slot(_request("r3")):
                pass
        assert lane.in_flight == 0 and not lane.waiters

    asyncio.run(run())


def test_a_probe_whose_client_left_lets_the_next_request_probe() -> None:
    async def run() -> None:
        clock = Clock()
        lane = _lane(clock, failures_to_open=1, open_s=5)
        lane.count_failure(RemoteError(502, "down", "remote_failed"))
        clock.now = 6  # half-open: one request may go
        async with lane.slot(_request("probe")):
            assert lane.breaker.probing
        # Neither success nor failure (the client went away): the next one probes.
        async with asyncio.timeout(1):
            async with lane.slot(_request("next")):
                assert lane.breaker.probing

    asyncio.run(run())


def test_the_window_follows_the_remotes_time_to_first_token() -> None:
    clock = Clock()
    lane = _lane(clock, max_in_flight=8, window_ttft_ms=1000)
    lane._measured(2.5, window_was_full=True)
    assert lane.window == 4  # slower than the target: halved
    lane._measured(0.8, window_was_full=True)
    assert lane.window == 4  # within the target, not under half of it: kept
    lane._measured(0.2, window_was_full=False)
    assert lane.window == 4  # fast, but the window was not what held requests back
    lane._measured(0.2, window_was_full=True)
    assert lane.window == 5


def test_a_lane_serving_chat_keeps_chats_itl_target() -> None:
    clock = Clock()
    chat = _lane(clock, max_in_flight=8, classes=("chat", "background"))
    assert chat.itl_target_s == 0.1  # the chat class's ITL target (PolicyConfig's 100 ms)
    chat._measured_itl([0.05, 0.08, 0.09])
    assert chat.window == 8
    chat._measured_itl([0.05, 0.3, 0.4])  # median gap 300 ms: the remote's batch is too full
    assert chat.window == 4
    background = _lane(clock, max_in_flight=8)
    assert background.itl_target_s is None
    background._measured_itl([5.0, 5.0, 5.0])  # nobody reads a background reply as it comes
    assert background.window == 8
