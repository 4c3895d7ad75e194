from __future__ import annotations

import pytest

from fairlane import profiles
from fairlane.policy import CostModel, Kind
from tests.policy.helpers import PROFILE


def test_prefill_budget_inverts_the_iteration_cost() -> None:
    cost = CostModel(PROFILE)
    tokens = cost.prefill_tokens_within(0.050, prefill_tokens=0, decode_seqs=2, context_tokens=0)
    assert tokens == 380  # (50 - 10 - 2) ms / 0.1 ms
    assert cost.llm_s(tokens, 2, 0) <= 0.050 < cost.llm_s(tokens + 1, 2, 0)


def test_measured_step_times_pull_predictions_to_this_machine() -> None:
    cost = CostModel(PROFILE)
    predicted = cost.llm_s(100, 4, 0)
    for _ in range(30):
        cost.observe(Kind.LLM, cost.llm_s(100, 4, 0), 2 * predicted)  # the device is 2× slower
    assert cost.llm_s(100, 4, 0) == pytest.approx(2 * predicted, rel=0.01)
    assert cost.correction[Kind.EMBED] == 1.0  # each engine learns separately


@pytest.mark.parametrize("name", profiles.available())
def test_shipped_profiles_load(name: str) -> None:
    profile, device = profiles.load(name)
    assert device in ("cpu", "gpu") and profile.llm.prefill_token_ms > 0
