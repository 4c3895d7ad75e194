"""The simulator played as `bench family` plays a server, and set beside a measured evening."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml

from fairlane.bench.family_sim import fit, format_fit, phase_workload, simulate_phase, simulated
from fairlane.policy import Kind, Priority
from fairlane.sim import scenario
from fairlane.sim.simulator import Simulator
from fairlane.sim.workload import Job, Loop, Workload

CPU_EVENING = (
    Path(__file__).resolve().parents[2] / "addon" / "fairlane" / "workloads" / "family-cpu.yaml"
)


def _with_round_trip(tmp_path: Path, ms: float) -> str:
    """cpu-2core with the host's round trip set to `ms`."""
    from importlib import resources

    from fairlane.profiles import PROFILE_SCHEMA

    text = resources.files("fairlane").joinpath("profiles/cpu-2core.yaml").read_text()
    data = PROFILE_SCHEMA(yaml.safe_load(text))
    data["host"] = {"round_trip_ms": ms}
    path = tmp_path / f"rt{ms:g}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_a_phase_holds_the_requests_bench_family_sends_in_it() -> None:
    workload = scenario(CPU_EVENING, "cpu-2core", duration_s=60).workload
    interactive = phase_workload(workload, "interactive")
    background = phase_workload(workload, "background")
    assert interactive.jobs and all(j.priority.interactive for j in interactive.jobs)
    assert not any(loop.units[0][0].priority.interactive is False for loop in interactive.loops)
    assert {loop.name for loop in background.loops} == {"documents", "summaries"}
    assert all(not j.priority.interactive for j in background.jobs)
    assert len(phase_workload(workload, "mixed").jobs) == len(workload.jobs)
    # The bench sends a spoken command's reply turn but does not speak the reply.
    replies = [j.then for j in workload.jobs if j.kind is Kind.STT]
    assert replies and all(r is not None and r.sentence_tokens for r in replies)
    played = [j.then for j in interactive.jobs if j.kind is Kind.STT]
    assert all(r is not None and r.sentence_tokens == 0 for r in played)


def test_a_closed_loops_next_request_comes_a_round_trip_after_the_answer(tmp_path) -> None:
    """The host's round trip: a client sends its next document this long after the last
    answer, and the device runs something else meanwhile."""
    from fairlane.policy import CostModel, PolicyConfig, make_policy
    from fairlane.profiles import load

    docs = tuple(
        (Job(0.0, "document", Kind.EMBED, Priority.BACKGROUND, "indexer", 200),)
        for _ in range(4)
    )
    workload = Workload("docs", 30.0, (), loops=(Loop("documents", 1, docs),))
    costs, _ = load("cpu-2core")
    policy = make_policy("fairlane", PolicyConfig(), CostModel(costs))
    result = Simulator(policy, CostModel(costs), workload, round_trip_s=0.25).run()
    records = sorted(result.records, key=lambda r: r.arrival)
    assert len(records) == 4
    for last, following in itertools.pairwise(records):
        assert last.finished_at is not None
        assert following.arrival == pytest.approx(last.finished_at + 0.25)
    assert [loop for loop, _, _ in result.units_done] == ["documents"] * 4


def test_the_simulator_counts_the_background_llm_tokens_it_computed_once_each() -> None:
    scn = scenario(CPU_EVENING, "cpu-2core", duration_s=60)
    result = simulate_phase(scn.workload, "background", "cpu-2core", scn.config, noise=0.0)
    computed = sum(s.tokens.get(Priority.BACKGROUND, 0) for s in result.steps)
    # Every background LLM request's positions once: its prompt less the cached prefix,
    # and its tokens out but the last (sampled, never fed back).
    finished = [r for r in result.records if r.kind is Kind.LLM and r.finished_at is not None]
    assert finished
    most = sum(r.prompt_tokens + len(r.token_times) for r in result.records if r.kind is Kind.LLM)
    assert 0 < computed <= most


