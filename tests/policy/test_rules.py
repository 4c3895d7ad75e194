"""One test per priority rule of DESIGN.md §3: schedule → fake results → apply → assert the plan."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from fairlane.policy import (
    CostModel,
    EmbedPlan,
    IdlePlan,
    LlmPlan,
    PolicyConfig,
    Slo,
    Status,
    SttPlan,
    make_policy,
)
from fairlane.policy.fairness import FairQueue
from fairlane.profiles import load as load_profile
from tests.policy.helpers import (
    BACKGROUND,
    CHAT,
    PROFILE,
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

# --- Rule 1: interactive first, decided at every step boundary -------------------------------


def test_voice_arriving_during_background_prefill_is_in_the_very_next_plan() -> None:
    policy = make()
    policy.add(llm("doc", BACKGROUND, client="docs", prompt=20_000), 0.0)
    plan, _, now = step(policy, 0.0)
    assert ids(plan) == ["doc"] and chunk_of(plan, "doc").num_tokens < 20_000

    policy.add(llm("v", VOICE, prompt=300), now)
    plan, _, _ = step(policy, now)
    assert isinstance(plan, LlmPlan)
    assert chunk_of(plan, "v").num_tokens == 300
    # The iteration that carries the voice prompt carries no background prefill.
    assert "doc" not in ids(plan)


def test_speech_goes_before_a_running_embedding_backlog() -> None:
    policy = make()
    for i in range(500):
        policy.add(embed(f"e{i}"), 0.0)
    plan, _, now = step(policy, 0.0)
    assert isinstance(plan, EmbedPlan)
    policy.add(stt("u1"), now)
    plan, _, _ = step(policy, now)
    assert isinstance(plan, SttPlan) and plan.request_ids == ("u1",)


def test_voice_before_chat_and_speech_before_llm_within_a_class() -> None:
    policy = make(max_batch_tokens=256)
    policy.add(llm("c", CHAT, prompt=200), 0.0)
    policy.add(llm("v", VOICE, prompt=200), 0.0)
    policy.add(stt("u", VOICE), 0.0)
    first, _, now = step(policy, 0.0)
    assert isinstance(first, SttPlan)
    second, _, _ = step(policy, now)
    assert isinstance(second, LlmPlan)
    assert second.chunks[0].request_id == "v" and second.chunks[0].num_tokens == 200


# --- Rule 2: background steps stay under slice_ms --------------------------------------------


def test_background_steps_are_sized_to_the_slice_while_someone_talks() -> None:
    policy = make(slice_ms=50.0, background_max_wait_s=0.0, background_min_share=1.0)
    policy.add(llm("chat", CHAT, prompt=50, max_tokens=10_000), 0.0)
    for i in range(1000):
        policy.add(embed(f"e{i}", tokens=256), 0.0)
    policy.add(llm("doc", BACKGROUND, prompt=8000), 0.0)
    seen = set()
    now = 0.0
    for _ in range(40):
        plan, _, now = step(policy, now)
        assert not isinstance(plan, IdlePlan)
        assert plan.predicted_s <= 0.050 + 1e-9
        if BACKGROUND in {c.priority for c in getattr(plan, "chunks", ())} | {
                getattr(plan, "priority", None)}:
            seen.add(type(plan))
    assert seen == {EmbedPlan, LlmPlan}  # the two background lanes take turns


def test_with_nobody_talking_background_steps_grow_to_the_arrival_wait() -> None:
    """Rule 2 when idle (review item 14): a lone summary runs in steps as large as an arrival
    can wait for (a quarter of the tightest interactive target: 125 ms here), not 50 ms slivers,
    and the
    moment an interactive request exists the slice applies again."""
    policy = make(slice_ms=50.0)
    assert policy.config.arrival_wait_s == pytest.approx(0.125)
    policy.add(llm("doc", BACKGROUND, prompt=8000, max_tokens=4), 0.0)
    plan, _, now = step(policy, 0.0)
    assert isinstance(plan, LlmPlan)
    assert 0.1 < plan.predicted_s <= 0.125 + 1e-9 and plan.budget_s == pytest.approx(0.125)
    assert chunk_of(plan, "doc").num_tokens > 2 * 380  # vs 380 tokens in a 50 ms slice
    policy.add(llm("chat", CHAT, prompt=100), now)
    plan, _, now = step(policy, now)
    assert "chat" in ids(plan)
    plan, _, now = step(policy, now)
    assert isinstance(plan, LlmPlan) and plan.predicted_s <= 0.050 + 1e-9
    assert plan.budget_s is not None and plan.budget_s <= 0.050


def test_while_a_conversation_goes_on_background_keeps_to_the_slice() -> None:
    """Between the turns of a chat nobody is waiting, but the next turn is coming: background
    steps stay at the slice until the pause is long next to the usual gap between turns."""
    policy = make(slice_ms=50.0)
    now = 0.0
    for i in range(3):  # a turn a second
        now = max(now, float(i))
        policy.add(llm(f"turn{i}", CHAT, prompt=20, max_tokens=1, arrival=now), now)
        while f"turn{i}" in policy.requests:
            _, _, now = step(policy, now)
    policy.add(llm("doc", BACKGROUND, prompt=8000, max_tokens=4), now)
    plan, _, _ = step(policy, 2.5)
    assert plan.predicted_s <= 0.050 + 1e-9
    plan, _, _ = step(policy, 10.0)  # eight seconds of quiet
    assert plan.predicted_s > 0.1


def test_between_turns_on_a_cpu_background_steps_grow_to_the_forecast_wait() -> None:
    """Rule 2 between turns on a CPU's targets (× 8): with the next chat turn only forecast,
    a background step may take `forecast_wait_s` (250 ms), not 8-token slivers of a 50 ms
    slice that its fixed cost alone nearly fills; mid-turn (`turn_gap_s`) and while a request
    runs, the slice holds; after a long quiet, the arrival wait (1 s)."""
    config = replace(PolicyConfig(), slice_ms=50.0).scaled(8)
    assert config.forecast_wait_s == pytest.approx(0.25)
    assert config.arrival_wait_s == pytest.approx(1.0)
    policy = make_policy("fairlane", config, CostModel(PROFILE))
    now = 0.0
    for i in range(3):  # a turn every 3 s
        now = max(now, 3.0 * i)
        policy.add(llm(f"turn{i}", CHAT, prompt=20, max_tokens=1, arrival=now), now)
        while f"turn{i}" in policy.requests:
            _, _, now = step(policy, now)
    policy.add(llm("doc", BACKGROUND, prompt=8000, max_tokens=4), now)
    mid_turn, _, _ = step(policy, now + 0.5)
    assert isinstance(mid_turn, LlmPlan) and mid_turn.budget_s == pytest.approx(0.05)
    between, _, _ = step(policy, now + 3.0)
    assert isinstance(between, LlmPlan) and between.budget_s == pytest.approx(0.25)
    assert 0.05 < between.predicted_s <= 0.25 + 1e-9
    quiet, _, _ = step(policy, now + 30.0)
    assert isinstance(quiet, LlmPlan) and quiet.budget_s == pytest.approx(1.0)


@pytest.mark.parametrize("least", [1, 8])
def test_a_background_prompt_beside_held_kv_keeps_to_the_slice_on_a_cpu(least: int) -> None:
    """Rule 2 where one prompt token costs most of the slice: on the fitted 2-core profile a
    summary 1,500 tokens in pays ~40 ms of fixed and position cost before its first token, so
    between the turns of a conversation its step is 1 token, within the 50 ms slice; the old
    floor of 8 tokens (`background_min_chunk=8`) ran ~2x the slice, and an arrival waited for
    it."""
    config = replace(PolicyConfig(), slice_ms=50.0, background_min_chunk=least).scaled(8)
    policy = make_policy("fairlane", config, CostModel(load_profile("cpu-2core")[0]))
    policy.add(llm("doc", BACKGROUND, client="docs", prompt=3000, max_tokens=4), 0.0)
    now = 0.0
    while policy.requests["doc"].computed_tokens < 1500:  # nobody talking: large steps
        _, _, now = step(policy, now)
    policy.add(llm("turn", CHAT, prompt=20, max_tokens=1, arrival=now), now)
    while "turn" in policy.requests:
        _, _, now = step(policy, now)
    plan, _, _ = step(policy, now + 0.5)  # mid-turn: the next request of the turn may come
    assert isinstance(plan, LlmPlan) and ids(plan) == ["doc"]
    assert plan.budget_s == pytest.approx(0.05)
    if least == 1:
        assert 1 <= chunk_of(plan, "doc").num_tokens < 8
        assert plan.predicted_s <= 0.05
    else:
        assert chunk_of(plan, "doc").num_tokens == 8
        assert plan.predicted_s > 1.5 * 0.05


def test_the_forecast_wait_is_the_slice_on_a_gpu_and_never_above_the_arrival_wait() -> None:
    assert PolicyConfig().forecast_wait_s == PolicyConfig().slice_s  # 31 ms < 50 ms
    off = replace(PolicyConfig(), forecast_wait_fraction=0.0).scaled(8)
    assert off.forecast_wait_s == off.slice_s  # the rule switched off
    wide = replace(PolicyConfig(), forecast_wait_fraction=1.0).scaled(8)
    assert wide.forecast_wait_s == wide.arrival_wait_s


# --- Rule 3: sequences join and leave between iterations -------------------------------------


def test_sequences_join_and_leave_between_iterations() -> None:
    policy = make()
    policy.add(llm("a", prompt=100, max_tokens=50), 0.0)
    _, _, now = step(policy, 0.0)  # a's prompt
    plan, _, now = step(policy, now)
    assert ids(plan) == ["a"] and chunk_of(plan, "a").decode

    policy.add(llm("b", prompt=100, max_tokens=50), now)
    plan, _, now = step(policy, now, eos={"a"})
    assert set(ids(plan)) == {"a", "b"}  # b joined a running batch
    assert chunk_of(plan, "a").decode and not chunk_of(plan, "b").decode

    plan, _, _ = step(policy, now)
    assert ids(plan) == ["b"]  # a left; its KV is free
    assert "a" not in policy.kv.held


# --- Rule 4: chunked prefill that keeps the ITL targets --------------------------------------


def test_interactive_chunk_keeps_the_itl_of_its_own_class() -> None:
    policy = make()
    policy.add(llm("a", CHAT, prompt=50, max_tokens=100), 0.0)
    _, _, now = step(policy, 0.0)
    policy.add(llm("b", CHAT, prompt=5000), now)
    plan, _, _ = step(policy, now)
    assert chunk_of(plan, "a").decode
    assert 0 < chunk_of(plan, "b").num_tokens < 5000
    assert plan.predicted_s <= policy.config.itl_budget_s(CHAT) + 1e-9


def test_voice_chunk_may_slow_chat_but_not_voice_decodes() -> None:
    policy = make()
    policy.add(llm("c", CHAT, prompt=50, max_tokens=100), 0.0)
    _, _, now = step(policy, 0.0)
    policy.add(llm("v", VOICE, prompt=1500), now)
    plan, _, now = step(policy, now)
    # Voice is more urgent than the chat stream: its chunk is bounded by how long an arrival
    # may wait (rule 2), not by the chat's ITL.
    assert chunk_of(plan, "v").num_tokens > 1000
    assert policy.config.itl_budget_s(CHAT) < plan.predicted_s <= policy.config.arrival_wait_s

    plan, _, now = step(policy, now)  # the rest of its prompt
    policy.add(llm("v2", VOICE, prompt=5000), now)
    plan, _, _ = step(policy, now)
    assert chunk_of(plan, "v").decode
    assert plan.predicted_s <= policy.config.itl_budget_s(VOICE) + 1e-9


def test_background_chunk_never_breaks_the_interactive_itl_target() -> None:
    tight = {VOICE: Slo(500, 80, 500), CHAT: Slo(1000, 20, 1000), BACKGROUND: Slo()}
    policy = make(slo=tight)  # chat ITL budget: 16 ms; a lone decode costs 11 ms
    policy.add(llm("a", CHAT, prompt=50, max_tokens=100), 0.0)
    _, _, now = step(policy, 0.0)
    policy.add(llm("doc", BACKGROUND, client="docs", prompt=5000), now)
    plan, _, now = step(policy, now)
    assert chunk_of(plan, "doc").num_tokens == 50  # (16 - 11) ms / 0.1 ms per token
    assert plan.predicted_s <= policy.config.itl_budget_s(CHAT) + 1e-9

    tighter = {**tight, CHAT: Slo(1000, 12, 1000)}  # budget 9.6 ms: not even the decode fits
    policy = make(slo=tighter)
    policy.add(llm("a", CHAT, prompt=50, max_tokens=100), 0.0)
    _, _, now = step(policy, 0.0)
    policy.add(llm("doc", BACKGROUND, client="docs", prompt=5000), now)
    plan, _, _ = step(policy, now)
    assert ids(plan) == ["a"]


# --- Rule 5: budgets in tokens and KV; background is preempted, never interactive ------------


def test_interactive_preempts_background_and_background_resumes_by_recompute() -> None:
    policy = make(kv_blocks=40, block_size=16)  # 640 tokens of KV
    policy.add(llm("doc", BACKGROUND, client="docs", prompt=500, max_tokens=30), 0.0)
    now = 0.0
    for _ in range(5):
        _, _, now = step(policy, now)
    doc = policy.requests["doc"]
    assert doc.output_tokens > 0

    policy.add(llm("v", VOICE, prompt=300), now)
    plan, _, now = step(policy, now)
    assert isinstance(plan, LlmPlan)
    assert plan.preempted == ("doc",) and "v" in ids(plan)
    assert doc.status is Status.WAITING and doc.computed_tokens == 0 and doc.preemptions == 1

    finished, _ = drain(policy, now)
    assert {r.id for r in finished} == {"v", "doc"}
    assert doc.output_tokens == 30  # what it generated before preemption was kept


def test_background_never_takes_kv_from_interactive() -> None:
    policy = make(kv_blocks=40, block_size=16)
    policy.add(llm("c", CHAT, prompt=500, max_tokens=40), 0.0)
    _, _, now = step(policy, 0.0)
    policy.add(llm("doc", BACKGROUND, client="docs", prompt=300), now)
    for _ in range(10):
        plan, _, now = step(policy, now)
        assert isinstance(plan, LlmPlan)
        assert ids(plan) == ["c"] and not plan.preempted
    finished, _ = drain(policy, now)
    assert [r.id for r in finished] == ["c", "doc"]


def test_max_num_seqs_bounds_the_running_batch() -> None:
    policy = make(max_num_seqs=3)
    for i in range(6):
        policy.add(llm(f"r{i}", prompt=20, max_tokens=5), 0.0)
    plan, _, _ = step(policy, 0.0)
    assert len(ids(plan)) == 3 and len(policy.running) == 3


# --- Rule 6: VTC token-aware fairness inside a class -----------------------------------------


def test_vtc_serves_the_least_served_client_first() -> None:
    policy = make(max_num_seqs=1)
    for rid, client, prompt in [("a1", "a", 1000), ("a2", "a", 1000), ("b1", "b", 10),
                                ("b2", "b", 10)]:
        policy.add(llm(rid, client=client, prompt=prompt, max_tokens=5), 0.0)
    finished, _ = drain(policy)
    # FCFS would run a1, a2, b1, b2; after a1, client b has the smaller counter twice.
    assert [r.id for r in finished] == ["a1", "b1", "b2", "a2"]


def test_a_client_returning_from_idle_starts_at_the_minimum_counter() -> None:
    queue = FairQueue()
    queue.push(llm("a1", client="a"))
    queue.push(llm("b1", client="b"))
    queue.charge("a", 5000)
    queue.charge("b", 3000)
    queue.push(llm("c1", client="c"))  # c was never served: no banked credit
    assert queue.counters["c"] == 3000
    # It is served before a (3000 < 5000) but ties with b instead of jumping ahead of both.
    order = [queue.pop().id for _ in range(3)]  # type: ignore[union-attr]
    assert order == ["b1", "c1", "a1"]



def test_one_members_long_prompts_do_not_hold_another_members_turn_behind_them() -> None:
    """Rule 6 inside a step: a member who keeps long prompts going (a teenager pasting texts)
    no longer makes a parent's short turn wait for the prefill of those already begun."""
    policy = make(max_batch_tokens=256)
    for i in range(4):
        policy.add(llm(f"t{i}", CHAT, client="teen", prompt=1500, max_tokens=20), 0.0)
    now = 0.0
    for _ in range(2):
        plan, _, now = step(policy, now)
        assert ids(plan) == ["t0"]  # the teen's first prompt, half-done
    policy.add(llm("p", CHAT, client="parent", prompt=100, max_tokens=5), now)
    plan, _, now = step(policy, now)
    # Before, the half-done prompt took the step (and four more) first.
    assert ids(plan)[0] == "p" and chunk_of(plan, "p").num_tokens == 100
    first: dict[str, float] = {}
    while policy.has_work():
        plan, _, now = step(policy, now)
        for chunk in plan.chunks if isinstance(plan, LlmPlan) else ():
            if chunk.decode:
                first.setdefault(chunk.request_id, now)
    assert first["p"] < first["t0"] < first["t1"]


