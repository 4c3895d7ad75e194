from __future__ import annotations

import pytest

from fairlane.policy import Kind, Priority
from fairlane.sim import default_workload
from fairlane.sim.workload import Sampler, build, load


def test_family_workload_has_every_kind_of_household_work() -> None:
    workload = load(default_workload())
    groups = {j.group for j in workload.jobs}
    assert groups == {"voice", "chat", "automation", "document", "summary"}
    voice = [j for j in workload.jobs if j.group == "voice"]
    # A voice command is speech first, then the LLM turn that answers it.
    assert all(j.kind is Kind.STT and j.then is not None and j.then.kind is Kind.LLM
               for j in voice)
    assert workload.slo[Priority.VOICE].stt_ms == 500
    assert {j.client for j in voice} <= {"parent-a", "parent-b", "child"}
    assert load(default_workload()).jobs == workload.jobs  # seeded: the same evening every time


def test_lognormal_matches_its_median_and_p95() -> None:
    sampler = Sampler(1)
    values = sorted(sampler.draw({"lognormal": {"median": 100, "p95": 400}}) for _ in range(20000))
    assert values[10000] == pytest.approx(100, rel=0.05)
    assert values[19000] == pytest.approx(400, rel=0.08)


def test_bad_workload_names_the_problem(tmp_path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nclients: []\nclasses: {}\n")
    with pytest.raises(ValueError, match="duration_s"):
        load(path)


def test_an_empty_household_has_no_jobs() -> None:
    data = {"name": "empty", "duration_s": 10, "seed": 0, "clients": [], "classes": {},
            "cpu_slo_scale": 1.0}
    assert build(data).jobs == ()