def test_a_latency_bound_indexer_takes_less_of_the_device_with_a_round_trip(tmp_path) -> None:
    """With no round trip the next document is always queued when a step ends; with one, the
    LLM's summaries take the device meanwhile (what the server does: its indexer alone gets
    ~0.3 of the device beside the summaries, not the ~0.5 the simulator gave)."""
    scn = scenario(CPU_EVENING, "cpu-2core", duration_s=60)
    shares = {}
    for ms in (0.0, 20.0):
        report = simulated(scn.workload, ["background"], _with_round_trip(tmp_path, ms), scn.config)
        shares[ms] = report[0]["background_busy"]
    assert shares[20.0]["embed"] < shares[0.0]["embed"]
    assert shares[20.0]["llm"] > shares[0.0]["llm"]


def test_the_simulator_and_a_measured_evening_are_set_side_by_side() -> None:
    scn = scenario(CPU_EVENING, "cpu-2core", duration_s=30)
    predicted = simulated(scn.workload, ["interactive", "mixed"], "cpu-2core", scn.config)
    assert [r["target"] for r in predicted] == ["simulator", "simulator"]
    # The simulator's own reports, read as a server's: every row within its bound of itself.
    measured = [{**r, "target": "fairlane"} for r in predicted]
    rows = fit(measured, predicted)
    assert rows and all(row["within"] for row in rows)
    assert {r["phase"] for r in rows} == {"interactive", "mixed"}
    assert any(r["row"] == "voice/llm SLO met" for r in rows)
    # How the device time was cut: the background-only steps' median, as the server reports it.
    assert any(r["row"] == "background llm step p50 ms" and r["simulator"] for r in rows)
    # A server that did half the background work is more than 15% off.
    halved = []
    for report in measured:
        copy = dict(report)
        if copy["background_llm_computed_per_s"]:
            copy["background_llm_computed_per_s"] /= 2
        halved.append(copy)
    missed = [r for r in fit(halved, predicted) if not r["within"]]
    assert [r["row"] for r in missed] == ["background LLM computed tok/s"]
    assert "NO" in format_fit(fit(halved, predicted))


def test_a_phase_begins_from_what_the_server_heard_before_it() -> None:
    """`bench family` plays its phases one after the other on one server, after a warm-up:
    the policy's forecast of who is talking begins from those requests. Three spoken commands
    three seconds apart just before a summary arrives hold its first step to the
    conversation's step (`forecast_wait_s`); with nothing heard, the step runs to the
    arrival wait."""
    from dataclasses import replace as replaced

    from fairlane.bench.family_sim import heard_after, warm_up_heard
    from fairlane.policy import CostModel, PolicyConfig, make_policy
    from fairlane.profiles import load

    costs, _ = load("cpu-2core")
    config = replaced(PolicyConfig(), slice_ms=50.0).scaled(8)
    summary = Job(0.0, "summaries", Kind.LLM, Priority.BACKGROUND, "docs", 3000, 4)
    workload = Workload("summary", 30.0, (summary,))
    spoken = [(-9.0 + 3 * i, Kind.STT, Priority.VOICE) for i in range(3)]
    first = {}
    for name, history in (("heard", spoken), ("nothing", [])):
        policy = make_policy("fairlane", config, CostModel(costs))
        result = Simulator(policy, CostModel(costs), workload, history=history).run()
        first[name] = result.steps[0].end - result.steps[0].start
    assert first["heard"] <= config.forecast_wait_s + 1e-9
    assert first["nothing"] > 2 * config.forecast_wait_s
    # The warm-up's requests end as the first phase begins; a phase moves everything heard
    # back by its length, its interactive tail and the bench's pause between phases.
    scn = scenario(CPU_EVENING, "cpu-2core", duration_s=30)
    warm = warm_up_heard(scn.workload, "cpu-2core")
    assert warm and all(at < 0 for at, _, _ in warm)
    assert {(kind, priority) for _, kind, priority in warm} >= {
        (Kind.LLM, Priority.CHAT), (Kind.LLM, Priority.VOICE), (Kind.STT, Priority.VOICE)
    }
    result = simulate_phase(scn.workload, "interactive", "cpu-2core", scn.config, history=warm)
    later = heard_after(result, warm, 30.0)
    heard = [r for r in result.records if r.priority.interactive]
    assert len(later) == len(warm) + len(heard)
    assert max(at for at, _, _ in later) <= -3.0  # the pause between phases at least
