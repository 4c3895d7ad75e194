"""Profiles fitted from measurements: the shipped H200 profile is what `fairlane profile fit`
makes of the data it names, and it predicts those measurements within the error its header
states (and within the goal: median ≤ 15%, p95 ≤ 40% of the measured step time)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from fairlane.policy import Chunk, CostModel, LlmPlan, Priority
from fairlane.profiles import load
from fairlane.profiles.fit import embed_errors, embed_points, fit_llm, llm_errors, llm_points
from fairlane.runtime.metrics import percentile

PROFILES = Path(__file__).parents[2] / "addon" / "fairlane" / "profiles"
DATA = PROFILES / "data" / "h200-2026-12-04"
SHIPPED = PROFILES / "h200.yaml"
CPU_RUNS = sorted((PROFILES / "data" / "cpu-2core-2026-12-04").glob("*.json"))


def test_the_h200_profile_is_the_fit_of_its_data() -> None:
    profile, device = load("h200")
    points = llm_points(json.loads((DATA / "engine-llama-3.1-8b.json").read_text()))
    # Its prefill sweep cannot tell a prompt token's attention over held cells (see its header).
    assert device == "gpu" and fit_llm(points, ("prefill_attention",)) == profile.llm
    with pytest.raises(ValueError, match="unknown LLM terms"):
        fit_llm(points, ("attention_over_everything",))


def test_the_h200_profile_predicts_its_measurements_within_its_stated_error() -> None:
    profile, _ = load("h200")
    stated = yaml.safe_load(SHIPPED.read_text())["fit_error"]
    points = llm_points(json.loads((DATA / "engine-llama-3.1-8b.json").read_text()))
    errors = llm_errors(profile.llm, points)
    assert max(errors) <= stated["llm"]["max"] + 1e-3
    assert percentile(errors, 50) <= stated["llm"]["median"] + 1e-3
    assert percentile(errors, 50) <= 0.15 and percentile(errors, 95) <= 0.40  # the goal
    measured = embed_points(json.loads((DATA / "embeddings.json").read_text()), "float16")
    assert max(embed_errors(profile.embed, measured)) <= stated["embed"]["max"] + 1e-3


def test_the_cpu_profile_is_the_fit_of_this_machines_sweeps_within_its_stated_error() -> None:
    profile, device = load("cpu-2core")
    stated = yaml.safe_load((PROFILES / "cpu-2core.yaml").read_text())["fit_error"]["llm"]
    points = [p for run in CPU_RUNS for p in llm_points(json.loads(run.read_text()))]
    # Every term but the switch term (a step after another engine's), which no sweep has.
    fitted = replace(fit_llm(points), switch_share=profile.llm.switch_share)
    assert device == "cpu" and len(CPU_RUNS) == 5 and fitted == profile.llm
    assert {p.what for p in points} == {"prefill", "decode", "context", "occupancy"}
    errors = llm_errors(profile.llm, points)
    assert max(errors) <= stated["max"] + 1e-3 and percentile(errors, 50) <= stated["median"] + 1e-3
    assert percentile(errors, 50) <= 0.15 and percentile(errors, 95) <= 0.40  # the goal
    # Cells held by other sequences cost a decode's attention and a prompt token's, each its
    # own fitted (not assumed) term.
    assert profile.llm.attention_ns > 0 and profile.llm.prefill_attention_ns > 0


def test_the_form_predicts_the_small_model_too() -> None:
    """The same terms, fitted to the 0.5B model's run, predict it as well (the form is not
    tuned to one model)."""
    points = llm_points(json.loads((DATA / "engine-qwen2.5-0.5b.json").read_text()))
    errors = llm_errors(fit_llm(points), points)
    assert percentile(errors, 50) <= 0.15 and percentile(errors, 95) <= 0.40


def test_a_decode_beside_held_cells_costs_more() -> None:
    """Unified KV: every token's attention is masked over every cell in use, so one voice
    decode slows while background sequences hold cells."""
    cost = CostModel(load("cpu-2core")[0])
    alone = cost.llm_s(0, 1, 100, 100)
    beside = cost.llm_s(0, 1, 100, 100 + 4 * 4000)
    assert beside > alone * 1.01
    plan = LlmPlan((), (), 0.0, 100, held_tokens=16_100)
    assert cost.plan_s(plan) == pytest.approx(cost.llm_s(0, 0, 100, 16_100))


def test_a_prompt_chunk_pays_its_own_attention_over_held_cells_not_a_decodes() -> None:
    """A decode reads every held cell for one query, a prompt chunk reads them once for many:
    the terms differ, and a chunk beside held cells is charged the prompt token's rate."""
    profile = load("cpu-2core")[0]
    cost = CostModel(profile)
    extra = cost.llm_s(256, 0, 256, 256 + 8000) - cost.llm_s(256, 0, 256, 256)
    assert extra == pytest.approx(profile.llm.prefill_attention_ns * 256 * 8000 / 1e9)
    assert profile.llm.prefill_attention_ns < profile.llm.attention_ns


def test_an_implausible_correction_is_reported_not_clamped() -> None:
    """A device 30× slower per sequence than its profile: the old fit ran the term to its 20×
    cap and said nothing; now the update is refused for the term and reported."""
    profile = load("h200")[0]
    cost = CostModel(profile)
    truth = CostModel(replace(profile, llm=replace(profile.llm, decode_seq_ms=30 * 0.9082)))
    chunks = tuple(Chunk(f"s{i}", 100, 1, True, True, Priority.CHAT) for i in range(8))
    plan = LlmPlan(chunks, (), 0.0, 808, held_tokens=808)
    for _ in range(200):
        cost.observe(plan, truth.plan_s(plan))
    errors = cost.form_errors["llm"]
    assert errors and all(entry["refused"] > 0 for entry in errors.values())
    assert max(cost.fits[plan.kind].weights) <= 5.0
    assert any(entry["proposed"] > 5.0 for entry in errors.values())


@pytest.mark.parametrize("name", ["cpu-2core", "h200"])
@pytest.mark.parametrize("held", [0, 4000])
@pytest.mark.parametrize("position", [0, 3000])
def test_the_prefill_room_fills_the_budget_exactly_with_attention(
    name: str, held: int, position: int
) -> None:
    """The largest chunk that fits: new tokens attend to every held cell and to each other,
    and a chunk deep in its prompt pays for its position (a chunk at 3,000 tokens was once
    sized as if it started the prompt, and its step overran the budget)."""
    cost = CostModel(load(name)[0])
    budget = 0.5 if name == "cpu-2core" else 0.05
    n = cost.prefill_tokens_within(budget, 0, 2, 300, held, position)
    assert n > 0
    context = 300 + position
    assert cost.llm_s(n, 2, context + n, held + n) <= budget
    assert cost.llm_s(n + 1, 2, context + n + 1, held + n + 1) > budget
