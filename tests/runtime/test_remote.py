"""The remote lane's own rules, without a network: order, window and the breaker's states.
(The lane against a real second server is in tests/server/test_workers.py.)"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from fairlane.config import RemoteConfig
from fairlane.policy import Kind, PolicyConfig, Priority, Request
from fairlane.runtime.remote import Breaker, RemoteEngine, RemoteError, RemoteLane


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _lane(clock: Clock, **settings: object) -> RemoteLane:
    config = RemoteConfig("attic", "http://127.0.0.1:9", **settings)  # type: ignore[arg-type]
    return RemoteLane.of([config], PolicyConfig(), clock=clock)


def _engine(clock: Clock, **settings: object) -> RemoteEngine:
    return _lane(clock, **settings).engines[0]


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
            lane.count_failure(lane.engines[0], RemoteError(502, "connection refused",
                                                            "remote_failed"))
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
        lane.count_failure(lane.engines[0], RemoteError(502, "down", "remote_failed"))
        clock.now = 6  # half-open: one request may go
        async with lane.slot(_request("probe")):
            assert lane.engines[0].breaker.probing
        # Neither success nor failure (the client went away): the next one probes.
        async with asyncio.timeout(1):
            async with lane.slot(_request("next")):
                assert lane.engines[0].breaker.probing

    asyncio.run(run())


def test_the_window_follows_the_remotes_time_to_first_token() -> None:
    clock = Clock()
    lane = _engine(clock, max_in_flight=8, window_ttft_ms=1000)
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
    chat = _engine(clock, max_in_flight=8, classes=("chat", "background"))
    assert chat.itl_target_s == 0.1  # the chat class's ITL target (PolicyConfig's 100 ms)
    chat._measured_itl([0.05, 0.08, 0.09])
    assert chat.window == 8
    chat._measured_itl([0.05, 0.3, 0.4])  # median gap 300 ms: the remote's batch is too full
    assert chat.window == 4
    background = _engine(clock, max_in_flight=8)
    assert background.itl_target_s is None
    background._measured_itl([5.0, 5.0, 5.0])  # nobody reads a background reply as it comes
    assert background.window == 8


# --- several remotes in one lane (two GPU boxes) ------------------------------------------------


def _two(clock: Clock, **settings: object) -> RemoteLane:
    configs = [RemoteConfig(name, f"http://127.0.0.1:{port}", **settings)  # type: ignore[arg-type]
               for name, port in (("box-a", 9), ("box-b", 10))]
    return RemoteLane.of(configs, PolicyConfig(), clock=clock)


def test_requests_go_to_the_remote_with_the_most_room() -> None:
    async def run() -> None:
        lane = _two(Clock(), max_in_flight=2)
        lane.engines[1].window = 1  # box-b slowed down: its window shrank
        taken: list[str] = []
        async with contextlib.AsyncExitStack() as stack:
            for i in range(3):
                engine = await stack.enter_async_context(lane.slot(_request(f"r{i}")))
                taken.append(engine.name)
            assert sorted(taken) == ["box-a", "box-a", "box-b"]
            # Both full: the next one waits in the lane's queue.
            waiting = asyncio.ensure_future(lane.slot(_request("r3")).__aenter__())
            await asyncio.sleep(0)
            assert not waiting.done() and len(lane.queues[Priority.BACKGROUND]) == 1
        engine = await waiting  # a place came free
        assert engine.name in ("box-a", "box-b")

    asyncio.run(run())


def test_one_remote_down_moves_the_queue_to_the_other_and_both_down_fails_it() -> None:
    async def run() -> None:
        clock = Clock()
        lane = _two(clock, max_in_flight=1, failures_to_open=1, open_s=10)
        async with lane.slot(_request("a")) as first, lane.slot(_request("b")) as second:
            assert {first.name, second.name} == {"box-a", "box-b"}
            waiting = [asyncio.ensure_future(lane.slot(_request(f"w{i}")).__aenter__())
                       for i in range(2)]
            await asyncio.sleep(0)
            # box-a fails: its breaker opens, but box-b is up, so nobody waiting is failed.
            lane.count_failure(first, RemoteError(502, "connection refused", "remote_failed"))
            await asyncio.sleep(0)
            assert not any(w.done() for w in waiting)
        # box-b's place comes free: the queue goes to box-b only (box-a is open).
        engine = await waiting[0]
        assert engine.name == "box-b"
        lane.count_failure(engine, RemoteError(502, "connection refused", "remote_failed"))
        with pytest.raises(RemoteError) as err:  # every remote down: the waiting one fails
            await waiting[1]
        assert err.value.code == "remote_unavailable"

    asyncio.run(run())


def test_a_retry_avoids_the_remote_that_failed_it_while_another_is_up() -> None:
    lane = _two(Clock(), max_in_flight=4)
    assert lane._pick(frozenset({"box-a"})).name == "box-b"  # type: ignore[union-attr]
    lane.engines[1].breaker.opened_at = 0.0  # box-b down: box-a is better than nothing
    assert lane._pick(frozenset({"box-a"})).name == "box-a"  # type: ignore[union-attr]


def test_background_leaves_a_place_for_an_interactive_arrival() -> None:
    """Rule 2 at the remote: on a lane that serves chat too, background work takes all but one
    place of the window, so a chat turn that arrives is sent at once instead of waiting in the
    remote's own queue behind background streams it cannot see past."""
    async def run() -> None:
        lane = _lane(Clock(), max_in_flight=3, classes=("chat", "background"))
        async with contextlib.AsyncExitStack() as stack:
            for i in range(2):
                await stack.enter_async_context(lane.slot(_request(f"bg{i}")))
            third = asyncio.ensure_future(lane.slot(_request("bg2")).__aenter__())
            await asyncio.sleep(0)
            assert not third.done()  # the last place is kept
            async with asyncio.timeout(1):
                async with lane.slot(_request("turn", Priority.CHAT)) as engine:
                    assert engine.in_flight == 3
            third.cancel()
        only = _lane(Clock(), max_in_flight=1, classes=("chat", "background"))
        async with asyncio.timeout(1), only.slot(_request("bg")):
            pass  # a window of one is never held back

    asyncio.run(run())
