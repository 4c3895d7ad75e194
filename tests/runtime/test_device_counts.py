"""The device loop's count of LLM tokens computed per class: each position of a sequence once."""

from __future__ import annotations

from fairlane.policy import (
    Chunk,
    CostModel,
    Kind,
    LlmPlan,
    PolicyConfig,
    Priority,
    Request,
    make_policy,
)
from fairlane.profiles import load as load_profile
from fairlane.runtime.device import DeviceLoop


def _plan(*chunks: tuple[str, int, int, Priority]) -> LlmPlan:
    return LlmPlan(
        tuple(Chunk(rid, start, n, False, n == 1, p) for rid, start, n, p in chunks), (), 0.0, 0
    )


def test_a_recompute_a_cached_prefix_and_a_cancelled_sequence_count_nothing_twice() -> None:
    profile, _ = load_profile("cpu-2core")
    loop = DeviceLoop(make_policy("fairlane", PolicyConfig(), CostModel(profile)), {})
    for rid, priority in (("summary", Priority.BACKGROUND), ("chat", Priority.CHAT)):
        loop.submit(
            Request(rid, Kind.LLM, priority, "c", 0.0, prompt_tokens=900, max_tokens=8),
            lambda: None,
            lambda event: None,
        )
    background = Priority.BACKGROUND
    loop._count_tokens(_plan(("summary", 0, 300, background)))
    loop._count_tokens(_plan(("summary", 300, 300, background)))
    # Preempted: its KV dropped, it prefills from 0 again; only what is past 600 is new.
    loop._count_tokens(_plan(("summary", 0, 500, background)))
    loop._count_tokens(_plan(("summary", 500, 400, background)))
    # A chat prompt whose first 700 tokens the prefix cache held: its chunk starts there.
    loop._count_tokens(_plan(("chat", 700, 200, Priority.CHAT), ("summary", 900, 1, background)))
    assert loop.class_llm_tokens == {"voice": 0, "chat": 200, "background": 901}
    loop.cancel("chat")
    loop._count_tokens(_plan(("chat", 900, 1, Priority.CHAT)))  # ran while it was cancelled
    assert loop.class_llm_tokens["chat"] == 200 and "chat" not in loop._reached
