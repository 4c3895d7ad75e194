"""Invariants of both policies on random request mixes (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fairlane.policy import IdlePlan, Kind, LlmPlan, Priority, Request, StepResult
from tests.policy.helpers import make, outputs_for

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
@given(specs=request_specs, policy_name=st.sampled_from(["fairlane", "fcfs"]),
       kv_blocks=st.integers(min_value=100, max_value=400))
def test_budgets_hold_and_every_admitted_request_finishes_once(specs, policy_name, kv_blocks):
    policy = make(policy_name, kv_blocks=kv_blocks, block_size=16, max_num_seqs=8,
                  max_batch_tokens=512)
    arrivals = sorted(
        (
            (Request(f"r{i}", kind, priority, client, round(at, 3), prompt_tokens=prompt,
                     max_tokens=max_tokens, audio_s=1.0), eos)
            for i, (kind, priority, client, at, prompt, max_tokens, eos) in enumerate(specs)
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
