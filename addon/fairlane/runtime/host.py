"""The server's own thread settings, whatever the shell it was started from.

Each engine sizes its own thread pool (`threads` in its config section; by default one per
core the process may use). What the native libraries would do on their own must not add to
that, and they read their settings from the environment once, when each loads:

- OpenMP and BLAS pools (torch, CTranslate2, OpenBLAS/MKL) take one thread per core each,
  per library, unless told otherwise. `make run` always exported OMP_NUM_THREADS=1; a
  `fairlane serve` started from a plain shell did not, and under a light household load it
  served a spoken command's first token at p95 13.4 s instead of 4.2 s, and kept 0.06 of its
  embeddings throughput instead of 0.89. These are set here, over whatever the shell had.
- llama.cpp's CPU threads are OpenMP threads (libgomp) that meet at a barrier after each of
  the hundreds of operations in a step. GOMP spins at a barrier for GOMP_SPINCOUNT rounds
  before it sleeps (300,000 by default, about a millisecond). On a Home Assistant host,
  where another process often holds a core, the spinning thread waits for a partner that is
  not running, at every barrier. A short spin keeps a quiet host's steps as fast and lets a
  busy host's cores go to the thread that has work. `GOMP_SPINCOUNT` (or `OMP_WAIT_POLICY`)
  set in the environment is kept: that is a deliberate choice.

`configure()` runs first thing in `fairlane`'s main, before any engine's library is imported.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
from collections.abc import MutableMapping
from typing import Any

_LOGGER = logging.getLogger(__name__)

# The engines size their own pools; a library's implicit pool is one thread.
ONE_THREAD = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
# Barrier spin rounds before a waiting OpenMP thread sleeps: see bench busy-host in
# docs/history/benchmarks.md for the choice.
SPIN_COUNT = "10000"


def configure(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set the thread environment the server runs with; returns what was changed."""
    env = os.environ if environ is None else environ
    changed: dict[str, str] = {}
    for name in ONE_THREAD:
        if env.get(name) != "1":
            changed[name] = "1"
    if "GOMP_SPINCOUNT" not in env and "OMP_WAIT_POLICY" not in env:
        changed["GOMP_SPINCOUNT"] = SPIN_COUNT
    for name, value in changed.items():
        if name in env:
            _LOGGER.info("%s=%s in the environment; the server sets %s", name, env[name], value)
        env[name] = value
    return changed


def give_back_memory() -> None:
    """Return the C heap's free pages to the system (glibc's malloc_trim; elsewhere nothing).

    glibc keeps what a large piece of work freed (a document's chunking, a large embedding
    batch) for the next allocation: the server stayed ~0.9 GB larger after its first 1 MB
    document. Called after such work; it costs a few milliseconds."""
    if (trim := _malloc_trim()) is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    name = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