def test_one_members_further_prompts_leave_the_watermark_for_another_members_turn() -> None:
    """Rules 5 and 6: a member running a sequence of a class starts another only where all of
    it fits beside the watermark, so a parent's turn finds KV without preempting anyone."""
    policy = make(kv_blocks=100, block_size=16, max_batch_tokens=256)  # 1,600 tokens of KV
    for i in range(4):
        policy.add(llm(f"t{i}", CHAT, client="teen", prompt=700, max_tokens=40), 0.0)
    now = 0.0
    for _ in range(6):
        _, _, now = step(policy, now)
    teen = [r for r in policy.running.values() if r.client == "teen"]
    assert len(teen) == 2  # a third would have left less than the watermark (10 blocks)
    assert policy.kv.free_blocks >= policy.config.kv_reserve_blocks
    policy.add(llm("p", CHAT, client="parent", prompt=100, max_tokens=5), now)
    plan, _, now = step(policy, now)
    assert "p" in ids(plan) and isinstance(plan, LlmPlan) and not plan.preempted
    finished, _ = drain(policy, now)
    assert finished[0].id == "p"
    assert {r.id for r in finished} == {"p", "t0", "t1", "t2", "t3"}


def test_a_members_second_turn_still_takes_kv_from_background() -> None:
    """The watermark of rule 6 counts KV held by less urgent work as free: a member's second
    chat turn preempts a summary for it, as any interactive turn does (rule 5)."""
    policy = make(kv_blocks=100, block_size=16, max_batch_tokens=512)
    policy.add(llm("c1", CHAT, client="a", prompt=100, max_tokens=60), 0.0)
    _, _, now = step(policy, 0.0)
    policy.add(llm("doc", BACKGROUND, client="docs", prompt=1300, max_tokens=10), now)
    for _ in range(4):
        _, _, now = step(policy, now)
    assert policy.kv.free_blocks < policy.config.kv_reserve_blocks + 17  # the summary holds KV
    policy.add(llm("c2", CHAT, client="a", prompt=250, max_tokens=5), now)
    plan, _, now = step(policy, now)
    assert isinstance(plan, LlmPlan) and "c2" in ids(plan) and plan.preempted == ("doc",)

