"""The simulated engine, household workloads and their reports."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from fairlane.config import Config
from fairlane.policy import CostModel, Kind, PolicyConfig, Priority, make_policy
from fairlane.profiles import load as load_profile
from fairlane.sim.simulator import Heard, SimResult, Simulator
from fairlane.sim.workload import Job, Loop, Workload, households
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
    homes: int = 1,
) -> Scenario:
    """A workload on a profile, with the workload's SLOs scaled for the profile (CPU: ×8);
    `homes` households living it at once on the one device."""
    # The budgets `fairlane serve` gives the policy with its default engine: a simulated table
    # is a claim about the server that ships (its summaries cut as the server cuts them).
    base = config or Config().serving_policy("gpu")
    capacity = base.capacity_tokens(Priority.BACKGROUND)
    workload = (
        load_workload(workload_path, capacity)
        if homes == 1
        else households(workload_path, homes, capacity)
    )
    if duration_s is not None:
        workload = workload.cut(duration_s)
    _, device = load_profile(profile)
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
    max_time: float | None = None,
    history: Sequence[Heard] = (),
) -> SimResult:
    """Run one policy on a scenario: the real policy, planning with the scenario's profile.

    The simulated device runs at the profile's costs, or at `truth`'s (another profile): then
    the policy must learn the device it really has from the step times it measures. Its
    host's clients take the profile's round trip between an answer and their next request.
    `history`: arrivals before the run (time, engine, class) its forecasts begin from.
    """
    profile, _ = load_profile(scn.profile)
    device, _ = load_profile(truth) if truth else (profile, None)
    engine = make_policy(policy, scn.config, CostModel(profile))
    return Simulator(
        engine,
        CostModel(device),
        scn.workload,
        noise=noise,
        seed=seed,
        round_trip_s=device.host.round_trip_ms / 1000.0,
        history=history,
    ).run(max_time)


def split(
    workload: Workload,
    remote: frozenset[Priority],
    kinds: frozenset[Kind] = frozenset({Kind.LLM}),
) -> tuple[Workload, Workload]:
    """The work a remote lane takes (jobs of the `remote` classes and `kinds`, as `remotes:`
    binds them) and the rest, as two workloads. A chain of jobs (a voice turn's speech, reply
    and synthesis; a summary's pieces and their reduction) must stay on one side."""

    def is_remote(job: Job) -> bool:
        side = job.kind in kinds and job.priority in remote
        chain = job.then
        while chain is not None:
            if (chain.kind in kinds and chain.priority in remote) != side:
                raise ValueError(f"a {job.group} chain would cross to the remote and back")
            chain = chain.then
        return side

    def loop_side(loop: Loop) -> bool:
        sides = {is_remote(job) for unit in loop.units for job in unit}
        if len(sides) > 1:
            raise ValueError(f"the {loop.name} loop has work on both sides")
        return sides == {True}

    parts = []
    for side in (False, True):
        parts.append(replace(
            workload,
            jobs=tuple(j for j in workload.jobs if is_remote(j) == side),
            loops=tuple(loop for loop in workload.loops if loop_side(loop) == side),
        ))
    return parts[0], parts[1]


def simulate_with_remote(
    scn: Scenario,
    policy: str,
    remote_profile: str,
    remote_classes: frozenset[Priority] = frozenset({Priority.BACKGROUND}),
    noise: float = 0.05,
    seed: int = 0,
    kinds: frozenset[Kind] = frozenset({Kind.LLM}),
) -> tuple[SimResult, SimResult]:
    """Rule 10 as a what-if: the remote classes' work of `kinds` on a second device (a remote engine
    with `remote_profile`'s costs, scheduled by its own copy of the policy), the rest on the
    scenario's device. Returns the two devices' results: the local one's records are what
    the household feels, the remote's are the background work it took."""
    local_work, remote_work = split(scn.workload, remote_classes, kinds)
    local = simulate(replace(scn, workload=local_work), policy, noise=noise, seed=seed)
    profile, _ = load_profile(remote_profile)
    engine = make_policy(policy, scn.config, CostModel(profile))
    far = Simulator(
        engine,
        CostModel(profile),
        remote_work,
        noise=noise,
        seed=seed + 1,
        round_trip_s=profile.host.round_trip_ms / 1000.0,
    ).run()
    return local, far


def merged(local: SimResult, remote: SimResult, name: str) -> SimResult:
    """One report over both devices: every request, and the local device's steps (the device
    the household's interactive work shares)."""
    return SimResult(
        name,
        sorted([*local.records, *remote.records], key=lambda r: r.arrival),
        local.steps,
        max(local.end_time, remote.end_time),
        local.drained and remote.drained,
        local.first_audio,
    )


__all__ = [
    "Scenario",
    "SimResult",
    "Simulator",
    "default_workload",
    "merged",
    "scenario",
    "simulate",
    "simulate_with_remote",
    "split",
]


@dataclass(frozen=True)
class HomesTried:
    homes: int
    worst_attainment: float  # the lowest SLO attainment of any interactive row
    worst_row: str
    background_done: float  # the fraction of background requests finished


def homes_served(
    workload_path: str | Path,
    profile: str,
    config: PolicyConfig,
    policy: str = "fairlane",
    attainment: float = 0.99,
    most: int = 256,
    duration_s: float | None = None,
    noise: float = 0.05,
    seed: int = 0,
) -> tuple[int, list[HomesTried]]:
    """The most households one device serves with every interactive row (voice, chat,
    automations) within its SLO for at least `attainment` of its requests.

    Doubles the number of homes until a row misses, then bisects between the last that met
    and the first that missed (attainment falls as homes are added, up to the simulation's
    noise). Returns the answer (0: not even one) and every count tried, in the order tried."""
    from fairlane.sim.report import summarize

    tried: dict[int, HomesTried] = {}

    def trial(homes: int) -> bool:
        scn = scenario(workload_path, profile, config, duration_s, homes=homes)
        report = summarize(simulate(scn, policy, noise=noise, seed=seed), scn.workload.slo)
        rows = [
            (row["slo_met"], name)
            for name, row in report["classes"].items()
            if Priority.parse(name.split("/")[0]) is not Priority.BACKGROUND
            and row["slo_met"] is not None
        ]
        worst, name = min(rows, default=(1.0, "none"))
        tried[homes] = HomesTried(homes, worst, name, report["background"]["done_fraction"])
        return worst >= attainment

    if not trial(1):
        return 0, list(tried.values())
    met, missed = 1, None
    while missed is None and met < most:
        if trial(min(2 * met, most)):
            met = min(2 * met, most)
        else:
            missed = min(2 * met, most)
    while missed is not None and missed - met > 1:
        middle = (met + missed) // 2
        if trial(middle):
            met = middle
        else:
            missed = middle
    return met, list(tried.values())
