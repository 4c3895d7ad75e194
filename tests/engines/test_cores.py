"""A CPU engine on automatic threads gives a thread up while another process holds a core."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from fairlane.engines import models
from fairlane.engines.cores import CoreShare, cores_taken
from fairlane.engines.llm import EngineConfig, LlamaEngine, SamplingParams
from fairlane.policy import Chunk, LlmPlan, Priority

OWNED = sorted(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(len(OWNED) < 2, reason="one core: no thread to give up")
# Busy on one core until killed, and never beyond the test (its parent).
SPIN = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass\n"


@pytest.mark.parametrize(
    ("others", "taken", "expected"),
    [
        (0.0, 0, 0),
        (0.59, 0, 0),  # not yet a core
        (0.6, 0, 1),
        (0.5, 1, 1),  # a neighbour hovering at half a core keeps the count where it is
        (0.36, 1, 1),
        (0.34, 1, 0),  # given back
        (1.7, 1, 2),
        (1.4, 2, 2),
        (1.3, 2, 1),
    ],
)
def test_a_core_is_taken_at_six_tenths_and_given_back_below_a_third(
    others: float, taken: int, expected: int
) -> None:
    assert cores_taken(others, taken) == expected


def _proc(busy: dict[int, int], ours: int) -> dict[str, str]:
    """/proc's two files as the kernel writes them: busy ticks per CPU, and our ticks."""
    lines = [f"cpu  {sum(busy.values())} 0 0 1000 0 0 0 0 0 0"]
    lines += [f"cpu{n} {ticks} 0 0 1000 0 0 0 0 0 0" for n, ticks in busy.items()]
    lines += ["intr 0", "procs_running 1", "procs_blocked 0"]
    stat = f"1234 (fairlane serve (x)) R 1 1 1 0 -1 0 0 0 0 0 {ours} 0 0 0 20 0 3 0"
    return {"/proc/stat": "\n".join(lines) + "\n", "/proc/self/stat": stat}


class Host:
    """A 3-CPU machine's /proc, this process on CPUs 0 and 1, read by a `CoreShare` every
    quarter second."""

    def __init__(self) -> None:
        self.now = 0.0
        self.ticks = {0: 0, 1: 0, 2: 0}
        self.ours = 0
        self.share = CoreShare(2, frozenset({0, 1}), 0.25, lambda: self.now, self.read)
        self.share._ticks_per_s = 100
        self.share.sample()  # the first reading: nothing to compare with

    def read(self, path: str) -> str:
        return _proc(self.ticks, self.ours)[path]

    def quarter(self, ours: int, others: int) -> int:
        """A quarter second (25 ticks a core) in which this process used `ours` ticks of its
        cores and other processes `others`, CPU 2 busy throughout; the threads after it."""
        self.now += 0.25
        self.ticks[0] += ours
        self.ticks[1] += others
        self.ticks[2] += 25
        self.ours += ours
        self.share.sample()
        return self.share.threads()


def test_a_neighbour_that_holds_a_core_for_a_second_takes_a_thread_until_it_stops() -> None:
    host = Host()
    # Others hold 0.8 of a core: the mean of the window reaches 0.6 on the third reading.
    assert [host.quarter(25, 20) for _ in range(2)] == [1, 1]  # 0.8 of a core from the first
    assert host.share.others == pytest.approx(0.8)
    # Half a core: still given up (the gap). Then quiet: taken back once the mean is low.
    assert [host.quarter(25, 12) for _ in range(4)] == [1, 1, 1, 1]
    threads = [host.quarter(25, 2) for _ in range(4)]
    assert threads[-1] == 2 and threads[0] == 1
    assert host.share.as_dict() == {
        "threads": 2, "most": 2, "others_cores": 0.08, "steps": 10, "steps_on_fewer_threads": 7
    }