# --- Rule 7: adaptive batch windows ----------------------------------------------------------


def test_lane_holds_its_window_only_when_waiting_pays() -> None:
    policy = make()
    for i, t in enumerate((0.0, 0.0002, 0.0004)):  # short texts, 0.2 ms apart
        policy.add(embed(f"e{i}", tokens=8, arrival=t), t)
    plan = policy.schedule(0.0004)
    # Holding costs (3 + 1) × 0.2 ms of waiting and 3 × 0.08 ms of the newcomer's share, less
    # than the 2 ms fixed cost the newcomer would otherwise pay in a step of its own.
    assert isinstance(plan, IdlePlan) and plan.reason == "batch window"
    assert plan.wake_at == pytest.approx(0.0006)  # when the next text is due

    policy.add(llm("c", CHAT), 0.0004)  # the device is no longer otherwise idle
    assert not isinstance(policy.schedule(0.0004), IdlePlan)

    policy = make()  # 64-token texts 0.5 ms apart: each adds more than the batch saves
    for i, t in enumerate((0.0, 0.0005, 0.001)):
        policy.add(embed(f"e{i}", tokens=64, arrival=t), t)
    assert isinstance(policy.schedule(0.001), EmbedPlan)


def test_no_window_without_a_forecast_or_for_a_zero_window() -> None:
    policy = make()
    policy.add(embed("e0"), 0.0)
    assert isinstance(policy.schedule(0.0), EmbedPlan)  # no arrival history: start at once

    policy = make(batch_window_ms={VOICE: 0.0, CHAT: 10.0, BACKGROUND: 200.0})
    for i, t in enumerate((0.0, 0.0001, 0.0002)):
        policy.add(stt(f"u{i}", arrival=t), t)
    assert isinstance(policy.schedule(0.0002), SttPlan)


