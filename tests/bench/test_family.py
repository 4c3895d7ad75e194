"""`fairlane bench family`: a workload played in real time against the real server."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from fairlane.bench.family import family
from fairlane.bench.family_load import Prompts
from fairlane.bench.family_play import Played
from fairlane.bench.family_report import (
    format_background_steps,
    format_prediction,
    ratios,
    summarize,
)
from fairlane.bench.family_targets import target_config, target_parts
from fairlane.bench.servers import server_config
from fairlane.policy import Kind, Priority, Slo
from fairlane.runtime.metrics import RequestRecord
from fairlane.sim.workload import Job, load

SPEECH = Path(__file__).resolve().parents[1] / "fixtures" / "speech"


def _record(kind: Kind, priority: Priority, arrival: float, first: float, end: float,
            group: str = "x") -> RequestRecord:
    record = RequestRecord(kind, priority, "a", group, arrival)
    if kind is Kind.LLM:
        record.token_times = [first, end]
    record.finished_at = end
    return record


def test_the_report_has_every_class_the_voice_turn_and_background_work_apart() -> None:
    played = Played("fairlane", "mixed", 1, duration_s=60)
    stt = _record(Kind.STT, Priority.VOICE, 0.0, 0.0, 0.3)
    reply = _record(Kind.LLM, Priority.VOICE, 0.3, 0.8, 1.0)
    slow_chat = _record(Kind.LLM, Priority.CHAT, 2.0, 5.0, 5.1)
    played.records += [stt, reply, slow_chat]
    played.turns.append((stt, reply))
    played.background_llm_tokens, played.embedded_tokens = 600, 60_000
    slo = {Priority.VOICE: Slo(ttft_ms=1000, stt_ms=500), Priority.CHAT: Slo(ttft_ms=1000)}
    report = summarize(played, slo)
    assert set(report["classes"]) == {"voice/stt", "voice/llm", "chat/llm"}
    assert report["voice_turn_ms"]["p50"] == 800  # end of speech to the answer's first token
    assert report["classes"]["chat/llm"]["slo_met"] == 0.0  # 3 s to its first token
    assert report["interactive_slo_met"] == pytest.approx(2 / 3, abs=0.001)
    assert (report["background_llm_tokens_per_s"], report["embedded_tokens_per_s"]) == (10, 1000)


def test_ratios_compare_each_round_with_its_own_phases_alone() -> None:
    def report(phase: str, chat_p95: float, turn_p95: float, bg: float) -> dict:
        return {"target": "fairlane", "round": 1, "phase": phase, "interactive_slo_met": 1.0,
                "classes": {"chat/llm": {"ttft_ms": {"p95": chat_p95}}},
                "voice_turn_ms": {"p95": turn_p95},
                "background_llm_tokens_per_s": bg, "embedded_tokens_per_s": 10 * bg}

    rows = ratios([report("interactive", 100, 200, 0), report("background", 0, 0, 50),
                   report("mixed", 120, 300, 40)])
    assert rows == [{
        "target": "fairlane", "round": 1, "interactive_slo_met": 1.0,
        "background_llm_tokens_per_s": 40, "embedded_tokens_per_s": 400,
        "chat_ttft_p95_ratio": 1.2, "voice_first_token_p95_ratio": 1.5,
        "background_llm_ratio": 0.8, "embedded_ratio": 0.8,
    }]


def test_work_conserving_efficiency_scales_background_alone_by_the_share_left() -> None:
    """Interactive work alone kept the device busy 20% of the time; background work beside it
    did 0.72 of what it does alone: 0.72 / 0.8 = 0.9 of what the free 80% allows."""
    def report(phase: str, bg: float, interactive_busy: float | None) -> dict:
        return {"target": "fairlane", "round": 1, "phase": phase, "interactive_slo_met": 1.0,
                "classes": {}, "voice_turn_ms": {"p95": None},
                "background_llm_tokens_per_s": bg, "embedded_tokens_per_s": 0,
                "interactive_busy": interactive_busy}

    (row,) = ratios([report("interactive", 0, 0.2), report("background", 50, 0.0),
                     report("mixed", 36, 0.25)])
    assert row["background_llm_ratio"] == 0.72 and row["work_conserving"] == 0.9
    # A target that does not report its device use (the separate stack) has no figure.
    (row,) = ratios([report("interactive", 0, None), report("background", 50, None),
                     report("mixed", 36, None)])
    assert "work_conserving" not in row


def test_the_server_counted_figure_includes_a_prompt_the_phase_end_cut() -> None:
    """Clients saw 36 background tokens/s beside the interactive work (a summary's prompt
    still prefilling at the end counts nothing for them); the server computed 44: 44 / 50 /
    0.8 = 1.1. A target whose server does not count its tokens has only the clients' figure."""
    def report(phase: str, bg: float, computed: float | None) -> dict:
        return {"target": "fairlane", "round": 1, "phase": phase, "interactive_slo_met": 1.0,
                "classes": {}, "voice_turn_ms": {"p95": None},
                "background_llm_tokens_per_s": bg, "embedded_tokens_per_s": 0,
                "background_llm_computed_per_s": computed, "interactive_busy": 0.2}

    (row,) = ratios([report("interactive", 0, 0), report("background", 50, 50),
                     report("mixed", 36, 44)])
    assert row["work_conserving"] == 0.9 and row["work_conserving_computed"] == 1.1
    (row,) = ratios([report("interactive", 0, None), report("background", 50, None),
                     report("mixed", 36, None)])
    assert row["work_conserving"] == 0.9 and "work_conserving_computed" not in row


