"""A lane on other machines (rule 10): LLM work of some classes sent to remote
OpenAI-compatible engines (vLLM, SGLang, llama-server, another Fairlane).

The scheduler stays in front of them. A request bound to the lane is admitted here (queue
limits, waiting limits), waits here in class order and, inside its class, in the order of the
Virtual Token Counter (the same `FairQueue` the device loops use), and is sent only when one of
the lane's remotes holds fewer than its `window` of this server's requests. A remote batches
what it is sent as it likes; it never sees more than its window, so this server's priorities
decide who is served next, and a queue builds here (where it can be refused, expired or
cancelled) rather than inside a remote.

A lane may have several remotes (`remotes:` entries with the same classes and kinds: two GPU
boxes). The queue is the lane's: the next request goes to the remote with the most room in its
window among those whose breaker lets it send (a background request leaves one place free on a
lane that serves an interactive class too), so a remote that fails or slows down simply
takes less, and when one's breaker opens its share of the queue goes to the others (waiting
requests fail only when every remote is down). A remote that declares its engine (`engine:
vllm` or `sglang`) is sent each request's class as that engine's own `priority` field, so the
remote's batch orders voice > chat > background too.

Admission control: a full class queue is refused at once (429), a request not started within
its class's `policy.max_wait_ms` too, and while every remote's breaker is open new requests are
refused at once with 503. Everything here runs on the server's event loop: a remote request is
I/O, not device work.

The lane (queue, admission, dispatch) is `RemoteLane`, here; each remote (its window, its
circuit breaker, its streaming client) is a `RemoteEngine` (fairlane.runtime.remote_engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fairlane.config import RemoteConfig
from fairlane.policy import Admission, Kind, PolicyConfig, Priority, Request
from fairlane.policy.fairness import FairQueue
from fairlane.runtime.remote_engine import Breaker, RemoteEngine, RemoteError

__all__ = ["Breaker", "RemoteCancelled", "RemoteEngine", "RemoteError", "RemoteLane",
           "RemoteRefused", "lanes_of"]


def lanes_of(remotes: tuple[RemoteConfig, ...]) -> list[list[RemoteConfig]]:
    """The configured remotes grouped into lanes: those with the same classes and kinds."""
    lanes: dict[tuple[frozenset[str], frozenset[str]], list[RemoteConfig]] = {}
    for remote in remotes:
        lanes.setdefault((frozenset(remote.classes), frozenset(remote.kinds)), []).append(remote)
    return list(lanes.values())


class RemoteRefused(Exception):
    """Admission control's refusal (a full queue, a waiting limit that passed)."""

    def __init__(self, admission: Admission) -> None:
        super().__init__(admission.reason)
        self.admission = admission


class RemoteCancelled(Exception):
    """A waiting request cancelled through the API (`/v1/chat/completions/{id}/cancel`)."""


@dataclass
class _Waiter:
    request: Request
    turn: asyncio.Future[RemoteEngine]
    avoid: frozenset[str] = frozenset()  # remotes that already failed this request


