"""A lane on another machine (rule 10): LLM work of some classes sent to a remote
OpenAI-compatible engine (vLLM, SGLang, llama-server, another Fairlane).

The scheduler stays in front of it. A request bound to the remote is admitted here (queue
limits, waiting limits), waits here in class order and, inside its class, in the order of the
Virtual Token Counter (the same `FairQueue` the device loops use), and is sent only when the
remote holds fewer than `window` of this server's requests. The remote batches what it is sent
as it likes; it never sees more than the window, so this server's priorities decide who is
served next, and a queue builds here (where it can be refused, expired or cancelled) rather
than inside the remote.

The window starts at `max_in_flight` and follows the remote's time to first token: halved
when a request waited longer than `window_ttft_ms` for its first token (the remote is
queueing what it cannot serve), one larger when a request at a full window got its first
token in under half of it. A lane that serves an interactive class also keeps that class's
ITL target: a request whose median gap between chunks was over it halves the window (fewer
streams in the remote's batch, each decoded sooner).

A remote that cannot be reached, answers 5xx, stalls longer than `timeout_s` or breaks a
stream off fails the request with a clear error (never a hang) and counts against a circuit
breaker: `failures_to_open` failures in a row open it for `open_s`, during which new requests
are refused at once with 503 and waiting ones are failed; then one request probes the remote
and its success closes the breaker again. A 4xx from the remote is the request's own fault
and is passed to the client as it is.

Everything here runs on the server's event loop: a remote request is I/O, not device work.

Longer than the project's ~450 lines on purpose: one lane's queue, admission, streaming client
and circuit breaker share their state and are read together.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from fairlane.config import RemoteConfig
from fairlane.policy import Admission, Kind, PolicyConfig, Priority, Request
from fairlane.policy.fairness import FairQueue

_LOGGER = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0


class RemoteError(Exception):
    """A remote request that failed, as the client should hear it: HTTP status, message, code
    and, for a retryable one, when to retry."""

    def __init__(
        self, status: int, message: str, code: str, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.retry_after_s = retry_after_s


class RemoteRefused(Exception):
    """Admission control's refusal (a full queue, a waiting limit that passed)."""

    def __init__(self, admission: Admission) -> None:
        super().__init__(admission.reason)
        self.admission = admission


class RemoteCancelled(Exception):
    """A waiting request cancelled through the API (`/v1/chat/completions/{id}/cancel`)."""


@dataclass
class Breaker:
    """Closed (sending), open (refusing for `open_s` after `failures_to_open` failures in a
    row) or half-open (one probe request on its way)."""

    failures_to_open: int
    open_s: float
    failures: int = 0
    opened_at: float | None = None
    probing: bool = False
    last_error: str = ""

    def state(self, now: float) -> str:
        if self.opened_at is None:
            return "closed"
        return "open" if now - self.opened_at < self.open_s else "half-open"

    def retry_after(self, now: float) -> float:
        return 0.0 if self.opened_at is None else max(0.0, self.opened_at + self.open_s - now)

    def success(self) -> None:
        self.failures, self.opened_at, self.probing, self.last_error = 0, None, False, ""

    def failure(self, now: float, error: str) -> bool:
        """Count a failure; True when it opens the breaker."""
        self.failures += 1
        self.last_error = error
        was_probe, self.probing = self.probing, False
        if was_probe or (self.opened_at is None and self.failures >= self.failures_to_open):
            self.opened_at = now
            return True
        return False


@dataclass
class _Waiter:
    request: Request
    turn: asyncio.Future[None]


