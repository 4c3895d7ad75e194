"""The scheduling policy: pure Python over request state, with the clock passed in.

It never touches a model, a thread or a socket, so the same code drives the real engines, the
simulator and the tests.
"""

from fairlane.policy.base import Policy
from fairlane.policy.config import PolicyConfig, Slo
from fairlane.policy.cost import CostModel, CostProfile, EmbedCost, LlmCost, SttCost, TtsCost
from fairlane.policy.fcfs import FcfsScheduler, SeparateServers, SingleEngineFcfs
from fairlane.policy.plan import (
    Admission,
    Chunk,
    EmbedPlan,
    IdlePlan,
    LlmPlan,
    Plan,
    SeqOutput,
    StepPlan,
    StepResult,
    SttPlan,
    TtsPlan,
)
from fairlane.policy.request import NO_WAIT_LIMIT, Kind, Priority, Request, Status
from fairlane.policy.scheduler import FairlaneScheduler

# Fairlane's policy and the baselines it is measured against (see policy/fcfs.py).
POLICIES: dict[str, type[Policy]] = {
    "fairlane": FairlaneScheduler,
    "separate": SeparateServers,
    "vllm": SingleEngineFcfs,
    "fcfs": FcfsScheduler,
}


def make_policy(name: str, config: PolicyConfig, cost: CostModel) -> Policy:
    """The policy called `name` (one of POLICIES)."""
    try:
        return POLICIES[name](config, cost)
    except KeyError as err:
        raise ValueError(f"unknown policy {name!r}; expected one of {', '.join(POLICIES)}") from err


__all__ = [
    "NO_WAIT_LIMIT",
    "POLICIES",
    "Admission",
    "Chunk",
    "CostModel",
    "CostProfile",
    "EmbedCost",
    "EmbedPlan",
    "FairlaneScheduler",
    "FcfsScheduler",
    "IdlePlan",
    "Kind",
    "LlmCost",
    "LlmPlan",
    "Plan",
    "Policy",
    "PolicyConfig",
    "Priority",
    "Request",
    "SeparateServers",
    "SeqOutput",
    "SingleEngineFcfs",
    "Slo",
    "Status",
    "StepPlan",
    "StepResult",
    "SttCost",
    "SttPlan",
    "TtsCost",
    "TtsPlan",
    "make_policy",
]
