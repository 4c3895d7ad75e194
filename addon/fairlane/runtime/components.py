"""The server's long-running parts (the indexer, the summariser) and how they say they are
well: each runs under a supervisor that restarts it with back-off after a failure (a full disk,
a locked database) and keeps its state for `/health`, so a failure is seen, not silent.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

_LOGGER = logging.getLogger(__name__)

BACKOFF_S = (1.0, 2.0, 5.0, 15.0, 60.0)  # after the 1st, 2nd… consecutive failure


@dataclass
class Component:
    """One part's health: "ok", or "retrying" after a failure (with the error and when)."""

    name: str
    state: str = "starting"
    error: str | None = None
    failures: int = 0  # consecutive failures; 0 once it works again
    since: float = field(default_factory=time.time)

    def ok(self) -> None:
        if self.state != "ok":
            if self.failures:
                _LOGGER.info("%s works again", self.name)
            self.state, self.error, self.failures, self.since = "ok", None, 0, time.time()

    def failed(self, err: BaseException) -> float:
        """Record a failure; returns how long to wait before the next try."""
        self.failures += 1
        self.state, self.error, self.since = "retrying", describe(err), time.time()
        return BACKOFF_S[min(self.failures, len(BACKOFF_S)) - 1]

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "error": self.error,
            "failures": self.failures,
            "since": round(self.since, 3),
        }


async def supervise(component: Component, work: Callable[[Component], Awaitable[None]]) -> None:
    """Run `work` (a loop that calls `component.ok()` as it makes progress) until cancelled;
    when it raises, log it, report it, wait, and start it again."""
    while True:
        try:
            await work(component)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # any failure: it must not end the part silently
            delay = component.failed(err)
            _LOGGER.error(
                "%s failed (%s); trying again in %.0f s", component.name, component.error, delay
            )
            await asyncio.sleep(delay)


def storage_full(err: BaseException) -> bool:
    """Whether an error means the disk (or the database's size limit) is full."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return isinstance(err, sqlite3.OperationalError) and (
        getattr(err, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
        or "database or disk is full" in str(err)
    )


def describe(err: BaseException) -> str:
    if storage_full(err):
        return "the disk is full"
    return f"{type(err).__name__}: {err}"
