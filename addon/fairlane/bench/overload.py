"""Overload and soak: what a household server does when it gets more than it can serve.

`overload` keeps `factor` × each interactive class's queue limit of streaming chat requests
open at once (voice and chat, unique prompts), and 32 clients embedding as `background`, for
`duration_s`, then lets them drain. `soak`
runs a light mixed load (chat, voice, embeddings, documents) for `duration_s`. Both poll
`/health` the way the add-on's watchdog does and sample the server's resident memory, and both
count what a person would call a failure. Each client backs off after a 429 or a failed
connection as OpenAI's SDK does (at least a second, or the server's `Retry-After`, with
jitter), so the load is many patient clients, not one hammering loop. The figures:

- **5xx**: any server error;
- **hung**: a request with no first token, no result and no error within `hang_s` (a stream
  whose first token came but which is still going then is counted as **slow**);
- **resets**: connections refused or reset, and responses cut off without an error;
- **time to refusal**: how long a 429 took to arrive (a refusal should be fast);
- **health**: how long `/health` took to answer while the load ran;
- **RSS**: the server's resident memory at the start, its peak, and at the end.

Longer than the project's ~450 lines on purpose: one benchmark, its clients and its report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import statistics
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

# A load: (clients, the Load method each one calls in a loop, its arguments).
Job = tuple[int, str, tuple[Any, ...]]

# What a turn looks like: a short question, a short answer (the load is the count of requests).
QUESTIONS = (
    "What is a good name for a cat?",
    "Give me one tip for sleeping better.",
    "Say hello to the family.",
    "What should I cook with rice and eggs?",
)


@dataclass
class Outcome:
    """One request as the client saw it."""

    kind: str
    sent: float
    status: int | None = None  # HTTP status; None when no response came
    first: float | None = None  # first token, result or error body
    done: float | None = None
    error: str | None = None  # "reset", "hung", "cut off" or the error's code
    code: str | None = None  # an HTTP error's code ("refused", "deadline_exceeded"…)
    retry_after_s: float = 0.0
    tokens: int = 0  # content chunks streamed to the client


@dataclass
class Report:
    outcomes: list[Outcome] = field(default_factory=list)
    health_s: list[float] = field(default_factory=list)
    health_failures: int = 0
    rss_mb: list[float] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)  # the server's, as the load ended
    tokens_in_load: int = 0  # tokens received while the load ran (not in the drain after it)
    load_s: float = 0.0
    idle_chat_s: list[float] = field(default_factory=list)  # chat first tokens, nothing else on

    def summary(self) -> dict[str, Any]:
        statuses = Counter(
            f"{o.status} {o.code}" if o.code else str(o.status) if o.status else o.error
            for o in self.outcomes
        )
        # Time to a refusal at admission (a request that waited and expired is not one).
        refusals = [
            o.first - o.sent
            for o in self.outcomes
            if o.status == 429 and o.code == "refused" and o.first
        ]
        # Dropped at the waiting limit: how long after it was sent (per class, as sent).
        expired: dict[str, list[float]] = {}
        for o in self.outcomes:
            if o.status == 429 and o.code == "deadline_exceeded" and o.first:
                expired.setdefault(o.kind, []).append(o.first - o.sent)
        # Answered: a stream's first token, or a 2xx result (a document is a 202).
        served = [
            o for o in self.outcomes if o.status and 200 <= o.status < 300 and o.first is not None
        ]
        by_kind: dict[str, Any] = {}
        for kind in sorted({o.kind for o in self.outcomes}):
            mine = [o for o in served if o.kind == kind]
            waits = [o.first - o.sent for o in mine if o.first is not None]
            by_kind[kind] = {
                "sent": sum(o.kind == kind for o in self.outcomes),
                "served": len(mine),
                "first_p50_s": _pct(waits, 50),
                "first_p95_s": _pct(waits, 95),
            }
        idle_p50 = _pct(self.idle_chat_s, 50)
        chat_p50 = (by_kind.get("chat") or {}).get("first_p50_s")
        ends = [o.done or o.first or o.sent for o in self.outcomes]
        span = max(ends) - min(o.sent for o in self.outcomes) if self.outcomes else 0.0
        return {
            "requests": len(self.outcomes),
            # Useful work: tokens the clients received, over the load and the drain after it.
            "tokens_received": sum(o.tokens for o in self.outcomes),
            "tokens_per_s": round(sum(o.tokens for o in self.outcomes) / span, 2) if span else 0,
            # The same while the load ran: the drain after it has the CPU to itself.
            "load_tokens_per_s": round(self.tokens_in_load / self.load_s, 2) if self.load_s else 0,
            "statuses": dict(sorted(statuses.items())),
            "5xx": sum(1 for o in self.outcomes if o.status and o.status >= 500),
            "hung": sum(o.error == "hung" for o in self.outcomes),
            "slow": sum(o.error == "slow" for o in self.outcomes),
            "resets": sum(o.error in ("reset", "cut off") for o in self.outcomes),
            "refusal_p50_s": _pct(refusals, 50),
            "refusal_p99_s": _pct(refusals, 99),
            "refusal_max_s": round(max(refusals), 3) if refusals else None,
            "expired_after_s": {
                kind: {"p50": _pct(waits, 50), "max": round(max(waits), 3)}
                for kind, waits in sorted(expired.items())
            },
            "health_p50_s": _pct(self.health_s, 50),
            "health_p95_s": _pct(self.health_s, 95),
            "health_max_s": round(max(self.health_s), 3) if self.health_s else None,
            "health_failures": self.health_failures,
            "rss_start_mb": self.rss_mb[0] if self.rss_mb else None,
            "rss_peak_mb": max(self.rss_mb) if self.rss_mb else None,
            "rss_end_mb": self.rss_mb[-1] if self.rss_mb else None,
            # Growth after the first fifth of the run (models and caches warmed): a leak shows.
            "rss_growth_mb": round(self.rss_mb[-1] - self.rss_mb[len(self.rss_mb) // 5], 1)
            if self.rss_mb
            else None,
            "by_kind": by_kind,
            # The soak's goal: chat's first token within 1.5x of what it is on an idle server.
            "idle_chat_first_p50_s": idle_p50,
            "chat_vs_idle_p50": round(chat_p50 / idle_p50, 2) if chat_p50 and idle_p50 else None,
            "device_busy": (self.stats.get("device") or {}).get("busy"),
            "output_tokens_per_s": {
                label: figures.get("output_tokens_per_s")
                for label, figures in (self.stats.get("classes") or {}).items()
            },
        }


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 3)
    return round(statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1], 3)


def rss_mb(pid: int) -> float | None:
    """The process's resident memory (Linux), in MB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


