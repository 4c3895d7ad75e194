"""The simulator's device takes exactly the time the server's policy predicts for a plan when
both use one profile: every term the policy plans with (KV cells held included) is the term the
simulated device charges, so the simulator reproduces what the server's scheduler expects."""

from __future__ import annotations

import pytest

from fairlane.policy import CostModel, LlmPlan, make_policy
from fairlane.profiles import load as load_profile
from fairlane.sim import default_workload, scenario
from fairlane.sim.simulator import Simulator


@pytest.mark.parametrize("profile_name", ["cpu-2core", "h200"])
def test_each_simulated_step_takes_what_its_plan_predicted(profile_name: str) -> None:
    scn = scenario(default_workload(), profile_name, duration_s=30)
    profile, _ = load_profile(profile_name)
    policy = make_policy("fairlane", scn.config, CostModel(profile))
    simulator = Simulator(policy, CostModel(profile), scn.workload)
    seen: list[tuple[float, float]] = []
    charge = simulator._duration

    def recorded(plan):  # type: ignore[no-untyped-def]
        seconds = charge(plan)
        seen.append((plan.predicted_s, seconds))
        if isinstance(plan, LlmPlan):
            assert plan.held_tokens >= plan.num_tokens
        return seconds

    simulator._duration = recorded  # type: ignore[method-assign]
    simulator.run()
    assert len(seen) > 100
    for predicted, took in seen:
        assert took == pytest.approx(predicted, rel=1e-9)
