"""One remote engine of a lane on another machine (fairlane.runtime.remote): its window, its
circuit breaker and its streaming client, and what it measured.

The window starts at `max_in_flight` and follows the remote's time to first token: halved
when a request waited longer than `window_ttft_ms` for its first token (the remote is
queueing what it cannot serve), one larger when a request at a full window got its first
token in under half of it. A remote that serves an interactive class also keeps that class's
ITL target: a request whose median gap between chunks was over it halves the window.

A remote that cannot be reached, answers 5xx, stalls longer than `timeout_s` or breaks a
stream off fails the request with a clear error (never a hang) and counts against its circuit
breaker: `failures_to_open` failures in a row open it for `open_s`, then one request probes
the remote and its success closes the breaker again. A 4xx from the remote is the request's
own fault and is passed to the client as it is.
"""

from __future__ import annotations

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
from fairlane.policy import PolicyConfig, Priority, Request

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


# What each engine calls a request's priority (DESIGN.md's classes, most urgent first). vLLM
# (`--scheduling-policy priority`) serves lower values first; SGLang
# (`--enable-priority-scheduling`) higher values first, unless it was started with
# `--schedule-low-priority-values-first`. Other engines get no field (llama-server: FIFO).
ENGINE_PRIORITIES: dict[str, dict[Priority, int]] = {
    "vllm": {Priority.VOICE: 0, Priority.CHAT: 1, Priority.BACKGROUND: 2},
    "sglang": {Priority.VOICE: 2, Priority.CHAT: 1, Priority.BACKGROUND: 0},
}


@dataclass
class RemoteEngine:
    """One remote engine: its window, its circuit breaker, its connection, what it measured."""

    config: RemoteConfig
    policy: PolicyConfig
    clock: Callable[[], float] = time.monotonic
    in_flight: int = 0
    window: int = 0
    breaker: Breaker = field(init=False)
    ttft_s: deque[float] = field(default_factory=lambda: deque(maxlen=200))
    itl_s: deque[float] = field(default_factory=lambda: deque(maxlen=2000))
    served: int = 0
    failed: int = 0
    _session: aiohttp.ClientSession | None = None
    probe: str | None = None  # the request sent to test a half-open breaker
    # Whether the remote's embeddings were found to match this server's (`embed` lanes).
    same_vectors: bool = False
    # How the lane counts a failure of this remote (RemoteLane.count_failure: the breaker,
    # and the lane's queue when it opens).
    on_failure: Callable[[RemoteEngine, RemoteError], RemoteError] | None = None

    def __post_init__(self) -> None:
        self.window = self.config.max_in_flight
        self.breaker = Breaker(self.config.failures_to_open, self.config.open_s)

    @property
    def name(self) -> str:
        return self.config.name

    def room(self) -> int:
        """How many more requests it may be sent now (0 while its breaker is open)."""
        state = self.breaker.state(self.clock())
        if state == "closed":
            limit = self.window
        elif state == "half-open" and not self.breaker.probing:
            limit = self.in_flight + 1
        else:
            limit = 0
        return max(0, limit - self.in_flight)

    def down(self) -> bool:
        return self.breaker.state(self.clock()) == "open"

    def unavailable(self) -> RemoteError:
        now = self.clock()
        return RemoteError(
            503,
            f"the remote engine {self.name!r} is unavailable after {self.breaker.failures} "
            f"failures ({self.breaker.last_error}); retrying it in "
            f"{self.breaker.retry_after(now):.0f} s",
            "remote_unavailable",
            retry_after_s=max(1.0, self.breaker.retry_after(now)),
        )

    @property
    def itl_target_s(self) -> float | None:
        """The tightest ITL target of the classes it serves (none for background)."""
        targets = [
            itl
            for p in Priority
            if p.label in self.config.classes and (itl := self.policy.slo[p].itl_ms)
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

    def failure(self, error: RemoteError) -> bool:
        """Count a failure of the remote; True when it opens the breaker."""
        self.failed += 1
        if self.breaker.failure(self.clock(), error.message):
            _LOGGER.warning("remote %s: breaker open for %.0f s: %s", self.name,
                            self.config.open_s, error.message)
            return True
        return False

    def _failed(self, error: RemoteError) -> RemoteError:
        if self.on_failure is not None:
            return self.on_failure(self, error)
        self.failure(error)
        return error

    @contextlib.asynccontextmanager
    async def _calling(self) -> AsyncIterator[None]:
        """Around a call to the remote: its failures become RemoteErrors that count against
        the breaker (a 4xx, the request's own fault, does not)."""
        try:
            yield
        except RemoteError as err:
            if err.status >= 500:
                raise self._failed(err) from None
            raise
        except TimeoutError as err:
            raise self._failed(RemoteError(
                504, f"the remote engine {self.name!r} sent nothing for "
                     f"{self.config.timeout_s:.0f} s", "remote_timeout")) from err
        except (aiohttp.ClientError, OSError, ValueError, KeyError, TypeError) as err:
            raise self._failed(RemoteError(
                502, f"the remote engine {self.name!r} failed: {_describe(err)}",
                "remote_failed")) from err

    def _post(self, path: str, body: dict[str, Any], request: Request) -> Any:
        if (priorities := ENGINE_PRIORITIES.get(self.config.engine)) is not None:
            body = {**body, "priority": priorities[request.priority]}
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
        the lane's `slot()`. Raises RemoteError when the remote fails; a request cancelled by
        its client closes the connection (the remote stops generating) and counts as no
        failure."""
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
        """The remote's embeddings of `texts`, in order. Call inside the lane's `slot()`."""
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
            "engine": self.config.engine,
            "classes": list(self.config.classes),
            "state": self.breaker.state(self.clock()),
            "failures": self.breaker.failures,
            "error": self.breaker.last_error or None,
        }

    def stats(self, waiting: dict[str, int]) -> dict[str, Any]:
        return {
            **self.health(),
            "window": self.window,
            "max_in_flight": self.config.max_in_flight,
            "in_flight": self.in_flight,
            "waiting": waiting,  # the lane's queue, shared by its remotes
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
