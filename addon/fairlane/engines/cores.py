"""How many of its cores the CPU LLM can use now: a neighbour that holds a core takes it.

llama.cpp's CPU threads meet at a barrier after every operation of a step, so a step runs at
the pace of its slowest thread. On a Home Assistant host another program (a camera recorder,
a database, Home Assistant itself) often holds one of the cores; then one of two threads runs
only part of the time and the other waits for it at every barrier. Measured on 2 cores with
one neighbour spinning (docs/history/benchmarks.md, "A busy host, threads that give way"):
a 120-token prompt 1.5 s on two threads against 1.0-1.1 s on one, a decode step 50-80 ms
against 34-37 ms; quiet, two threads are 1.7x and 1.5x faster than one.

So an engine on automatic threads (`llm.threads: 0`) asks `CoreShare` before each step: it
reads, every `interval_s` (0.25 s) while the engine runs steps, how much CPU time the machine's
other processes used on this process's cores (`/proc/stat` less `/proc/self/stat`, steal
time included: a core the hypervisor gave away is as gone), and gives the engine the cores
they leave. After the engine was idle, what others used meanwhile (another program's burst an
hour ago) is not taken as now: its first step goes by the other processes' tasks runnable at
that instant. A threshold with a gap (a core is taken at 0.6 of one, given back below 0.35)
keeps a neighbour that hovers around half a core from switching the engine's threads at every
reading.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STALE = 4  # intervals since the last step ended: the engine was idle
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


def _proc_busy(cores: frozenset[int], stat: str) -> tuple[int, int, int]:
    """From /proc/stat's text: busy clock ticks of `cores`, how many CPUs it lists, and how
    many tasks are runnable now (`procs_running`, the reader included)."""
    busy = listed = running = 0
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if name == "procs_running":
            running = int(rest)
        if not name.startswith("cpu") or name == "cpu":
            continue
        listed += 1
        if int(name[3:]) in cores:
            columns = rest.split()
            busy += sum(int(columns[i]) for i in BUSY_COLUMNS if i < len(columns))
    return busy, listed, running


def _self_busy(stat: str) -> int:
    """This process's user and system clock ticks, from /proc/self/stat's text (the command
    name may hold spaces and parentheses: the fields are counted from its closing one)."""
    fields = stat.rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])


def _read(path: str) -> str:
    return Path(path).read_text()


def _running_here() -> int:
    """This process's threads that are runnable now (state R in /proc/self/task/*/stat): the
    reader, and whatever of the engines' pools, the HTTP loop or another engine still runs."""
    running = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            running += _read(str(task / "stat")).rpartition(")")[2].split()[0] == "R"
        except (OSError, IndexError):  # the thread ended meanwhile
            continue
    return running


@dataclass
class CoreShare:
    """The threads a CPU engine should run with now (at most `most`, at least one)."""

    most: int
    cores: frozenset[int] = field(default_factory=lambda: frozenset(os.sched_getaffinity(0)))
    interval_s: float = 0.25
    clock: Callable[[], float] = time.monotonic
    read: Callable[[str], str] = _read
    running_here: Callable[[], int] = _running_here
    others: float = 0.0  # cores' worth of CPU the other processes used in the last interval
    taken: int = 0
    _last: tuple[float, int, int] | None = None  # when, all busy ticks, our busy ticks
    _ticks_per_s: int = field(default_factory=lambda: os.sysconf("SC_CLK_TCK"))
    _step_ended: float | None = None

    def threads(self) -> int:
        """The engine's threads for the next step (reads /proc at most every `interval_s`)."""
        now = self.clock()
        if self._last is None or now - self._last[0] >= self.interval_s:
            self._sample(now)
        return max(1, self.most - self.taken)

    def step_ended(self) -> None:
        """The engine's step is done: until the next, the engine is idle."""
        self._step_ended = self.clock()

    def _sample(self, now: float) -> None:
        try:
            busy, listed, running = _proc_busy(self.cores, self.read("/proc/stat"))
            ours = _self_busy(self.read("/proc/self/stat"))
        except (OSError, ValueError, IndexError):  # no procfs (not Linux): all cores, always
            return
        idle = self._step_ended is not None and now - self._step_ended > STALE * self.interval_s
        if self._last is not None and idle:
            # The engine was idle: what others used meanwhile says little about now. Until the
            # next reading, the other processes' tasks runnable at this instant stand for it
            # (this process's own, such as speech-to-text's threads just done or the HTTP
            # loop, are not a neighbour), where this process may use every CPU (with fewer,
            # others run elsewhere too). A long step is no idle spell: a reading across it is
            # what others used while it ran.
            self._last = self._step_ended = None
            if listed == len(self.cores):
                self.others = float(max(running - self.running_here(), 0))
                self.taken = min(cores_taken(self.others, 0), self.most - 1)
        if self._last is not None:
            when, busy_before, ours_before = self._last
            elapsed_ticks = (now - when) * self._ticks_per_s
            others_ticks = (busy - busy_before) - (ours - ours_before)
            self.others = max(0.0, others_ticks / elapsed_ticks)
            self.taken = min(cores_taken(self.others, self.taken), self.most - 1)
        self._last = (now, busy, ours)

    def as_dict(self) -> dict[str, Any]:
        return {
            "threads": max(1, self.most - self.taken),
            "most": self.most,
            "others_cores": round(self.others, 2),
        }