class Load:
    """The clients: each coroutine sends one request at a time until the load stops."""

    def __init__(
        self,
        url: str,
        token: str | None,
        hang_s: float,
        report: Report,
        think_s: float = 0.0,
        backoff: bool = True,
    ) -> None:
        self.url = url
        self.backoff = backoff  # False: retry at once, as a hostile or broken client does
        self.think_s = think_s  # a person's pause between requests (0: at once)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.hang_s = hang_s
        self.report = report
        self.stopping = False
        self.audio: list[bytes] = []  # recordings for `transcribe`

    async def chat(self, session: aiohttp.ClientSession, klass: str, max_tokens: int) -> None:
        body = {
            "model": "default",
            "messages": [{"role": "user", "content": _unique(QUESTIONS)}],
            "max_tokens": max_tokens,
            "stream": True,
            "fairlane_class": klass,
        }
        await self._send(session, klass, "/v1/chat/completions", body, stream=True)

    async def embed(
        self, session: aiohttp.ClientSession, texts: int, klass: str = "chat"
    ) -> None:
        body = {"input": [_unique(QUESTIONS) for _ in range(texts)], "fairlane_class": klass}
        kind = "embeddings" if klass == "chat" else f"embeddings ({klass})"
        await self._send(session, kind, "/v1/embeddings", body, stream=False)

    async def transcribe(self, session: aiohttp.ClientSession) -> None:
        """A spoken command's recording (one of the fixtures), as `voice`."""
        form = aiohttp.FormData()
        form.add_field("model", "whisper")
        form.add_field("language", "en")
        audio = self.audio[hash(uuid.uuid4()) % len(self.audio)]
        form.add_field("file", audio, filename="command.wav", content_type="audio/wav")
        await self._send(session, "transcriptions", "/v1/audio/transcriptions", form, False)

    async def document(self, session: aiohttp.ClientSession) -> None:
        text = " ".join(_unique(QUESTIONS) for _ in range(40))
        body = {"title": f"note {uuid.uuid4().hex[:8]}", "text": text}
        await self._send(session, "documents", "/v1/documents", body, stream=False)

    async def _send(
        self, session: aiohttp.ClientSession, kind: str, path: str, body: Any, stream: bool
    ) -> None:
        outcome = Outcome(kind, time.monotonic())
        self.report.outcomes.append(outcome)
        await self._request(session, outcome, path, body, stream)
        if self.think_s:
            await asyncio.sleep(random.uniform(0.5, 1.5) * self.think_s)
        if self.backoff and (outcome.status == 429 or outcome.status is None):
            # As OpenAI's SDK does: back off (at least a second, or as long as the server
            # asks), with jitter, before the next try.
            await asyncio.sleep(random.uniform(0.5, 1.5) * max(1.0, outcome.retry_after_s))

    async def _request(
        self,
        session: aiohttp.ClientSession,
        outcome: Outcome,
        path: str,
        body: Any,
        stream: bool,
    ) -> None:
        try:
            async with asyncio.timeout(self.hang_s):
                data = {"data": body} if isinstance(body, aiohttp.FormData) else {"json": body}
                async with session.post(self.url + path, headers=self.headers, **data) as r:
                    outcome.status = r.status
                    if r.status != 200 or not stream:
                        raw = await r.read()
                        outcome.first = outcome.done = time.monotonic()
                        if r.status != 200:
                            outcome.code = _error_code(raw)
                            with contextlib.suppress(ValueError):
                                outcome.retry_after_s = float(r.headers.get("Retry-After", 0))
                        return
                    finished = False
                    async for raw in r.content:
                        line = raw.decode(errors="replace").strip()
                        if line == "data: [DONE]":
                            finished = True
                            break
                        if not line.startswith("data:"):
                            continue
                        chunk = json.loads(line[5:])
                        if "error" in chunk:
                            outcome.error = str(chunk["error"].get("code") or "error")
                            outcome.first = outcome.first or time.monotonic()
                        else:
                            choices = chunk.get("choices") or [{}]
                            token = bool((choices[0].get("delta") or {}).get("content"))
                            outcome.tokens += token
                            if not self.stopping:
                                self.report.tokens_in_load += token
                            if outcome.first is None:
                                outcome.first = time.monotonic()
                    outcome.done = time.monotonic()
                    if not finished and outcome.error is None:
                        outcome.error = "cut off"
        except TimeoutError:
            # No answer at all is a hung request; a stream still going is only a slow one.
            outcome.error = "hung" if outcome.first is None else "slow"
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError):
            outcome.error = "reset"

    async def loop(self, job: Any, *args: Any) -> None:
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            while not self.stopping:
                await job(session, *args)