def test_all_background_work_weighs_each_lane_by_its_device_share_alone() -> None:
    """Alone, summaries had 70% of the device and documents 30%. Beside the interactive work
    (20% alone) the summaries did 0.5 of their work alone and the documents all of it:
    (0.5 · 0.7 + 1.0 · 0.3) / 1.0 = 0.65 of all background work, 0.81 of what the free 80%
    allows; the LLM alone says 0.62."""
    def report(phase: str, llm: float, embed: float, busy: dict[str, float]) -> dict:
        return {"target": "fairlane", "round": 1, "phase": phase, "interactive_slo_met": 1.0,
                "classes": {}, "voice_turn_ms": {"p95": None},
                "background_llm_tokens_per_s": llm, "embedded_tokens_per_s": embed,
                "interactive_busy": 0.2, "background_busy": busy}

    (row,) = ratios([report("interactive", 0, 0, {}),
                     report("background", 40, 2000, {"llm": 0.7, "embed": 0.3}),
                     report("mixed", 20, 2000, {"llm": 0.3, "embed": 0.3})])
    assert row["work_conserving"] == 0.62 and row["work_conserving_all"] == 0.81


@pytest.mark.model
def test_prompts_have_the_drawn_size_a_shared_prefix_and_a_nonce() -> None:
    prompts = Prompts()
    job = Job(0.0, "voice", Kind.LLM, Priority.VOICE, "a", prompt_tokens=700, output_tokens=20,
              prefix_tokens=600)
    first, second = prompts.messages(job, "turn on the light"), prompts.messages(job)
    assert first[0] == second[0] and first[0]["role"] == "system"  # the shared prefix
    assert prompts.tokens(first[0]["content"]) == pytest.approx(600, abs=2)
    assert first[1]["content"] != second[1]["content"]  # the rest is unique
    total = sum(prompts.tokens(m["content"]) for m in first)
    assert total == pytest.approx(700, abs=8)
    assert "turn on the light" in first[1]["content"]


