"""The simulated engine, household workloads and their reports."""

from __future__ import annotations

from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from fairlane.config import Config
from fairlane.policy import CostModel, PolicyConfig, make_policy
from fairlane.profiles import load as load_profile
from fairlane.sim.simulator import SimResult, Simulator
from fairlane.sim.workload import Workload
from fairlane.sim.workload import load as load_workload


def default_workload() -> Path:
    """The family evening that ships with Fairlane (a copy of the design's family.yaml)."""
    return Path(str(resources.files("fairlane").joinpath("workloads/family.yaml")))


@dataclass(frozen=True)
class Scenario:
    workload: Workload
    profile: str
    config: PolicyConfig


def scenario(
    workload_path: str | Path,
    profile: str,
    config: PolicyConfig | None = None,
    duration_s: float | None = None,
) -> Scenario:
    """A workload on a profile, with the workload's SLOs scaled for the profile (CPU: ×8)."""
    workload = load_workload(workload_path)
    if duration_s is not None:
        workload = workload.cut(duration_s)
    _, device = load_profile(profile)
    # The budgets `fairlane serve` gives the policy with its default engine: a simulated table
    # is a claim about the server that ships.
    base = config or Config().serving_policy("gpu")
    slos = dict(base.slo)
    slos.update(workload.slo)
    scaled = replace(base, slo=slos)
    if device == "cpu":
        scaled = scaled.scaled(workload.cpu_slo_scale)
    scaled_workload = replace(workload, slo=dict(scaled.slo))
    return Scenario(scaled_workload, profile, scaled)


def simulate(
    scn: Scenario,
    policy: str,
    noise: float = 0.05,
    seed: int = 0,
    truth: str | None = None,
) -> SimResult:
    """Run one policy on a scenario: the real policy, planning with the scenario's profile.

    The simulated device runs at the profile's costs, or at `truth`'s (another profile): then
    the policy must learn the device it really has from the step times it measures.
    """
    profile, _ = load_profile(scn.profile)
    device, _ = load_profile(truth) if truth else (profile, None)
    engine = make_policy(policy, scn.config, CostModel(profile))
    return Simulator(engine, CostModel(device), scn.workload, noise=noise, seed=seed).run()


__all__ = ["Scenario", "SimResult", "Simulator", "default_workload", "scenario", "simulate"]