# --- Rule 8: progress guarantee -------------------------------------------------------------


def _chatter(policy, now: float, n: int) -> None:  # type: ignore[no-untyped-def]
    for i in range(n):
        policy.add(llm(f"chat{now:.3f}-{i}", CHAT, client=f"c{i}", prompt=50,
                       max_tokens=10_000), now)


def test_background_gets_its_minimum_share_under_constant_chatter() -> None:
    # ITL budget below a lone decode's cost: the chat stream leaves no slack at all.
    slo = {VOICE: Slo(500, 80, 500), CHAT: Slo(1000, 12, 1000), BACKGROUND: Slo()}
    policy = make(slo=slo, background_max_wait_s=1.0, background_min_share=0.2)
    _chatter(policy, 0.0, 4)
    for i in range(20_000):
        policy.add(embed(f"e{i}"), 0.0)
    first_background = None
    background_time = total_time = 0.0
    now = 0.0
    while now < 20.0:
        plan, _, end = step(policy, now)
        if isinstance(plan, EmbedPlan):
            first_background = first_background if first_background is not None else now
            if now > 10.0:
                background_time += end - now
        if now > 10.0:
            total_time += end - now
        now = end
    assert first_background is not None and 1.0 <= first_background < 1.5
    assert background_time / total_time >= 0.15


