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


def _proc(busy: dict[int, int], ours: int, running: int = 1) -> dict[str, str]:
    """/proc's two files as the kernel writes them: busy ticks per CPU, the tasks runnable
    now, and our ticks."""
    lines = [f"cpu  {sum(busy.values())} 0 0 1000 0 0 0 0 0 0"]
    lines += [f"cpu{n} {ticks} 0 0 1000 0 0 0 0 0 0" for n, ticks in busy.items()]
    lines += ["intr 0", f"procs_running {running}", "procs_blocked 0"]
    stat = f"1234 (fairlane serve (x)) R 1 1 1 0 -1 0 0 0 0 0 {ours} 0 0 0 20 0 3 0"
    return {"/proc/stat": "\n".join(lines) + "\n", "/proc/self/stat": stat}


def test_the_threads_follow_what_the_other_processes_use_of_this_process_cores() -> None:
    now = [0.0]
    files = _proc({0: 0, 1: 0, 2: 0}, ours=0)
    share = CoreShare(2, frozenset({0, 1}), 0.5, lambda: now[0], lambda p: files[p])
    share._ticks_per_s = 100
    assert share.threads() == 2  # the first reading: nothing to compare with

    def after(seconds: float, busy: dict[int, int], ours: int) -> int:
        nonlocal files
        now[0] += seconds
        files = _proc(busy, ours)
        return share.threads()

    # One second: our process used 100 ticks over both cores, others 80 on them, and CPU 2
    # (not ours) is busy: 0.8 of a core taken from the engine.
    assert after(1.0, {0: 100, 1: 80, 2: 100}, ours=100) == 1
    assert share.others == pytest.approx(0.8)
    assert after(0.2, {0: 100, 1: 80, 2: 100}, ours=100) == 1  # not read again yet
    # Half a core: still given up (the gap). Then a quiet second: taken back.
    assert after(1.0, {0: 200, 1: 130, 2: 200}, ours=200) == 1
    assert after(1.0, {0: 300, 1: 140, 2: 300}, ours=300) == 2
    assert share.as_dict() == {"threads": 2, "most": 2, "others_cores": 0.1}


def test_after_idle_the_first_step_goes_by_the_tasks_runnable_then() -> None:
    """What others used while the engine was idle is not taken as now."""
    now = [0.0]
    files = _proc({0: 0, 1: 0}, ours=0)
    here = [1]  # this process's runnable threads: the reader
    share = CoreShare(2, frozenset({0, 1}), 0.25, lambda: now[0], lambda p: files[p],
                      lambda: here[0])
    share._ticks_per_s = 100
    share.threads()
    # A step of two seconds: no idle spell; the reading across it is what others used.
    now[0] += 2
    files = _proc({0: 200, 1: 20}, ours=200, running=3)
    assert share.threads() == 2 and share.others == pytest.approx(0.1)
    share.step_ended()
    # A minute idle, in which another program used a core for half of it; it has stopped.
    now[0] += 60
    files = _proc({0: 3200, 1: 20}, ours=200, running=1)  # only the reader runs now
    assert share.threads() == 2
    share.step_ended()
    # Another minute; this process's speech-to-text threads are still running: not others.
    now[0] += 60
    files = _proc({0: 3200, 1: 20}, ours=200, running=3)
    here[0] = 3
    assert share.threads() == 2 and share.others == 0.0
    here[0] = 1
    share.step_ended()
    # Another minute, and something runs beside the reader at this instant.
    now[0] += 60
    files = _proc({0: 3200, 1: 6020}, ours=200, running=2)
    assert share.threads() == 1 and share.others == 1.0
    # The next reading is a measured interval again.
    now[0] += 0.25
    files = _proc({0: 3200, 1: 6025}, ours=200, running=2)
    assert share.threads() == 2 and share.others == pytest.approx(0.2)


def test_without_procfs_the_engine_keeps_its_threads() -> None:
    def unreadable(path: str) -> str:
        raise FileNotFoundError(path)

    assert CoreShare(4, frozenset({0}), 0.0, time.monotonic, unreadable).threads() == 4


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
    deadline = time.monotonic() + 30
    while share.threads() == len(OWNED) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert share.others >= 0.6
    assert share.threads() == len(OWNED) - 1


@needs_two_cores
def test_the_llm_engine_runs_on_the_cores_a_neighbour_leaves_and_answers_the_same(
    neighbour: subprocess.Popen[bytes],
) -> None:
    model = models.resolve_llm("gemma-3-270m")
    engine = LlamaEngine(EngineConfig(model, n_ctx=512, n_seq_max=1, give_way=True))
    fixed = LlamaEngine(EngineConfig(model, n_ctx=512, n_seq_max=1))  # the default
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
        # By default the count is kept, and the threads change nothing of the answer.
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