def _error_code(raw: bytes) -> str | None:
    try:
        return str(json.loads(raw)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return None


def _unique(pool: tuple[str, ...]) -> str:
    """A nonce first: no two requests share a cached prefix."""
    return f"[{uuid.uuid4().hex[:12]}] {pool[hash(uuid.uuid4()) % len(pool)]}"


async def _server_stats(url: str, headers: dict[str, str]) -> dict[str, Any]:
    try:
        async with (
            aiohttp.ClientSession() as session,
            asyncio.timeout(60),
            session.get(url + "/v1/stats", headers=headers) as r,
        ):
            return dict(await r.json())
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return {}


async def _watch(url: str, pid: int | None, report: Report, stop: asyncio.Event) -> None:
    """The watchdog's view: /health every second (30 s timeout), and the server's RSS."""
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            if pid is not None and (mb := rss_mb(pid)) is not None:
                report.rss_mb.append(mb)
            start = time.monotonic()
            try:
                async with asyncio.timeout(30), session.get(url + "/health") as r:
                    await r.read()
                    ok = r.status == 200
            except (TimeoutError, aiohttp.ClientError, OSError):
                ok = False
            report.health_s.append(time.monotonic() - start)
            report.health_failures += not ok
            with_rest = max(0.0, 1.0 - (time.monotonic() - start))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), with_rest)


async def run_load(
    url: str,
    pid: int | None,
    jobs: list[Job],
    duration_s: float,
    hang_s: float,
    token: str | None = None,
    think_s: float = 0.0,
    backoff: bool = True,
    audio: list[bytes] | None = None,
    idle_samples: int = 0,
) -> Report:
    """Run `count` clients of each job for `duration_s`, then wait for the last requests (at
    most `hang_s`, after which they count as hung). First, `idle_samples` chat turns one at a
    time on the idle server: the baseline the load's chat figures are compared with."""
    report = Report()
    load = Load(url, token, hang_s, report, think_s, backoff)
    load.audio = audio or []
    if idle_samples:
        idle = Report()
        alone = Load(url, token, hang_s, idle)
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            for _ in range(idle_samples):
                await alone.chat(session, "chat", 32)
        report.idle_chat_s = [
            o.first - o.sent for o in idle.outcomes if o.first and o.status == 200
        ]
    stop = asyncio.Event()
    watcher = asyncio.create_task(_watch(url, pid, report, stop))
    clients = [
        asyncio.create_task(load.loop(getattr(load, name), *args))
        for count, name, args in jobs
        for _ in range(count)
    ]
    await asyncio.sleep(duration_s)
    report.load_s = duration_s
    report.stats = await _server_stats(url, load.headers)
    load.stopping = True
    await asyncio.gather(*clients)
    await asyncio.sleep(2)  # memory after the load, before the watcher stops
    stop.set()
    await watcher
    return report