@dataclass
class RemoteLane:
    """The remotes that serve some classes' work, and the queues in front of them."""

    engines: list[RemoteEngine]
    policy: PolicyConfig
    clock: Callable[[], float] = time.monotonic
    queues: dict[Priority, FairQueue] = field(default_factory=dict)
    waiters: dict[str, _Waiter] = field(default_factory=dict)
    # Requests at a remote, each with the event that stops it (a cancel through the API).
    stops: dict[str, asyncio.Event] = field(default_factory=dict)

    @classmethod
    def of(
        cls, configs: list[RemoteConfig], policy: PolicyConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> RemoteLane:
        return cls([RemoteEngine(c, policy, clock) for c in configs], policy, clock)

    def __post_init__(self) -> None:
        self.queues = {p: FairQueue() for p in Priority}
        for engine in self.engines:
            engine.on_failure = self.count_failure

    @property
    def name(self) -> str:
        return "+".join(engine.name for engine in self.engines)

    @property
    def config(self) -> RemoteConfig:
        """The first remote's configuration (the lane's remotes share classes and kinds)."""
        return self.engines[0].config

    def serves(self, priority: Priority, kind: Kind = Kind.LLM) -> bool:
        return priority.label in self.config.classes and kind.value in self.config.kinds

    @property
    def in_flight(self) -> int:
        return sum(engine.in_flight for engine in self.engines)

    # --- admission and order -----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def slot(
        self, request: Request, avoid: frozenset[str] = frozenset()
    ) -> AsyncIterator[RemoteEngine]:
        """Wait for the request's turn, then hold one place in a remote's window while the
        body runs; yields that remote. `avoid`: remotes that already failed this request
        (taken only when every other one is down). Raises RemoteError (every remote's breaker
        is open) or RemoteRefused (rule 9)."""
        request.arrival = self.clock()
        if all(engine.down() for engine in self.engines):
            raise min((e.unavailable() for e in self.engines), key=lambda e: e.retry_after_s or 0)
        queue = self.queues[request.priority]
        limit = self.policy.queue_limit.get(request.priority)
        if limit is not None and len(queue) >= limit:
            raise RemoteRefused(Admission(False, f"the {request.priority.label} queue for "
                                                 f"{self.name} is full ({int(limit)} waiting)"))
        turn: asyncio.Future[RemoteEngine] = asyncio.get_running_loop().create_future()
        self.waiters[request.id] = _Waiter(request, turn, avoid)
        queue.push(request)
        self._pump()
        max_wait = self.policy.max_wait_ms.get(request.priority)
        try:
            engine = await asyncio.wait_for(
                asyncio.shield(turn), None if max_wait is None else max_wait / 1000
            )
        except BaseException as err:
            self._forget(request)
            if turn.done() and not turn.cancelled() and turn.exception() is None:
                self._done(request, turn.result())  # its turn came as the wait ended
            if isinstance(err, TimeoutError):
                raise RemoteRefused(Admission(
                    False, f"not started within the {request.priority.label} class's "
                           f"policy.max_wait_ms ({max_wait:.0f} ms)", retryable=True)) from err
            raise
        self.stops[request.id] = asyncio.Event()
        try:
            yield engine
        finally:
            self._done(request, engine)

    def _forget(self, request: Request) -> None:
        self.waiters.pop(request.id, None)
        self.queues[request.priority].remove(request)

    def cancel(self, request_id: str) -> bool:
        """Stop a request of this lane: a waiting one leaves the queue (RemoteCancelled), one
        at a remote stops at once (its connection is closed). False: not this lane's."""
        if (waiter := self.waiters.get(request_id)) is not None:
            self._forget(waiter.request)
            waiter.turn.set_exception(RemoteCancelled())
            return True
        if (stop := self.stops.get(request_id)) is not None:
            stop.set()
            return True
        return False

    def _done(self, request: Request, engine: RemoteEngine) -> None:
        self.stops.pop(request.id, None)
        engine.in_flight -= 1
        if engine.probe == request.id:  # a probe that neither failed nor succeeded (its
            engine.probe = None  # client went away): the next request probes instead
            engine.breaker.probing = False
        self._pump()

    def _pump(self) -> None:
        """Send waiting requests, most urgent class first and least-served client first within
        it, each to the remote with the most room, while some remote has room."""
        while True:
            queue = next((self.queues[p] for p in Priority if len(self.queues[p])), None)
            if queue is None:
                return
            request = queue.peek()
            assert request is not None
            engine = self._pick(self.waiters[request.id].avoid, self._keep_free(request))
            if engine is None:
                return
            waiter = self.waiters.pop(request.id)
            # Its input is charged once: a request sent again after a failover already paid.
            charge = 0.0 if waiter.avoid else request.prompt_tokens * self.policy.vtc_input_weight
            queue.take(request, charge)
            engine.in_flight += 1
            if engine.breaker.state(self.clock()) == "half-open":
                engine.breaker.probing, engine.probe = True, request.id
            waiter.turn.set_result(engine)

    def _keep_free(self, request: Request) -> int:
        """Places a request must leave free in a remote's window: one, for a background
        request on a lane that also serves an interactive class (rule 2 at the remote: a
        spoken command or a chat turn that arrives finds a place at once, and never waits in
        the remote's own queue behind background work it cannot see past)."""
        interactive = any(p.interactive and self.serves(p) for p in Priority)
        return 1 if interactive and not request.priority.interactive else 0

    def _pick(self, avoid: frozenset[str], keep_free: int = 0) -> RemoteEngine | None:
        """The remote with the most room in its window (beyond `keep_free` places, where its
        window has more than one); one that already failed this request only when every other
        one is down."""
        free = [e for e in self.engines if e.room() > (keep_free if e.window > 1 else 0)]
        preferred = [e for e in free if e.name not in avoid]
        if not preferred and all(e.down() for e in self.engines if e.name not in avoid):
            preferred = free
        if not preferred:
            return None
        # Most room for its window; between equals, the one with fewer failures in a row.
        return max(
            preferred, key=lambda e: (e.room() / max(1, e.window), -e.breaker.failures, e.room())
        )

    def charge_output(self, request: Request, tokens: int) -> None:
        self.queues[request.priority].charge(
            request.client, tokens * self.policy.vtc_output_weight
        )

    def count_failure(self, engine: RemoteEngine, error: RemoteError) -> RemoteError:
        """Count a failure of `engine`. When its breaker opens, the waiting requests go to the
        other remotes; only when every remote is down do they get the error too (they would
        only wait for remotes that are down)."""
        if engine.failure(error) and all(e.down() for e in self.engines):
            unavailable = engine.unavailable()
            for waiter in list(self.waiters.values()):
                self._forget(waiter.request)
                if not waiter.turn.done():
                    waiter.turn.set_exception(unavailable)
        self._pump()
        return error

    def waiting(self) -> dict[str, int]:
        return {p.label: len(self.queues[p]) for p in Priority}

    async def close(self) -> None:
        for engine in self.engines:
            await engine.close()
