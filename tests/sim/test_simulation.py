"""The family evening in the simulator: the real policy against a GPU cost model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fairlane.cli import main
from fairlane.sim import default_workload, scenario, simulate
from fairlane.sim.report import summarize

SHARED = Path(__file__).resolve().parents[3] / "shared" / "workloads" / "family.yaml"
INTERACTIVE_ROWS = ("voice/stt", "voice/llm", "chat/llm")


@pytest.fixture(scope="module")
def family_on_gpu() -> dict[str, dict]:
    scn = scenario(default_workload(), "rtx4090")
    return {name: summarize(simulate(scn, name), scn.workload.slo) for name in ("fairlane", "fcfs")}


def test_shipped_workload_is_the_design_family_evening() -> None:
    if SHARED.exists():  # the design folder sits beside the checkout in development and CI
        assert default_workload().read_text() == SHARED.read_text()


def test_fairlane_meets_interactive_slos_where_fcfs_does_not(family_on_gpu) -> None:
    fair, fcfs = family_on_gpu["fairlane"], family_on_gpu["fcfs"]
    for row in INTERACTIVE_ROWS:
        assert fair["classes"][row]["slo_met"] == 1.0, row
    assert min(fcfs["classes"][row]["slo_met"] for row in INTERACTIVE_ROWS) < 1.0
    # Under FCFS a voice command that lands behind the document backlog waits for all of it.
    assert fcfs["classes"]["voice/stt"]["ttft_ms"]["p99"] > 500
    assert fair["fairness"]["jain_slo_attainment"] == 1.0


def test_background_throughput_stays_within_fifteen_percent_of_fcfs(family_on_gpu) -> None:
    fair, fcfs = family_on_gpu["fairlane"], family_on_gpu["fcfs"]
    assert fair["background"]["done_fraction"] == 1.0
    ratio = fair["background"]["backlog_tokens_per_s"] / fcfs["background"]["backlog_tokens_per_s"]
    assert ratio >= 0.85


def test_simulate_command_prints_the_table_and_writes_json_and_plot(tmp_path, capsys) -> None:
    report, png = tmp_path / "report.json", tmp_path / "plot.png"
    code = main(["simulate", "--profile", "h100", "--duration", "120", "--json", str(report),
                 "--plot", str(png)])
    assert code == 0
    out = capsys.readouterr().out
    assert "voice/stt" in out and "fcfs" in out and "Jain" in out
    data = json.loads(report.read_text())
    assert [r["policy"] for r in data["reports"]] == ["fairlane", "fcfs"]
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_simulate_rejects_an_unknown_profile(capsys) -> None:
    assert main(["simulate", "--profile", "nonesuch"]) == 2
    assert "unknown profile" in capsys.readouterr().err


def test_on_a_party_night_voice_stays_fast_only_with_fairlane() -> None:
    party = Path(str(default_workload())).with_name("family-party.yaml")
    scn = scenario(party, "rtx4090")
    fair, fcfs = (summarize(simulate(scn, name), scn.workload.slo) for name in ("fairlane", "fcfs"))
    assert fair["classes"]["voice/stt"]["slo_met"] == 1.0
    assert fcfs["classes"]["voice/stt"]["slo_met"] < 0.9
    assert fair["classes"]["voice/llm"]["slo_met"] > fcfs["classes"]["voice/llm"]["slo_met"]
    assert fair["background"]["done_fraction"] == 1.0