def _owed_steps(worth: float, stop_after: int | None = None) -> tuple[list[LlmPlan], object]:
    """A summary 1,500 tokens into its prompt on the 2-core CPU's profile, then four chat
    streams whose ITL leaves background no slack: background is owed its share (rule 8)."""
    slo = {VOICE: Slo(500, 80, 500), CHAT: Slo(1000, 12, 1000), BACKGROUND: Slo()}
    config = replace(
        PolicyConfig(), slo=slo, background_max_wait_s=1.0, owed_chunk_worth=worth
    ).scaled(8)
    policy = make_policy("fairlane", config, CostModel(load_profile("cpu-2core")[0]))
    policy.add(llm("doc", BACKGROUND, client="docs", prompt=3000, max_tokens=4), 0.0)
    now = 0.0
    while policy.requests["doc"].computed_tokens < 1500:  # nobody talking: large steps
        _, _, now = step(policy, now)
    _chatter(policy, now, 4)
    owed: list[LlmPlan] = []
    end = now + 20.0  # the share window (10 s) forgets the steps before the chatter
    while now < end:
        plan, _, now = step(policy, now)
        if isinstance(plan, LlmPlan) and "doc" in ids(plan):
            owed.append(plan)
            if len(owed) == stop_after:
                break
    policy.now = now  # type: ignore[attr-defined]
    return owed, policy


