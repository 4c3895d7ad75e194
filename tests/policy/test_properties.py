"""Invariants of both policies on random request mixes (hypothesis)."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from fairlane import config
from fairlane.policy import (
    POLICIES,
    CostModel,
    IdlePlan,
    Kind,
    LlmPlan,
    Priority,
    Request,
    StepResult,
)
from fairlane.policy import make_policy as make_named_policy
from tests.policy.helpers import PROFILE, make, outputs_for

request_specs = st.lists(
    st.tuples(
        st.sampled_from(list(Kind)),
        st.sampled_from(list(Priority)),
        st.sampled_from(["a", "b", "c"]),
        st.floats(min_value=0.0, max_value=2.0),  # arrival
        st.integers(min_value=1, max_value=1500),  # prompt tokens / text tokens
        st.integers(min_value=1, max_value=40),  # max tokens
        st.integers(min_value=1, max_value=40),  # where the model stops (EOS)
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(specs=request_specs, policy_name=st.sampled_from(list(POLICIES)),
       kv_blocks=st.integers(min_value=100, max_value=400))
# Review R13: a background prompt above 90% of the cache (it is refused now, for good).
@example(specs=[(Kind.LLM, Priority.BACKGROUND, "a", 0.0, 1450, 10, 5)], policy_name="fairlane",
         kv_blocks=100)
def test_budgets_hold_and_every_admitted_request_finishes_once(specs, policy_name, kv_blocks):
    policy = make(policy_name, kv_blocks=kv_blocks, block_size=16, max_num_seqs=8,
                  max_batch_tokens=512)
    run_invariants(policy, specs, policy_name)


# The server's own budgets: small contexts whose capacity is not a whole number of blocks, a
# prefix cache, 1-8 sequence slots, prompts up to the whole context, and cached prefixes.
server_specs = st.lists(
    st.tuples(
        st.sampled_from(list(Kind)),
        st.sampled_from(list(Priority)),
        st.sampled_from(["a", "b", "c", "d"]),
        st.floats(min_value=0.0, max_value=3.0),
        st.integers(min_value=1, max_value=1000),
        st.integers(min_value=1, max_value=400),
        st.integers(min_value=1, max_value=400),
        st.integers(min_value=0, max_value=300),  # prompt tokens the prefix cache holds
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=80, deadline=None)
@given(specs=server_specs, policy_name=st.sampled_from(list(POLICIES)),
       n_ctx=st.integers(min_value=400, max_value=1100), n_seq_max=st.integers(1, 8),
       prefix_cache=st.sampled_from([0, 100, 250]))
# Review R5: one background prompt that cannot pass the watermark, voice and chat behind it.
@example(specs=[(Kind.LLM, Priority.BACKGROUND, "a", 0.0, 600, 50, 50, 0),
                (Kind.STT, Priority.VOICE, "b", 1.0, 1, 1, 1, 0),
                (Kind.LLM, Priority.CHAT, "c", 1.0, 50, 5, 5, 0)],
         policy_name="fairlane", n_ctx=1000, n_seq_max=8, prefix_cache=250)
# Review R6: every slot held by background, then voice.
@example(specs=[(Kind.LLM, Priority.BACKGROUND, "a", 0.0, 40, 300, 300, 0)] * 2
         + [(Kind.LLM, Priority.VOICE, "b", 0.5, 100, 5, 5, 0)],
         policy_name="fairlane", n_ctx=1000, n_seq_max=2, prefix_cache=0)
# Review R1: an unaligned capacity (1000 - 250 = 750 positions, 46 whole blocks).
@example(specs=[(Kind.LLM, Priority.VOICE, "a", 0.0, 700, 400, 400, 0)],
         policy_name="fcfs", n_ctx=1000, n_seq_max=8, prefix_cache=250)
def test_on_the_servers_budgets_nothing_stalls(specs, policy_name, n_ctx, n_seq_max,
                                               prefix_cache):
    cfg = config.parse({"llm": {"n_ctx": n_ctx, "n_seq_max": n_seq_max,
                                "prefix_cache_tokens": prefix_cache}})
    policy = make_named_policy(policy_name, cfg.serving_policy("gpu"), CostModel(PROFILE))
    clamped = []
    for kind, priority, client, at, prompt, max_tokens, eos, cached in specs:
        # The API's clamp: the reply fits what the class may hold, or the prompt is refused.
        capacity = policy.capacity_tokens(priority)
        clamped.append((kind, priority, client, at, prompt,
                        max(1, min(max_tokens, capacity - prompt)), eos, min(cached, prompt - 1)))
    run_invariants(policy, clamped, policy_name)


def run_invariants(policy, specs, policy_name):  # type: ignore[no-untyped-def]
    """Drive a policy over `specs`; assert the budgets, that it never idles with work it could
    run, and that every admitted request finishes exactly once."""
    arrivals = sorted(
        (
            (_request(i, *spec), spec[6]) for i, spec in enumerate(specs)
        ),
        key=lambda pair: pair[0].arrival,
    )
    stop_at = {r.id: eos for r, eos in arrivals}
    admitted: set[str] = set()
    finished: list[str] = []
    now = 0.0
    pending = list(arrivals)
    for _ in range(20_000):
        while pending and pending[0][0].arrival <= now:
            request, _ = pending.pop(0)
            if policy.add(request, now).accepted:
                admitted.add(request.id)
        if not pending and not policy.has_work():
            break
        plan = policy.schedule(now)
        if isinstance(plan, IdlePlan):
            assert plan.reason == "batch window" or not policy.has_work(), \
                f"the policy idles with work ({plan.reason})"
            upcoming = [t for t in (pending[0][0].arrival if pending else None, plan.wake_at)
                        if t is not None]
            assert upcoming, "the policy idles with work and nothing to wait for"
            now = max(now, min(upcoming))
            continue
        step_ids = list(plan.request_ids)
        assert len(step_ids) == len(set(step_ids)), "a request twice in one step"
        if isinstance(plan, LlmPlan):
            assert len(plan.chunks) <= policy.config.max_num_seqs
            if policy_name == "fairlane":
                assert plan.num_tokens <= policy.config.max_batch_tokens
        assert policy.kv.used_blocks <= policy.kv.num_blocks
        assert len(policy.running) <= policy.config.max_num_seqs
        eos = {
            c.request_id for c in plan.chunks
            if c.samples and policy.requests[c.request_id].output_tokens + 1
            >= stop_at[c.request_id]
        } if isinstance(plan, LlmPlan) else set()
        now += plan.predicted_s
        done = policy.update_from_output(plan, StepResult(plan.predicted_s,
                                                          outputs_for(plan, eos)), now)
        finished += [r.id for r in done]
    assert not policy.has_work(), "the policy stopped with work left"
    assert sorted(finished) == sorted(admitted), "a request lost or finished twice"
    assert policy.kv.used_blocks == 0


def _request(i, kind, priority, client, at, prompt, max_tokens, eos, cached=0):  # type: ignore[no-untyped-def]
    request = Request(f"r{i}", kind, priority, client, round(at, 3), prompt_tokens=prompt,
                      max_tokens=max_tokens, audio_s=1.0)
    if kind is Kind.LLM and cached > 0:
        request.computed_tokens = request.cached_tokens = cached  # the engine's prefix cache
    return request
