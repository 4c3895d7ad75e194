"""Build policies and requests, and play the device: schedule → fake results → apply."""

from __future__ import annotations

from dataclasses import replace

from fairlane.policy import (
    CostModel,
    CostProfile,
    EmbedCost,
    IdlePlan,
    Kind,
    LlmCost,
    LlmPlan,
    Plan,
    Policy,
    PolicyConfig,
    Priority,
    Request,
    SeqOutput,
    StepResult,
    SttCost,
    make_policy,
)

# A round-number device: 10 ms per iteration, 0.1 ms per prefill token, 1 ms per decoding
# sequence; so a 400-token chunk costs 50 ms.
PROFILE = CostProfile(
    name="test",
    llm=LlmCost(base_ms=10.0, prefill_token_ms=0.1, decode_seq_ms=1.0),
    embed=EmbedCost(base_ms=2.0, token_ms=0.01),
    stt=SttCost(base_ms=5.0, utterance_ms=20.0),
)

VOICE, CHAT, BACKGROUND = Priority.VOICE, Priority.CHAT, Priority.BACKGROUND


def make(name: str = "fairlane", **overrides: object) -> Policy:
    config = replace(PolicyConfig(), **overrides)  # type: ignore[arg-type]
    return make_policy(name, config, CostModel(PROFILE))


def llm(rid: str, priority: Priority = CHAT, client: str = "a", arrival: float = 0.0,
        prompt: int = 100, max_tokens: int = 20, deadline_s: float | None = None) -> Request:
    return Request(rid, Kind.LLM, priority, client, arrival, prompt_tokens=prompt,
                   max_tokens=max_tokens, deadline_s=deadline_s)


def embed(rid: str, tokens: int = 64, client: str = "docs", arrival: float = 0.0,
          priority: Priority = BACKGROUND) -> Request:
    return Request(rid, Kind.EMBED, priority, client, arrival, prompt_tokens=tokens)


def stt(rid: str, priority: Priority = VOICE, client: str = "a", arrival: float = 0.0,
        audio_s: float = 2.0) -> Request:
    return Request(rid, Kind.STT, priority, client, arrival, audio_s=audio_s)


def outputs_for(plan: Plan, eos: set[str] | frozenset[str] = frozenset()) -> tuple[SeqOutput, ...]:
    """A fake engine: one token per sampling chunk; `eos` names the sequences that stop now."""
    if isinstance(plan, IdlePlan):
        return ()
    if isinstance(plan, LlmPlan):
        return tuple(
            SeqOutput(c.request_id, new_tokens=1, finished=c.request_id in eos)
            for c in plan.chunks if c.samples
        )
    return tuple(SeqOutput(rid, finished=True) for rid in plan.request_ids)


def step(policy: Policy, now: float, eos: set[str] | frozenset[str] = frozenset()
         ) -> tuple[Plan, list[Request], float]:
    """One step: schedule, 'run' it for its predicted time, apply. Returns plan, finished, end."""
    plan = policy.schedule(now)
    if isinstance(plan, IdlePlan):
        return plan, [], now
    end = now + plan.predicted_s
    finished = policy.update_from_output(plan, StepResult(plan.predicted_s, outputs_for(plan, eos)),
                                         end)
    return plan, finished, end


def ids(plan: Plan) -> list[str]:
    if isinstance(plan, IdlePlan):
        return []
    if isinstance(plan, LlmPlan):
        return [c.request_id for c in plan.chunks]
    return list(plan.request_ids)


def chunk_of(plan: Plan, rid: str):  # type: ignore[no-untyped-def]
    assert isinstance(plan, LlmPlan)
    return next(c for c in plan.chunks if c.request_id == rid)


def drain(policy: Policy, now: float = 0.0, limit: int = 10_000) -> tuple[list[Request], float]:
    """Run steps until the policy has no work; returns everything that finished."""
    finished: list[Request] = []
    for _ in range(limit):
        if not policy.has_work():
            return finished, now
        plan, done, now = step(policy, now)
        finished += done
        if isinstance(plan, IdlePlan):
            now = plan.wake_at if plan.wake_at is not None else now + 0.001
    raise AssertionError("policy did not drain")


__all__ = ["BACKGROUND", "CHAT", "VOICE", "Kind"]


def tts(rid: str, priority: Priority = VOICE, client: str = "a", arrival: float = 0.0,
        phonemes: int = 80) -> Request:
    return Request(rid, Kind.TTS, priority, client, arrival, prompt_tokens=phonemes)