@dataclass
class RemoteLane:
    """One remote engine and the queues in front of it."""

    config: RemoteConfig
    policy: PolicyConfig
    clock: Callable[[], float] = time.monotonic
    queues: dict[Priority, FairQueue] = field(default_factory=dict)
    waiters: dict[str, _Waiter] = field(default_factory=dict)
    in_flight: int = 0
    window: int = 0
    breaker: Breaker = field(init=False)
    ttft_s: deque[float] = field(default_factory=lambda: deque(maxlen=200))
    itl_s: deque[float] = field(default_factory=lambda: deque(maxlen=2000))
    served: int = 0
    failed: int = 0
    _session: aiohttp.ClientSession | None = None
    _probe: str | None = None  # the request sent to test a half-open breaker
    # Whether the remote's embeddings were found to match this server's (`embed` lanes).
    same_vectors: bool = False
    # Requests at the remote, each with the event that stops it (a cancel through the API).
    stops: dict[str, asyncio.Event] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.queues = {p: FairQueue() for p in Priority}
        self.window = self.config.max_in_flight
        self.breaker = Breaker(self.config.failures_to_open, self.config.open_s)

    @property
    def name(self) -> str:
        return self.config.name

    def serves(self, priority: Priority, kind: Kind = Kind.LLM) -> bool:
        return priority.label in self.config.classes and kind.value in self.config.kinds

    # --- admission and order -----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def slot(self, request: Request) -> AsyncIterator[None]:
        """Wait for the request's turn at the remote, hold one place in its window while the
        body runs. Raises RemoteError (the breaker is open) or RemoteRefused (rule 9)."""
        now = self.clock()
        request.arrival = now
        if self.breaker.state(now) == "open":
            raise self._unavailable(now)
        queue = self.queues[request.priority]
        limit = self.policy.queue_limit.get(request.priority)
        if limit is not None and len(queue) >= limit:
            raise RemoteRefused(Admission(False, f"the {request.priority.label} queue for "
                                                 f"{self.name} is full ({int(limit)} waiting)"))
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters[request.id] = _Waiter(request, turn)
        queue.push(request)
        self._pump()
        max_wait = self.policy.max_wait_ms.get(request.priority)
        try:
            await asyncio.wait_for(asyncio.shield(turn), None if max_wait is None else
                                   max_wait / 1000)
        except BaseException as err:
            self._forget(request)
            if turn.done() and not turn.cancelled() and turn.exception() is None:
                self._done(request)  # it got its turn as the wait ended: give it back
            if isinstance(err, TimeoutError):
                raise RemoteRefused(Admission(
                    False, f"not started within the {request.priority.label} class's "
                           f"policy.max_wait_ms ({max_wait:.0f} ms)", retryable=True)) from err
            raise
        self.stops[request.id] = asyncio.Event()
        try:
            yield
        finally:
            self._done(request)

    def _forget(self, request: Request) -> None:
        self.waiters.pop(request.id, None)
        self.queues[request.priority].remove(request)

    def cancel(self, request_id: str) -> bool:
        """Stop a request of this lane: a waiting one leaves the queue (RemoteCancelled), one
        at the remote stops at once (its connection is closed). False: not this lane's."""
        if (waiter := self.waiters.get(request_id)) is not None:
            self._forget(waiter.request)
            waiter.turn.set_exception(RemoteCancelled())
            return True
        if (stop := self.stops.get(request_id)) is not None:
            stop.set()
            return True
        return False

    def _done(self, request: Request) -> None:
        self.stops.pop(request.id, None)
        self.in_flight -= 1
        if self._probe == request.id:  # a probe that neither failed nor succeeded (its client
            self._probe = None  # went away): the next request probes instead
            self.breaker.probing = False
        self._pump()

    def _pump(self) -> None:
        """Send waiting requests, most urgent class first and least-served client first within
        it, while the window has room."""
        now = self.clock()
        state = self.breaker.state(now)
        while self.in_flight < self._limit(state):
            queue = next((self.queues[p] for p in Priority if len(self.queues[p])), None)
            if queue is None:
                return
            request = queue.peek()
            assert request is not None
            queue.take(request, request.prompt_tokens * self.policy.vtc_input_weight)
            waiter = self.waiters.pop(request.id)
            self.in_flight += 1
            if state == "half-open":
                self.breaker.probing, self._probe = True, request.id
            waiter.turn.set_result(None)

    def _limit(self, state: str) -> int:
        if state == "closed":
            return self.window
        if state == "half-open" and not self.breaker.probing:
            return self.in_flight + 1
        return 0

    def charge_output(self, request: Request, tokens: int) -> None:
        self.queues[request.priority].charge(
            request.client, tokens * self.policy.vtc_output_weight
        )

    def _unavailable(self, now: float) -> RemoteError:
        return RemoteError(
            503,
            f"the remote engine {self.name!r} is unavailable after {self.breaker.failures} "
            f"failures ({self.breaker.last_error}); retrying it in "
            f"{self.breaker.retry_after(now):.0f} s",
            "remote_unavailable",
            retry_after_s=max(1.0, self.breaker.retry_after(now)),
        )

    def count_failure(self, error: RemoteError) -> RemoteError:
        """Count a failure of the remote; when the breaker opens, every waiting request gets
        the error too (it would only wait for a remote that is down)."""
        self.failed += 1
        now = self.clock()
        if self.breaker.failure(now, error.message):
            _LOGGER.warning("remote %s: breaker open for %.0f s: %s", self.name,
                            self.config.open_s, error.message)
            unavailable = self._unavailable(now)
            for waiter in list(self.waiters.values()):
                self._forget(waiter.request)
                if not waiter.turn.done():
                    waiter.turn.set_exception(unavailable)
        return error

    @property
    def itl_target_s(self) -> float | None:
        """The tightest ITL target of the classes this lane serves (none for background)."""
        targets = [
            itl for p in Priority if self.serves(p) and (itl := self.policy.slo[p].itl_ms)
        ]
        return min(targets) / 1000 if targets else None

    def _measured_itl(self, gaps: list[float]) -> None:
        target = self.itl_target_s
        if target is not None and gaps and sorted(gaps)[len(gaps) // 2] > target:
            self.window = max(1, self.window // 2)

    def _measured(self, ttft_s: float, window_was_full: bool) -> None:
        self.ttft_s.append(ttft_s)
        target_s = self.config.window_ttft_ms / 1000
        if ttft_s > target_s:
            self.window = max(1, self.window // 2)
        elif ttft_s < target_s / 2 and window_was_full:
            self.window = min(self.config.max_in_flight, self.window + 1)

    # --- the remote --------------------------------------------------------------------------

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Authorization": f"Bearer {self.config.token}"} if self.config.token \
                else {}
            self._session = aiohttp.ClientSession(headers=headers)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    @contextlib.asynccontextmanager
    async def _calling(self) -> AsyncIterator[None]:
        """Around a call to the remote: its failures become RemoteErrors that count against
        the breaker (a 4xx, the request's own fault, does not)."""
        try:
            yield
        except RemoteError as err:
            if err.status >= 500:
                raise self.count_failure(err) from None
            raise
        except TimeoutError as err:
            raise self.count_failure(RemoteError(
                504, f"the remote engine {self.name!r} sent nothing for "
                     f"{self.config.timeout_s:.0f} s", "remote_timeout")) from err
        except (aiohttp.ClientError, OSError, ValueError, KeyError, TypeError) as err:
            raise self.count_failure(RemoteError(
                502, f"the remote engine {self.name!r} failed: {_describe(err)}",
                "remote_failed")) from err

    def _post(self, path: str, body: dict[str, Any], request: Request) -> Any:
        return self._client().post(
            f"{self.config.url}/{path}",
            json=body,
            # The class, for a remote that is another Fairlane (others ignore it).
            headers={"X-Fairlane-Class": request.priority.label},
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=self.config.timeout_s
            ),
        )

    async def chat(
        self, body: dict[str, Any], request: Request
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Stream a chat completion from the remote: each chunk's JSON, in order. Call inside
        `slot()`. Raises RemoteError when the remote fails; a request cancelled by its client
        closes the connection (the remote stops generating) and counts as no failure."""
        window_was_full = self.in_flight >= self.window
        sent = self.clock()
        first_at: float | None = None
        last_at = sent
        gaps: list[float] = []
        async with self._calling(), self._post(
            "chat/completions", {**body, "stream": True}, request
        ) as response:
            if response.status >= 400:
                raise await self._rejected(response)
            finished = False
            async for data in _sse(response):
                if data == "[DONE]":
                    finished = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise RemoteError(502, f"the remote engine {self.name!r} failed: "
                                           f"{_message(chunk)}", "remote_failed")
                now = self.clock()
                if _has_output(chunk):
                    if first_at is None:
                        first_at = now
                        self._measured(now - sent, window_was_full)
                    else:
                        gaps.append(now - last_at)
                        self.itl_s.append(now - last_at)
                    last_at = now
                finished = finished or _finish_reason(chunk) is not None
                yield chunk
            if not finished:
                raise RemoteError(502, f"the remote engine {self.name!r} ended the stream "
                                       "before the reply was complete", "remote_failed")
        self.served += 1
        self.breaker.success()
        self._measured_itl(gaps)

    async def embed(self, texts: list[str], model: str, request: Request) -> list[list[float]]:
        """The remote's embeddings of `texts`, in order. Call inside `slot()`."""
        sent = self.clock()
        async with self._calling(), self._post(
            "embeddings", {"input": texts, "model": model}, request
        ) as response:
            if response.status >= 400:
                raise await self._rejected(response)
            data = sorted((await response.json(content_type=None))["data"],
                          key=lambda item: item["index"])
            if len(data) != len(texts):
                raise RemoteError(502, f"the remote engine {self.name!r} gave {len(data)} "
                                       f"vectors for {len(texts)} texts", "remote_failed")
            vectors = [list(item["embedding"]) for item in data]
        self.ttft_s.append(self.clock() - sent)
        self.served += 1
        self.breaker.success()
        return vectors

    async def _rejected(self, response: aiohttp.ClientResponse) -> RemoteError:
        text = (await response.text())[:2000]
        try:
            detail = _message(json.loads(text))
        except ValueError:
            detail = text.strip() or response.reason or ""
        where = f"the remote engine {self.name!r} answered {response.status}"
        if response.status == 429:  # busy: a smaller window, and the client may retry
            self.window = max(1, self.window // 2)
            return RemoteError(429, f"{where}: {detail}", "remote_overloaded", retry_after_s=1)
        if response.status >= 500 or response.status in (401, 403, 404, 408):
            # The remote (or its configuration here) is broken, not the request.
            return RemoteError(502, f"{where}: {detail}", "remote_failed")
        return RemoteError(response.status, f"{where}: {detail}", "remote_rejected")

    # --- what /v1/stats and /health show -----------------------------------------------------

    def health(self) -> dict[str, Any]:
        return {
            "url": self.config.url,
            "classes": list(self.config.classes),
            "state": self.breaker.state(self.clock()),
            "failures": self.breaker.failures,
            "error": self.breaker.last_error or None,
        }

    def stats(self) -> dict[str, Any]:
        return {
            **self.health(),
            "window": self.window,
            "max_in_flight": self.config.max_in_flight,
            "in_flight": self.in_flight,
            "waiting": {p.label: len(self.queues[p]) for p in Priority},
            "served": self.served,
            "failed": self.failed,
            "ttft_ms_p50": _p50_ms(self.ttft_s),
            "itl_ms_p50": _p50_ms(self.itl_s),
        }


async def _sse(response: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """The `data:` payloads of a server-sent event stream."""
    async for raw in response.content:
        line = raw.decode("utf-8").strip()
        if line.startswith("data:"):
            yield line[5:].strip()


def _has_output(chunk: dict[str, Any]) -> bool:
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("tool_calls"):
            return True
    return False


def _finish_reason(chunk: dict[str, Any]) -> str | None:
    for choice in chunk.get("choices") or []:
        if choice.get("finish_reason"):
            return str(choice["finish_reason"])
    return None


def _message(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message") or body["error"])
    if isinstance(body, dict) and "error" in body:
        return str(body["error"])
    return str(body)[:500]


def _describe(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    return text if len(text) < 300 else text[:300] + "…"


def _p50_ms(values: deque[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[math.floor((len(ordered) - 1) / 2)] * 1000, 1)
