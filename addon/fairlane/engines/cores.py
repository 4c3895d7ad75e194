"""How many of its cores the CPU LLM can use now: a neighbour that holds a core takes it.

llama.cpp's CPU threads meet at a barrier after every operation of a step, so a step runs at
the pace of its slowest thread. On a Home Assistant host another program (a camera recorder,
a database, Home Assistant itself) often holds one of the cores; then one of two threads runs
only part of the time and the other waits for it at every barrier. Measured on 2 cores with
one neighbour spinning (docs/history/benchmarks.md, "A busy host, threads that give way"):
a 120-token prompt 1.5 s on two threads against 1.0-1.1 s on one, a decode step 50-80 ms
against 34-37 ms; quiet, two threads are 1.7x and 1.5x faster than one.

So an engine on automatic threads with `llm.give_way` asks `CoreShare` before each step. A
reader thread of its own reads, every `interval_s` (0.25 s), how much CPU time the machine's
other processes used on this process's cores (`/proc/stat` less `/proc/self/stat`, steal time
included: a core the hypervisor gave away is as gone), and the engine runs on the cores they
leave, by their mean over the last `WINDOW` readings (one second). A neighbour that holds a core
holds it in every reading; a client that sends a request and waits (Home Assistant itself, a
benchmark's load) holds one for a burst of milliseconds, and is no reason to halve a spoken
command's prefill. The reader runs whether or not the engine does, so the first step after an
idle spell goes by the last second, not by what others used over the spell. A threshold with a
gap (a core is taken at 0.6 of one, given back below 0.35) keeps a neighbour that hovers around
half a core from switching the engine's threads at every reading. Reading the two files four
times a second costs a few tens of microseconds each.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WINDOW = 4  # readings the engine goes by: a core held for a second is taken
TAKE_AT = 0.6  # of a core used by others: the engine gives up a thread
GIVE_BACK_BELOW = 0.35  # the engine takes the thread back when others use less than this
# /proc/stat's per-CPU columns that are not this CPU's idle time: user, nice, system, (idle,
# iowait skipped), irq, softirq, steal. guest time is already counted in user.
BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)


def cores_taken(others: float, taken: int) -> int:
    """Whole cores the neighbours hold, given `others` cores of their CPU time and the count
    the engine already gave up (`taken`): a count rises at `TAKE_AT` of a core past it and
    falls only below `GIVE_BACK_BELOW`."""
    rising = math.floor(others + 1 - TAKE_AT)
    if rising > taken:
        return rising
    falling = math.floor(others + 1 - GIVE_BACK_BELOW)
    return min(taken, max(falling, 0))


def _proc_busy(cores: frozenset[int], stat: str) -> int:
    """From /proc/stat's text: the busy clock ticks of `cores`."""
    busy = 0
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name != "cpu" and int(name[3:]) in cores:
            columns = rest.split()
            busy += sum(int(columns[i]) for i in BUSY_COLUMNS if i < len(columns))
    return busy


def _self_busy(stat: str) -> int:
    """This process's user and system clock ticks, from /proc/self/stat's text (the command
    name may hold spaces and parentheses: the fields are counted from its closing one)."""
    fields = stat.rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])


def _read(path: str) -> str:
    return Path(path).read_text()


@dataclass
class CoreShare:
    """The threads a CPU engine should run with now (at most `most`, at least one)."""

    most: int
    cores: frozenset[int] = field(default_factory=lambda: frozenset(os.sched_getaffinity(0)))
    interval_s: float = 0.25
    clock: Callable[[], float] = time.monotonic
    read: Callable[[str], str] = _read
    others: float = 0.0  # cores' worth of CPU the other processes used, over the window
    taken: int = 0
    steps: int = 0  # steps the engine asked for, and how many of them ran on fewer threads
    steps_fewer: int = 0
    _window: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    _last: tuple[float, int, int] | None = None  # when, all busy ticks, our busy ticks
    _ticks_per_s: int = field(default_factory=lambda: os.sysconf("SC_CLK_TCK"))
    _stop: threading.Event = field(default_factory=threading.Event)
    _reader: threading.Thread | None = None

    def start(self) -> None:
        """Read /proc every `interval_s` in a daemon thread until `stop`."""
        self.sample()
        self._reader = threading.Thread(target=self._run, name="fairlane-cores", daemon=True)
        self._reader.start()

    def stop(self) -> None:
        self._stop.set()
        if self._reader is not None:
            self._reader.join()

    def threads(self) -> int:
        """The engine's threads for its next step."""
        threads = max(1, self.most - self.taken)
        self.steps += 1
        self.steps_fewer += threads < self.most
        return threads

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        """One reading: what the other processes used since the last, and the cores they
        hold by the window's mean."""
        now = self.clock()
        try:
            busy = _proc_busy(self.cores, self.read("/proc/stat"))
            ours = _self_busy(self.read("/proc/self/stat"))
        except (OSError, ValueError, IndexError):  # no procfs (not Linux): all cores, always
            return
        if self._last is not None and now > self._last[0]:
            when, busy_before, ours_before = self._last
            elapsed_ticks = (now - when) * self._ticks_per_s
            others_ticks = (busy - busy_before) - (ours - ours_before)
            self._window.append(max(0.0, others_ticks / elapsed_ticks))
            self.others = sum(self._window) / len(self._window)
            self.taken = min(cores_taken(self.others, self.taken), self.most - 1)
        self._last = (now, busy, ours)

    def as_dict(self) -> dict[str, Any]:
        return {
            "threads": max(1, self.most - self.taken),
            "most": self.most,
            "others_cores": round(self.others, 2),
            "steps": self.steps,
            "steps_on_fewer_threads": self.steps_fewer,
        }