def test_an_owed_slice_spends_its_share_on_tokens_not_on_a_prompt_chunks_fixed_cost() -> None:
    """Rule 8 where a prompt chunk's fixed cost (its kernels, its attention over 1,500
    positions) fills the slice: the owed step grows until the chunk's tokens cost as much as
    that fixed cost, so the same owed share prefills more of the summary; never past the
    arrival wait."""
    grown, policy = _owed_steps(1.0)
    kept, _ = _owed_steps(0.0)  # the old rule: the owed step keeps to the slice
    assert grown and kept
    profile = load_profile("cpu-2core")[0].llm
    fixed_ms = profile.prefill_base_ms + profile.context_token_us * 1500 / 1000  # 18 ms
    # A token's own cost: its prefill, and its attention over the cells held (1,500 at least).
    token_ms = profile.prefill_token_ms + profile.prefill_attention_ns * 1500 / 1e6
    for plan in grown:
        tokens = chunk_of(plan, "doc").num_tokens
        assert tokens * token_ms >= fixed_ms  # the chunk's tokens cost at least its fixed cost
        assert plan.predicted_s <= policy.config.arrival_wait_s  # type: ignore[attr-defined]
    assert all(chunk_of(p, "doc").num_tokens == 1 for p in kept)
    # The share is device time (split by tokens): fewer, fuller owed steps, more of the summary.
    done = sum(chunk_of(p, "doc").num_tokens for p in grown)
    assert done > 1.2 * sum(chunk_of(p, "doc").num_tokens for p in kept)