BACKGROUND_CLIENTS = 32  # automations embedding texts beside the overload (no queue limit)


def overload_jobs(queue_limits: dict[str, int], factor: float) -> list[Job]:
    """`factor` × each interactive class's queue limit of clients, streaming short answers,
    and BACKGROUND_CLIENTS embedding 16 texts each as `background`: every one of them must be
    answered or refused within its class's waiting limit."""
    return [
        (round(factor * queue_limits["voice"]), "chat", ("voice", 64)),
        (round(factor * queue_limits["chat"]), "chat", ("chat", 64)),
        (BACKGROUND_CLIENTS, "embed", (16, "background")),
    ]


# A light household load: two people chatting, one speaking, a document and a batch of
# embeddings now and then, each with a pause of about SOAK_THINK_S between requests.
SOAK_THINK_S = 2.0
SOAK_JOBS: list[Job] = [
    (2, "chat", ("chat", 32)),
    (1, "chat", ("voice", 16)),
    (1, "transcribe", ()),
    (1, "embed", (16,)),
    (1, "document", ()),
]
IDLE_SAMPLES = 8  # the soak's idle baseline: chat turns one at a time before the load


def format_summary(name: str, summary: dict[str, Any]) -> str:
    keys = [
        "requests",
        "tokens_received",
        "tokens_per_s",
        "load_tokens_per_s",
        "5xx",
        "hung",
        "slow",
        "resets",
        "refusal_p50_s",
        "refusal_max_s",
        "health_p50_s",
        "health_p95_s",
        "health_max_s",
        "health_failures",
        "rss_start_mb",
        "rss_peak_mb",
        "rss_end_mb",
        "rss_growth_mb",
        "device_busy",
        "output_tokens_per_s",
        "idle_chat_first_p50_s",
        "chat_vs_idle_p50",
    ]
    lines = [f"{name}: " + ", ".join(f"{k}={summary[k]}" for k in keys)]
    lines.append(f"  statuses: {summary['statuses']}")
    lines.append(f"  429 at the waiting limit, seconds after sending: {summary['expired_after_s']}")
    for kind, figures in summary["by_kind"].items():
        lines.append(f"  {kind}: {figures}")
    return "\n".join(lines)


def run(
    what: str,
    duration_s: float,
    hang_s: float,
    factor: float,
    url: str | None,
    pid: int | None,
    token: str | None,
    backoff: bool = True,
    fixtures: Path | None = None,
) -> dict[str, Any]:
    """`fairlane bench overload|soak`: against `url` (with `pid` for its memory) or a fresh
    `fairlane serve` on the default configuration and a temporary data directory. The soak's
    transcriptions send the command recordings in `fixtures`."""
    from fairlane.bench.servers import ServerProcess, free_port
    from fairlane.policy.config import PolicyConfig

    limits = {p.label: int(v) for p, v in PolicyConfig().queue_limit.items()}
    jobs = overload_jobs(limits, factor) if what == "overload" else SOAK_JOBS
    think_s = 0.0 if what == "overload" else SOAK_THINK_S
    soak = what == "soak"
    audio = [p.read_bytes() for p in sorted(fixtures.glob("command-*.wav"))] if fixtures else []
    if soak and not audio:
        jobs = [job for job in jobs if job[1] != "transcribe"]
    extra: dict[str, Any] = {"audio": audio, "idle_samples": IDLE_SAMPLES if soak else 0}
    if url is not None:
        report = asyncio.run(
            run_load(url, pid, jobs, duration_s, hang_s, token, think_s, backoff, **extra)
        )
        return report.summary()
    import sys
    import tempfile

    port = free_port()
    argv = [sys.executable, "-m", "fairlane", "serve", "--port", str(port)]
    argv += ["--set", f"server.data_dir={tempfile.mkdtemp(prefix='fairlane-soak-')}"]
    argv += ["--set", "wyoming.port=0"]
    with ServerProcess(argv, port, env={**os.environ}) as server:
        report = asyncio.run(
            run_load(
                server.url, server.process.pid, jobs, duration_s, hang_s, token, think_s,
                backoff, **extra,
            )
        )
    return report.summary()
