"""The device loop's own time per step: recorded by the loop around a real engine, published
per device loop and batch size."""

from __future__ import annotations

import time
from typing import Any

import pytest

from fairlane.policy import (
    CostModel,
    Kind,
    PolicyConfig,
    Priority,
    Request,
    StepResult,
    make_policy,
)
from fairlane.policy.plan import SeqOutput
from fairlane.profiles import load as load_profile
from fairlane.runtime.device import DeviceLoop, StepRecord
from fairlane.runtime.overhead import batch_label, host_overhead, step_group


def record(sequences: int, host: float, took: float, device_s: float | None, end: float = 100.0,
           kind: Kind = Kind.LLM) -> StepRecord:
    ids = tuple(f"r{i}" for i in range(sequences))
    return StepRecord(end - took, end, kind, ids, ids, (Priority.CHAT,) * sequences, 0,
                      sequences, took, "gpu", host, device_s)


def test_llm_steps_are_grouped_by_how_many_sequences_they_carry() -> None:
    assert [batch_label(n) for n in (1, 2, 4, 5, 8, 9, 16, 17, 32, 33, 500)] == [
        "1", "2-4", "2-4", "5-8", "5-8", "9-16", "9-16", "17-32", "17-32", "33+", "33+"]
    assert step_group(record(8, 0.001, 0.01, 0.009)) == "llm:5-8"
    assert step_group(record(1, 0.001, 0.01, None, kind=Kind.STT)) == "stt"


def test_the_host_share_counts_the_device_call_once() -> None:
    # A step of 10 ms of which 8 ms in llama_decode, and 1 ms of the loop's own around it:
    # host = 1 + (10 - 8) = 3 ms in the record; host share = 3 / (3 + 8).
    steps = [record(8, 0.003, 0.010, 0.008, end=100.0 + i) for i in range(5)]
    overhead = host_overhead(steps, now=110.0)["gpu"]["llm:5-8"]
    assert overhead["steps"] == 5
    assert overhead["host_ms_p50"] == pytest.approx(3.0)
    assert overhead["device_ms_p50"] == pytest.approx(8.0)
    assert overhead["host_share"] == pytest.approx(3 / 11, abs=1e-3)
    assert host_overhead(steps, now=1000.0) == {}  # only the last five minutes


class _Engine:
    """An engine whose step is all host work (`device_s=0`, e.g. its batch filling and
    sampling) or all device work (`device_s=None`)."""

    def __init__(self, device_s: float | None) -> None:
        self.device_s = device_s

    def execute(self, plan: Any) -> tuple[StepResult, list[Any]]:
        outputs = tuple(SeqOutput(c.request_id, 1) for c in plan.chunks if c.samples)
        return StepResult(0.001, outputs, device_s=self.device_s), []

    def release(self, request_id: str) -> None:
        pass


def _three_steps(device_s: float | None) -> list[StepRecord]:
    profile, _ = load_profile("cpu-2core")
    policy = make_policy("fairlane", PolicyConfig(), CostModel(profile))
    loop = DeviceLoop(policy, {Kind.LLM: _Engine(device_s)})
    loop.submit(
        Request("a", Kind.LLM, Priority.CHAT, "c", 0.0, prompt_tokens=8, max_tokens=3),
        lambda: None,
        lambda event: None,
    )
    loop.start()
    deadline = time.monotonic() + 30
    try:
        while len(loop.records) < 3 and time.monotonic() < deadline:  # the prefill, 2 decodes
            time.sleep(0.005)
    finally:
        loop.stop()
    return list(loop.records)


def test_what_the_engine_does_outside_its_device_call_is_host_time() -> None:
    steps = _three_steps(device_s=0.0)
    assert len(steps) >= 3
    for step in steps:
        assert step.device_s == 0.0
        assert step.host_s >= step.end - step.start > 0


def test_an_engine_that_reports_no_device_call_is_all_device_time() -> None:
    for step in _three_steps(device_s=None):
        assert step.device_s == step.end - step.start
        assert step.host_s >= 0