@pytest.mark.parametrize("worth", [0.0, 1.0])
def test_an_interactive_arrival_waits_for_one_owed_slice_at_most(worth: float) -> None:
    """Rule 2 beside rule 8: when background falls below its share, owed slices came back
    to back until the share was made up (with 1-token chunks, a dozen and more), and a spoken
    command waited behind all of them. Now an interactive prompt waits for one owed step at
    most, at whatever step boundary of the evening it arrives."""
    for boundary in range(1, 40):
        policy = _owed_steps(worth, stop_after=boundary)[1]
        at = policy.now  # type: ignore[attr-defined]
        policy.add(llm("v", VOICE, prompt=300, arrival=at), at)  # type: ignore[attr-defined]
        first, _, now = step(policy, at)  # type: ignore[arg-type]
        if "v" not in ids(first):
            assert "doc" in ids(first)  # the one owed slice
            second, _, _ = step(policy, now)  # type: ignore[arg-type]
            assert "v" in ids(second)


def test_background_fills_the_slack_before_the_next_decode_is_due() -> None:
    policy = make()  # chat ITL 100 ms (budget 80 ms); a decode iteration costs ~11 ms
    _chatter(policy, 0.0, 1)
    for i in range(20_000):
        policy.add(embed(f"e{i}"), 0.0)
    token_times = []
    kinds = []
    now = 0.0
    while now < 2.0:
        plan, _, now = step(policy, now)
        kinds.append(type(plan).__name__)
        if isinstance(plan, LlmPlan):
            token_times.append(now)
    gaps = [b - a for a, b in itertools.pairwise(token_times[1:])]
    assert "EmbedPlan" in kinds and "LlmPlan" in kinds
    assert max(gaps) <= 0.100  # the stream still meets its ITL target
    assert min(gaps) > 0.05  # and background used the slack between its tokens


# --- Rule 9: admission control --------------------------------------------------------------


def test_queue_limit_refuses_with_a_reason() -> None:
    policy = make(queue_limit={VOICE: 2, CHAT: 128, BACKGROUND: 1000})
    assert policy.add(stt("u1"), 0.0).accepted
    assert policy.add(stt("u2"), 0.0).accepted
    refused = policy.add(stt("u3"), 0.0)
    assert not refused.accepted and "voice queue is full" in refused.reason
    assert "u3" not in policy.requests


def test_interactive_request_that_cannot_meet_its_deadline_fails_fast() -> None:
    policy = make()
    for i in range(10):
        policy.add(llm(f"v{i}", VOICE, prompt=2000), 0.0)
    refused = policy.add(llm("late", VOICE, prompt=500, deadline_s=0.05), 0.0)
    assert not refused.accepted and "deadline" in refused.reason
    assert refused.predicted_wait_s > 0.05
    assert make().add(llm("ok", VOICE, prompt=500, deadline_s=1.0), 0.0).accepted


def test_prompt_longer_than_the_kv_cache_is_refused_for_good() -> None:
    policy = make(kv_blocks=10, block_size=16)
    refused = policy.add(llm("big", prompt=1000), 0.0)
    assert not refused.accepted and "do not fit the 160 tokens" in refused.reason
    assert not refused.retryable  # the API answers 400, not 429


# --- Cancellation --------------------------------------------------------------------------


def test_cancel_frees_kv_at_once_and_the_sequence_leaves_the_batch() -> None:
    policy = make()
    policy.add(llm("a", prompt=100, max_tokens=100), 0.0)
    policy.add(llm("b", prompt=100, max_tokens=100), 0.0)
    _, _, now = step(policy, 0.0)
    assert policy.cancel("a", now)
    assert "a" not in policy.kv.held
    plan, _, _ = step(policy, now)
    assert ids(plan) == ["b"]
    assert not policy.cancel("a", now)  # already gone
