"""The baseline behaves like a default server: FIFO across engines, whole-prompt prefill."""

from __future__ import annotations

from fairlane.policy import EmbedPlan, LlmPlan, SttPlan
from tests.policy.helpers import (
    BACKGROUND,
    CHAT,
    VOICE,
    chunk_of,
    drain,
    embed,
    ids,
    llm,
    make,
    step,
    stt,
)


def _chat_first_token_after_a_long_background_prompt(name: str) -> float:
    policy = make(name)
    policy.add(llm("doc", BACKGROUND, client="docs", prompt=8000), 0.0)
    plan, _, now = step(policy, 0.0)
    if name == "fcfs":
        assert chunk_of(plan, "doc").num_tokens == 8000  # no chunking
    policy.add(llm("chat", CHAT, prompt=100), 0.001)  # arrives while that step runs
    while True:
        plan, _, now = step(policy, now)
        if "chat" in ids(plan):
            return now


def test_fcfs_prefills_whole_prompts_so_a_chat_turn_waits_for_them() -> None:
    # 8000 prompt tokens cost ~0.8 s on the test device; fairlane slices them, with nobody
    # talking, to arrival_wait_s (a quarter of the 500 ms voice target) at a time.
    assert _chat_first_token_after_a_long_background_prompt("fcfs") > 0.8
    assert _chat_first_token_after_a_long_background_prompt("fairlane") < 0.125 + 0.03


def _plans_for_a_command_behind_a_backlog(name: str, backlog: int) -> list:
    """Every plan, in order, when a spoken command arrives just after `backlog` texts to embed."""
    policy = make(name)
    for i in range(backlog):
        policy.add(embed(f"e{i}"), 0.0)
    policy.add(stt("u", VOICE), 0.01)
    plans = []
    now = 0.01
    while policy.has_work():
        plan, _, now = step(policy, now)
        plans.append(plan)
    return plans


def test_fcfs_serves_the_oldest_work_first_whatever_its_class() -> None:
    plans = _plans_for_a_command_behind_a_backlog("fcfs", 200)
    assert isinstance(plans[-1], SttPlan)  # the voice command waited for the whole backlog
    assert all(isinstance(p, EmbedPlan) for p in plans[:-1])


def test_fcfs_batches_llm_sequences_in_arrival_order() -> None:
    policy = make("fcfs")
    policy.add(llm("a", prompt=100, max_tokens=3), 0.0)
    policy.add(llm("b", VOICE, prompt=100, max_tokens=3), 0.1)
    plan, _, _ = step(policy, 0.2)
    assert isinstance(plan, LlmPlan) and ids(plan) == ["a", "b"]
    finished, _ = drain(policy, 0.3)
    assert {r.id for r in finished} == {"a", "b"}


# --- the baselines households run: separate servers, and one vLLM-like engine -----------------


def test_separate_servers_take_the_device_in_turn() -> None:
    # A backlog on the embedding server does not hold the speech server's request behind it
    # (they are separate processes), but nor does anything put speech first: one step each.
    policy = make("separate")
    for i in range(200):
        policy.add(embed(f"e{i}"), 0.0)
    policy.add(llm("doc", BACKGROUND, client="docs", prompt=6000), 0.0)
    policy.add(stt("u", VOICE), 0.01)
    kinds = []
    now = 0.01
    for _ in range(4):
        plan, _, now = step(policy, now)
        kinds.append(type(plan).__name__)
    assert kinds == ["LlmPlan", "EmbedPlan", "SttPlan", "LlmPlan"]


def test_separate_servers_transcribe_one_request_at_a_time() -> None:
    policy = make("separate")
    for i in range(3):
        policy.add(stt(f"u{i}", VOICE), 0.0)
    plan, _, _ = step(policy, 0.0)
    assert isinstance(plan, SttPlan) and ids(plan) == ["u0"]


def test_llama_server_style_splits_a_prompt_at_n_batch_and_decodes_first() -> None:
    for name in ("separate", "vllm"):
        policy = make(name, max_batch_tokens=512)
        policy.add(llm("chat", CHAT, prompt=100, max_tokens=50), 0.0)
        plan, _, now = step(policy, 0.0)
        assert ids(plan) == ["chat"]
        policy.add(llm("doc", BACKGROUND, client="docs", prompt=2000), now)
        plan, _, now = step(policy, now)
        # The chat decodes, and the long prompt fills the rest of the batch, not more.
        assert ids(plan) == ["chat", "doc"]
        assert chunk_of(plan, "chat").decode
        assert chunk_of(plan, "doc").num_tokens == 511
        plan, _, now = step(policy, now)
        assert chunk_of(plan, "doc").num_tokens == 511


def test_one_vllm_like_engine_still_serves_the_oldest_work_first() -> None:
    plans = _plans_for_a_command_behind_a_backlog("vllm", 100)
    assert isinstance(plans[-1], SttPlan)