@pytest.mark.model
def test_a_small_evening_against_the_real_server(tmp_path) -> None:
    """Every kind of household work, played for a few seconds against `fairlane serve`."""
    path = tmp_path / "evening.yaml"
    path.write_text(yaml.safe_dump({
        "name": "tiny", "duration_s": 8, "seed": 3, "clients": [],
        "classes": {
            "voice": {"clients": ["a"], "arrivals": {"poisson": {"per_min": 30}},
                      "audio_s": 2, "audio_dir": str(SPEECH),
                      "llm_turn": {"prompt_tokens": 120, "output_tokens": 4,
                                   "shared_prefix_tokens": 80}},
            "chat": {"clients": ["b"], "arrivals": {"poisson": {"per_min": 20}},
                     "prompt_tokens": 60, "output_tokens": 4},
            "background": {"documents": {"count": 50, "tokens_per_doc": 300,
                                         "chunk_tokens": 128, "in_flight": 1},
                           "summaries": {"count": 20, "prompt_tokens": 100,
                                         "output_tokens": 4, "in_flight": 1}},
        },
        "cpu_slo_scale": 8,
    }))
    workload = load(path)
    assert any(j.kind is Kind.STT for j in workload.jobs)
    result = family(workload, ["fairlane"], ["mixed", "background"], rounds=1, threads=1,
                    audio_dir=None, give_up_s=120, progress=lambda line: None)
    report, alone = result["reports"]
    assert report["errors"] == alone["errors"] == 0 and report["timed_out"] == 0
    for name, row in report["classes"].items():
        # Every kind of work is served (the summaries may wait out 8 s of voice and chat).
        if row["requests"] and name != "background/llm":
            assert row["finished"] >= 1
    assert report["voice_turn_ms"]["p50"] is not None
    assert report["embedded_tokens_per_s"] > 0
    # Summaries finished, and their texts' tokens (a summary is counted once its last turn ends).
    assert alone["summaries_per_min"] > 0
    assert alone["summarised_tokens_per_s"] == pytest.approx(
        alone["summaries_per_min"] / 60 * 100, rel=0.01)
    # The server's cost-model error, printed beside the SLO table.
    (errors,) = report["prediction_error"].values()
    llm_steps = sum(errors[k]["steps"] for k in ("decode", "mixed") if k in errors)
    assert llm_steps > 0 and errors["embed"]["steps"] > 0
    assert "embed" in format_prediction(result["reports"])
    # Its device use over the phase, and its background-only steps beside the slice.
    assert 0 < report["interactive_busy"] <= report["device_busy"] <= 1.05
    (kinds,) = report["background_steps"].values()
    assert kinds["embed"]["steps"] > 0 and kinds["embed"]["p95_over_slice"] > 0
    assert "embed" in format_background_steps(result["reports"])


def test_a_target_may_name_a_profile_and_policy_settings() -> None:
    """`fairlane@SETTING=VALUE` runs the same server with one policy setting changed, so a
    before/after of a rule is one interleaved run."""
    assert target_parts("fairlane") == ("fairlane", "", {})
    assert target_parts("fcfs:h200") == ("fcfs", "h200", {})
    assert target_parts("fairlane:cpu-2core@forecast_wait_fraction=0@slice_ms=100") == (
        "fairlane", "cpu-2core", {"forecast_wait_fraction": 0, "slice_ms": 100})
    with pytest.raises(ValueError, match="SETTING=VALUE"):
        target_parts("fairlane@slice_ms")
    # A dotted setting is another section's: the server's own threads, giving way.
    assert target_config("fairlane:cpu-2core@llm.threads=0@llm.give_way=true@slice_ms=100") == (
        "fairlane",
        {"server": {"profile": "cpu-2core"}, "llm": {"threads": 0, "give_way": True},
         "policy": {"slice_ms": 100}},
        None,
    )


def test_a_bench_server_on_all_the_cores_it_owns_runs_as_it_ships() -> None:
    """On every core owned the server sizes its own threads (and gives one up while a
    neighbour holds a core); fewer, as for two servers sharing the cores, are fixed."""
    owned = len(os.sched_getaffinity(0))
    assert server_config(8000, owned, 8)["llm"]["threads"] == 0
    if owned > 1:
        assert server_config(8000, owned - 1, 8)["llm"]["threads"] == owned - 1
    config = server_config(8000, owned, 8, {"llm": {"give_way": False}, "remotes": []})
    assert config["llm"] == {"threads": 0, "n_seq_max": 8, "n_ctx": 8192, "give_way": False}
    assert config["remotes"] == [] and config["server"]["port"] == 8000
