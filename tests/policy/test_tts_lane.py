"""The speech-synthesis lane: sentences are voice work, one bounded step each."""

from __future__ import annotations

import pytest

from fairlane.policy import LlmPlan, TtsPlan
from tests.policy.helpers import BACKGROUND, CHAT, VOICE, drain, embed, llm, make, step, tts


def test_a_voice_sentence_goes_before_the_voice_llm_and_all_background() -> None:
    policy = make()
    policy.add(llm("summary", BACKGROUND, prompt=2000), 0.0)
    policy.add(embed("doc"), 0.0)
    policy.add(llm("turn", VOICE, prompt=50), 0.0)
    policy.add(tts("sentence"), 0.0)
    plan, _, _ = step(policy, 0.0)
    assert isinstance(plan, TtsPlan) and plan.request_ids == ("sentence",)
    plan, _, _ = step(policy, 1.0)
    assert isinstance(plan, LlmPlan) and "turn" in plan.request_ids


def test_a_chat_sentence_waits_for_voice_llm_work_but_not_for_background() -> None:
    policy = make()
    policy.add(llm("summary", BACKGROUND, prompt=400), 0.0)
    policy.add(tts("chat-sentence", CHAT), 0.0)
    policy.add(llm("voice-turn", VOICE, prompt=50, max_tokens=1), 0.0)
    plan, _, now = step(policy, 0.0)
    assert isinstance(plan, LlmPlan) and plan.request_ids == ("voice-turn",)
    plan, _, _ = step(policy, now)
    assert isinstance(plan, TtsPlan) and plan.request_ids == ("chat-sentence",)


@pytest.mark.parametrize("batch", [1, 3])
def test_each_step_carries_at_most_tts_max_batch_sentences(batch) -> None:
    policy = make(tts_max_batch=batch)
    for i in range(6):
        policy.add(tts(f"s{i}", client=f"c{i % 2}", phonemes=60 + i), 0.0)
    plans = []
    now = 0.0
    while policy.has_work():
        plan, _, now = step(policy, now)
        plans.append(plan)
    assert all(isinstance(p, TtsPlan) and len(p.request_ids) <= batch for p in plans)
    assert sum(len(p.request_ids) for p in plans) == 6


def test_fair_turns_between_two_speakers_sentences() -> None:
    """VTC: one person's long reply does not hold back another's first sentence."""
    policy = make()
    for i in range(5):
        policy.add(tts(f"long{i}", client="dad", phonemes=200), 0.0)
    policy.add(tts("short", client="kid", phonemes=40), 0.01)
    order: list[str] = []
    now = 0.0
    while policy.has_work():
        plan, _, now = step(policy, now)
        order += list(plan.request_ids)
    assert order.index("short") <= 1


@pytest.mark.parametrize("name", ["fcfs", "vllm", "separate"])
def test_baselines_serve_sentences_in_arrival_order(name) -> None:
    policy = make(name)
    policy.add(llm("summary", BACKGROUND, prompt=300), 0.0)
    policy.add(tts("sentence", VOICE), 0.1)
    finished, _ = drain(policy)
    assert {r.id for r in finished} == {"summary", "sentence"}