def test_a_client_burst_between_quiet_readings_keeps_the_threads() -> None:
    """A request's sender (Home Assistant, a benchmark) runs a quarter second and waits."""
    host = Host()
    for _ in range(4):
        host.quarter(25, 0)
    assert host.quarter(25, 25) == 2  # a whole core for one reading: the mean is 0.25
    assert host.quarter(25, 10) == 2
    assert host.share.others < 0.6


def test_the_first_step_after_an_idle_spell_goes_by_the_last_second() -> None:
    """The reader runs while the engine is idle: a neighbour that started meanwhile is seen,
    and one that ran an hour ago and stopped is not."""
    host = Host()
    for _ in range(40):
        host.quarter(0, 25)  # idle, a neighbour busy ten seconds
    for _ in range(8):
        host.quarter(0, 0)  # then two quiet seconds
    assert host.share.threads() == 2
    for _ in range(4):
        host.quarter(0, 25)  # a neighbour began a second ago
    assert host.share.threads() == 1


def test_without_procfs_the_engine_keeps_its_threads() -> None:
    def unreadable(path: str) -> str:
        raise FileNotFoundError(path)

    share = CoreShare(4, frozenset({0}), 0.25, time.monotonic, unreadable)
    share.sample()
    share.sample()
    assert share.threads() == 4


@pytest.fixture
def neighbour() -> Iterator[subprocess.Popen[bytes]]:
    """A process spinning on one of this process's cores."""
    process = subprocess.Popen(
        [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{OWNED[-1]}}})\n{SPIN}"]
    )
    yield process
    process.kill()
    process.wait()


@needs_two_cores
def test_a_neighbour_on_one_core_is_seen_on_this_machine(
    neighbour: subprocess.Popen[bytes],
) -> None:
    share = CoreShare(len(OWNED), interval_s=0.2)
    share.start()
    try:
        deadline = time.monotonic() + 30
        while share.threads() == len(OWNED) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert share.others >= 0.6
        assert share.threads() == len(OWNED) - 1
    finally:
        share.stop()


@needs_two_cores
def test_the_llm_engine_runs_on_the_cores_a_neighbour_leaves_and_answers_the_same(
    neighbour: subprocess.Popen[bytes],
) -> None:
    model = models.resolve_llm("gemma-3-270m")
    engine = LlamaEngine(EngineConfig(model, n_ctx=512, n_seq_max=1, give_way=True))
    fixed = LlamaEngine(EngineConfig(model, n_ctx=512, n_seq_max=1))  # EngineConfig's default
    try:
        assert engine.cores is not None and fixed.cores is None
        engine.cores.interval_s = 0.2
        deadline = time.monotonic() + 60
        outputs: list[list[int]] = []
        while time.monotonic() < deadline:
            outputs.append(_greedy(engine, "The front door is"))
            if engine.thread_use()["threads"] == len(OWNED) - 1:
                break
        assert engine.thread_use()["threads"] == len(OWNED) - 1
        assert engine.thread_use()["others_cores"] >= 0.6
        # Without giving way the count is kept, and the threads change nothing of the answer.
        assert _greedy(fixed, "The front door is") == outputs[-1] == outputs[0]
        assert fixed.thread_use() == {"threads": len(OWNED), "fixed": True}
    finally:
        engine.close()
        fixed.close()


def _greedy(engine: LlamaEngine, text: str) -> list[int]:
    prompt = engine.tokenize(text, add_special=True)
    engine.add("r", prompt, SamplingParams(max_tokens=4, temperature=0))
    engine.execute(LlmPlan((Chunk("r", 0, len(prompt), True, False, Priority.CHAT),), (), 0.0, 0))
    for _ in range(3):
        start = len(engine.sequences["r"].tokens) - 1
        engine.execute(LlmPlan((Chunk("r", start, 1, True, True, Priority.CHAT),), (), 0.0, 0))
    tokens = engine.sequences["r"].tokens[len(prompt):]
    engine.release("r")
    return tokens
