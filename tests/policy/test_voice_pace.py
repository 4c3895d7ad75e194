"""A spoken reply is heard at the pace it is written: rules for voice decodes and for the
moments between the requests of one spoken turn."""

from __future__ import annotations

from dataclasses import replace

from fairlane.policy import CostModel, EmbedPlan, LlmPlan, PolicyConfig, SttPlan, make_policy
from tests.policy.helpers import BACKGROUND, CHAT, PROFILE, VOICE, embed, llm, make, step, stt


def _decoding(policy, rid, priority, now=0.0):  # type: ignore[no-untyped-def]
    policy.add(llm(rid, priority, prompt=50, max_tokens=40), now)
    plan, _, now = step(policy, now)  # its prompt, and its first token
    assert isinstance(plan, LlmPlan) and rid in plan.request_ids
    return now


def test_no_background_step_fills_the_gaps_between_a_voice_replys_tokens() -> None:
    policy = make()
    now = _decoding(policy, "voice", VOICE)
    for i in range(20):
        policy.add(embed(f"doc{i}", tokens=32), now)
    kinds = []
    for _ in range(10):
        plan, _, now = step(policy, now)
        kinds.append(type(plan).__name__)
    assert kinds == ["LlmPlan"] * 10  # token after token, nothing in between


def test_a_chat_replys_slack_still_carries_embeddings() -> None:
    policy = make()
    now = _decoding(policy, "chat", CHAT)
    for i in range(20):
        policy.add(embed(f"doc{i}", tokens=32), now)
    plans = []
    for _ in range(10):
        plan, _, now = step(policy, now)
        plans.append(plan)
    assert any(isinstance(p, EmbedPlan) for p in plans)


def test_background_rides_along_a_voice_iteration_only_within_the_voice_pace() -> None:
    policy = make()
    now = 0.0
    for i in range(6):
        policy.add(llm(f"bg{i}", BACKGROUND, prompt=20, max_tokens=200), now)
    for _ in range(8):  # the background sequences start decoding
        _, _, now = step(policy, now)
    now = _decoding(policy, "voice", VOICE, now)
    alone = policy.cost.llm_s(0, 1, policy.requests["voice"].computed_tokens)
    for _ in range(5):
        plan, _, now = step(policy, now)
        assert isinstance(plan, LlmPlan) and "voice" in plan.request_ids
        assert plan.predicted_s <= policy.config.voice_pace * alone + 1e-9


def test_background_steps_stay_short_between_the_requests_of_a_spoken_turn() -> None:
    """The transcript is done; the agent's model call follows within moments: a background
    step that starts in between must not hold it up for longer than a slice."""
    policy = make()
    policy.add(llm("summary", BACKGROUND, prompt=4000, max_tokens=10), 0.0)
    policy.add(stt("command", VOICE), 0.0)
    plan, _, now = step(policy, 0.0)
    assert isinstance(plan, SttPlan)
    plan, _, now = step(policy, now + 0.05)  # the agent's request has not arrived yet
    assert isinstance(plan, LlmPlan) and plan.request_ids == ("summary",)
    assert plan.predicted_s <= policy.config.slice_s + 1e-9
    later = now + policy.config.turn_gap_s + 1.0  # nobody followed up: long steps again
    plan, _, _ = step(policy, later)
    assert plan.predicted_s > policy.config.slice_s


def test_a_chat_prompt_beside_a_spoken_reply_is_not_chopped_below_its_fixed_cost() -> None:
    """A device whose prompt chunk has a fixed cost above a paced voice decode (the H200's
    fitted profile: ~10 ms against ~6 ms): the chat prompt's chunk is large enough that its
    tokens cost at least that fixed cost (before: 16 tokens a step, most of it fixed cost), and
    the spoken reply's next token still comes within its ITL target."""
    profile = replace(PROFILE, llm=replace(PROFILE.llm, prefill_base_ms=20.0))
    policy = make_policy("fairlane", PolicyConfig(), CostModel(profile))
    now = _decoding(policy, "voice", VOICE)
    policy.add(llm("chat", CHAT, prompt=3000, max_tokens=5), now)
    plan, _, now = step(policy, now)
    assert isinstance(plan, LlmPlan) and "voice" in plan.request_ids
    [chat] = [c for c in plan.chunks if c.request_id == "chat"]
    assert chat.num_tokens * profile.llm.prefill_token_ms >= profile.llm.prefill_base_ms - 1e-9
    budget = policy.config.itl_budget_s(VOICE)
    assert budget is not None and plan.predicted_s <= budget
    # Once the chunk's fixed cost is paid, nothing more is widened: the next step is paced again
    # unless it carries a chunk of its own.
    paced = policy.config.voice_pace * policy.cost.llm_s(
        0, 1, policy.requests["voice"].computed_tokens
    )
    plan, _, now = step(policy, now)
    assert isinstance(plan, LlmPlan)
    if not any(c.request_id == "chat" and not c.decode for c in plan.chunks):
        assert plan.predicted_s <= paced + 1e-9
