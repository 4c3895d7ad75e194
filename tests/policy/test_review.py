"""Regression tests for the scheduler review (`shared/reviews/scheduler-repro/`): each scenario
of a reproducer, on the server's own budgets where the finding was about them."""

from __future__ import annotations

import itertools

import pytest

from fairlane import config
from fairlane.policy import (
    CostModel,
    EmbedPlan,
    IdlePlan,
    Kind,
    LlmPlan,
    PolicyConfig,
    Request,
    StepResult,
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
    embed,
    ids,
    llm,
    make,
    outputs_for,
    step,
    stt,
)


def server_policy(device: str = "gpu", profile: str | None = None, **llm_settings: object):
    """The fairlane policy with the budgets `fairlane serve` gives it by default."""
    cfg = config.parse({"llm": llm_settings} if llm_settings else {}).serving_policy(device)
    cost = CostModel(load_profile(profile)[0] if profile else PROFILE)
    return make_policy("fairlane", cfg, cost)


def run_until(policy, now: float, done, limit: int = 10_000) -> float:
    for _ in range(limit):
        plan, _, now = step(policy, now)
        assert not (isinstance(plan, IdlePlan) and plan.wake_at is None and policy.has_work()), \
            "idle with work and nothing to wait for"
        if done(plan):
            return now
    raise AssertionError("never happened")


# --- 1. a background prompt that cannot pass the watermark (R5) ----------------------------


def test_a_background_prompt_too_large_for_its_share_is_refused_for_good() -> None:
    policy = server_policy()
    capacity = policy.capacity_tokens(BACKGROUND)
    assert capacity == 5520  # 6144 tokens of KV less the 10% watermark, in whole blocks
    refused = policy.add(llm("auto", BACKGROUND, client="automations", prompt=5600,
                             max_tokens=200), 0.0)
    assert not refused.accepted and not refused.retryable
    assert "5520 tokens a background request may hold" in refused.reason
    # The same prompt from a person may use the whole cache.
    assert policy.add(llm("chat", CHAT, prompt=5600, max_tokens=200), 0.0).accepted


def test_owed_background_that_cannot_run_never_stops_voice_and_chat() -> None:
    """R5 case A on today's budgets: the largest background prompt that is admitted, an owed
    share, and a voice command and a chat turn 6 s later: both are served at once."""
    policy = server_policy()
    assert policy.add(llm("auto", BACKGROUND, prompt=5400, max_tokens=100), 0.0).accepted
    policy.add(llm("hold", CHAT, client="teen", prompt=3000, max_tokens=3000), 0.0)
    now = run_until(policy, 0.0, lambda plan: "hold" in ids(plan))
    policy.add(stt("u", VOICE), 6.0)
    policy.add(llm("c", CHAT, client="parent", prompt=100, max_tokens=3), 6.0)
    now = max(now, 6.0)
    served = set()
    for _ in range(50):
        plan, _, now = step(policy, now)
        assert not isinstance(plan, IdlePlan)
        served |= set(ids(plan)) & {"u", "c"}
        if served == {"u", "c"}:
            break
    assert served == {"u", "c"}


def test_a_preempted_background_turn_that_grew_comes_back() -> None:
    """R5 case B: a summary that generated 600 tokens after a 5,000-token prompt is preempted
    by voice; prompt + output is now above the watermark's share, yet it resumes and ends."""
    policy = server_policy()
    assert not policy.add(llm("sum", BACKGROUND, prompt=5000, max_tokens=2000), 0.0).accepted
    policy.add(llm("sum", BACKGROUND, prompt=4800, max_tokens=700), 0.0)
    now = run_until(policy, 0.0, lambda plan: policy.requests["sum"].output_tokens >= 600)
    policy.add(llm("v", VOICE, client="parent-a", prompt=1100, max_tokens=3), now)
    now = run_until(policy, now, lambda plan: "v" not in policy.requests)
    run_until(policy, now, lambda plan: "sum" not in policy.requests)


# --- 2. rule 8 with the LLM as the owed lane (R8, R15) ---------------------------------------


def test_an_owed_llm_slice_carries_background_not_a_chat_prefill() -> None:
    policy = make(background_max_wait_s=5.0)
    policy.add(llm("sum", BACKGROUND, client="summaries", prompt=3000, max_tokens=200), 0.0)
    policy.add(llm("chat", CHAT, client="teen", prompt=4000, max_tokens=50), 6.0)
    policy.add(stt("u", VOICE, client="parent-a"), 6.0)
    plan = policy.schedule(6.0)
    assert isinstance(plan, LlmPlan)
    assert {c.priority for c in plan.chunks} == {BACKGROUND}
    assert plan.predicted_s <= policy.config.slice_s + 1e-9


def test_embeddings_are_served_when_the_owed_llm_lane_cannot_run() -> None:
    """R8: four chat streams hold every sequence slot; a background LLM turn cannot start.
    Embeddings must still get background's share instead of starving behind it."""
    from fairlane.policy import Slo
    slo = {VOICE: Slo(500, 80, 500), CHAT: Slo(1000, 12, 1000), BACKGROUND: Slo()}
    policy = make(slo=slo, max_num_seqs=4)
    for i in range(4):
        policy.add(llm(f"chat{i}", CHAT, client=f"c{i}", prompt=200, max_tokens=20_000), 0.0)
    policy.add(llm("auto", BACKGROUND, client="automations", prompt=300, max_tokens=50), 0.0)
    for i in range(5_000):
        policy.add(embed(f"e{i}"), 0.0)
    now, embedded = 0.0, 0
    while now < 12.0:
        plan, _, now = step(policy, now)
        if isinstance(plan, EmbedPlan):
            embedded += len(plan.request_ids)
    assert embedded > 1000
    assert policy.share.share(BACKGROUND, now) >= 0.15  # owed 20% after waiting 5 s


# --- 3. interactive work takes a background sequence's slot (R6) ---------------------------


def test_voice_takes_a_sequence_slot_from_background() -> None:
    profile, _ = load_profile("rtx4090")
    policy = make_policy("fairlane", config.parse({}).serving_policy("gpu"), CostModel(profile))
    for i in range(8):
        policy.add(llm(f"auto{i}", BACKGROUND, client="automations", prompt=400, max_tokens=300),
                   0.0)
    now = run_until(policy, 0.0, lambda plan: len(policy.running) == 8 and all(
        r.is_decode for r in policy.running.values()))
    policy.add(llm("v", VOICE, client="parent-a", prompt=900, max_tokens=40), now)
    plan = policy.schedule(now)
    assert isinstance(plan, LlmPlan) and "v" in ids(plan)
    assert len(plan.preempted) == 1 and plan.preempted[0].startswith("auto")
    assert len(policy.running) <= 8


def test_a_sequence_preempted_for_room_is_not_restarted_in_the_same_iteration() -> None:
    """R7b: preempting a sequence and re-admitting it from token 0 in the same plan frees
    nothing and recomputes its prompt over and over."""
    policy = make(kv_blocks=64, block_size=16, max_batch_tokens=256)
    policy.add(llm("old", CHAT, client="a", prompt=600, max_tokens=300, arrival=0.0), 0.0)
    policy.add(llm("new", CHAT, client="b", prompt=400, max_tokens=300, arrival=0.001), 0.001)
    now, prefilled = 0.001, 0
    while policy.has_work():
        plan, _, now = step(policy, now)
        if isinstance(plan, LlmPlan):
            assert not set(plan.preempted) & set(ids(plan))
            prefilled += plan.prefill_tokens
    assert prefilled < 2 * (600 + 400)


# --- 4. one capacity number; admission counts the reply (R1, R4d) ---------------------------


@pytest.mark.parametrize("name", ["fairlane", "fcfs"])
def test_the_policy_can_hold_whatever_the_api_lets_in(name: str) -> None:
    """n_ctx 1000 with a 250-token prefix cache: the engine holds 750 positions and the policy
    736 (46 blocks). One number now: the capacity the API clamps to is the policy's."""
    cfg = config.parse({"llm": {"n_ctx": 1000}})
    assert cfg.llm_capacity == 736 and cfg.engine_cache_tokens == 264
    policy = make_policy(name, cfg.serving_policy("gpu"), CostModel(PROFILE))
    capacity = policy.capacity_tokens(VOICE)
    assert capacity == 736
    policy.add(llm("v", VOICE, prompt=700, max_tokens=capacity - 700), 0.0)
    refused = policy.add(llm("w", VOICE, prompt=700, max_tokens=capacity - 699), 0.0)
    assert not refused.accepted and not refused.retryable
    run_until(policy, 0.0, lambda plan: not policy.has_work())


# --- 5. a cached prefix is held by the engine's cache, not counted again (R12) ----------------


def test_a_cached_prefix_is_not_counted_in_the_requests_own_blocks() -> None:
    policy = make(kv_blocks=20, block_size=16)  # 320 positions
    for i in range(3):  # three turns sharing a 256-token system prompt held by the cache
        request = llm(f"t{i}", CHAT, client=f"c{i}", prompt=300, max_tokens=20)
        request.computed_tokens = request.cached_tokens = 256
        assert policy.add(request, 0.0).accepted
    plan = policy.schedule(0.0)
    assert sorted(ids(plan)) == ["t0", "t1", "t2"]  # 3 × 44 new positions fit; 3 × 300 do not
    assert policy.kv.used_blocks == 3 * 3
    # Preempted, a turn recomputes everything and then holds all of it itself.
    victim = policy.requests["t2"]
    policy._preempt(victim)
    assert victim.cached_tokens == 0 and victim.computed_tokens == 0


# --- 6. VTC: no banked credit on any lane, speech charged, clients forgotten (R2, R16) --------


def test_a_new_client_starts_level_with_the_one_just_served_on_the_llm_lane() -> None:
    policy = make(max_num_seqs=1)
    for i in range(6):
        policy.add(llm(f"a{i}", CHAT, client="a", prompt=500, max_tokens=10), 0.0)
    now = run_until(policy, 0.0, lambda plan: not policy.has_work())
    for i in range(6):
        policy.add(llm(f"b{i}", CHAT, client="b", prompt=500, max_tokens=10), now)
    for i in range(6, 12):
        policy.add(llm(f"a{i}", CHAT, client="a", prompt=500, max_tokens=10), now)
    order = []
    while policy.has_work():
        _plan, finished, now = step(policy, now)
        order += [r.id for r in finished]
    # Interleaved, not all six of b's first (b had banked a's service as credit before).
    assert order[:4] in (["b0", "a6", "b1", "a7"], ["a6", "b0", "a7", "b1"])


def test_speech_is_charged_to_its_speaker() -> None:
    policy = make(stt_max_batch=1)
    for i in range(3):
        policy.add(stt(f"a{i}", client="a", audio_s=4.0), 0.0)
    policy.add(stt("b0", client="b", audio_s=4.0), 0.001)
    first, _, now = step(policy, 0.01)
    second, _, _ = step(policy, now)
    assert ids(first) == ["a0"] and ids(second) == ["b0"]


@pytest.mark.parametrize(
    ("base_ms", "utterance_ms", "queued", "first_batch"),
    [
        (0.0, 705.0, 2, 1),  # Whisper on a 2-core CPU: a batch shares nothing
        (100.0, 500.0, 2, 1),  # the shipped cpu-2core profile
        (100.0, 500.0, 8, 2),  # ... but a long queue gains from what a batch does share
        (40.0, 5.0, 2, 2),  # a GPU: the fixed cost dominates
    ],
)
def test_commands_spoken_at_once_share_a_speech_step_only_where_it_pays(
    base_ms: float, utterance_ms: float, queued: int, first_batch: int
) -> None:
    """Two commands spoken at once on a 2-core CPU: batched, both transcripts came when the
    pair was done (1.6 s), the first speaker's too; one at a time the first comes at 0.7 s
    and the second no later. An utterance joins a batch only where the waits it changes fall
    in sum."""
    from dataclasses import replace

    from fairlane.policy import SttCost

    profile = replace(PROFILE, stt=SttCost(base_ms=base_ms, utterance_ms=utterance_ms))
    policy = make_policy("fairlane", PolicyConfig(), CostModel(profile))
    for i in range(queued):
        policy.add(stt(f"u{i}", client=f"speaker{i}", audio_s=2.5), 0.0)
    plan = policy.schedule(0.0)
    assert isinstance(plan, SttPlan) and len(plan.request_ids) == first_batch
    # Whatever the batch, the speakers' summed wait is no more than one at a time gives.
    one = policy.cost.stt_s(1, 2.5)
    batched = policy.cost.stt_s(first_batch, 2.5 * first_batch)
    waits = [batched] * first_batch + [batched + one * (i + 1) for i in range(queued - first_batch)]
    assert sum(waits) <= sum(one * (i + 1) for i in range(queued)) + 1e-9


def test_a_queue_forgets_clients_it_no_longer_needs() -> None:
    policy = make()
    now = 0.0
    for i in range(3_000):  # 3,000 turns, each from its own free-text `user`
        policy.add(llm(f"r{i}", CHAT, client=f"user-{i}", prompt=20, max_tokens=1), now)
        _, _, now = step(policy, now)
    queue = policy.waiting[Kind.LLM, CHAT]
    assert len(queue.by_client) == 0 and len(queue.counters) < 200


# --- 7. rule 7 windows (R3, R3c) -----------------------------------------------------------


def test_an_overdue_forecast_does_not_hold_ready_work() -> None:
    policy = make()
    t = 0.0
    for i in range(100):  # a burst, as the indexer submits it
        policy.add(embed(f"e{i}", tokens=64, arrival=t), t)
        t += 1e-5
    _, _, now = step(policy, t)
    assert isinstance(policy.schedule(now), EmbedPlan)  # no more arrivals are coming


def test_no_window_while_another_class_has_ready_work() -> None:
    policy = make()
    t = 0.0
    for i in range(40):
        policy.add(embed(f"e{i}", tokens=64, arrival=t), t)
        t += 1e-5
    policy.add(embed("q", tokens=12, client="search", priority=CHAT, arrival=t), t)
    plan = policy.schedule(t)
    assert isinstance(plan, EmbedPlan) and plan.request_ids == ("q",)


def _indexer_rate(profile_name: str, hold: bool) -> float:
    profile, _ = load_profile(profile_name)
    policy = make_policy("fairlane", PolicyConfig(), CostModel(profile))
    if not hold:
        policy._hold_window = lambda choice, now: None  # type: ignore[method-assign]
    now = 0.0
    for b in range(10):  # submit 256 chunks, wait for all, store, repeat
        for i in range(256):
            policy.add(embed(f"b{b}-{i}", tokens=200, arrival=now), now)
            now += 20e-6
        while policy.has_work():
            plan, _, end = step(policy, now)
            now = plan.wake_at if isinstance(plan, IdlePlan) else end
    return 10 * 256 / now


def test_the_window_does_not_slow_the_indexer() -> None:
    assert _indexer_rate("rtx4090", hold=True) >= 0.98 * _indexer_rate("rtx4090", hold=False)


def test_a_window_pays_when_utterances_arrive_in_a_burst() -> None:
    """Four satellites hear the same wake word 1 ms apart, on a device where a Whisper batch
    costs 40 ms however full it is (5 ms an utterance): with the window the four share one
    batch, without it the first runs alone and the rest wait for it. The window only holds
    where it pays: with the test profile (5 ms a batch, 20 ms an utterance) it never does."""
    from dataclasses import replace

    from fairlane.policy import SttCost

    gpu_like = replace(PROFILE, stt=SttCost(base_ms=40.0, utterance_ms=5.0))

    def first_batch(hold: bool) -> tuple[int, float]:
        policy = make_policy("fairlane", PolicyConfig(
            batch_window_ms={VOICE: 5.0, CHAT: 10.0, BACKGROUND: 200.0}), CostModel(gpu_like))
        if not hold:
            policy._hold_window = lambda choice, now: None  # type: ignore[method-assign]
        for i, t in enumerate((0.0, 0.001)):  # two earlier arrivals teach the rate
            policy.add(stt(f"w{i}", client=f"s{i}", arrival=t), t)
        now = 0.002
        while policy.has_work():
            plan, _, now = step(policy, now)
            if isinstance(plan, IdlePlan):
                now = plan.wake_at
        arrivals = [0.02 + 0.001 * i for i in range(4)]
        policy.add(stt("s0", client="s0", arrival=arrivals[0]), arrivals[0])
        now, pending, finished = arrivals[0], arrivals[1:], {}
        while policy.has_work() or pending:
            while pending and pending[0] <= now:
                at = pending.pop(0)
                policy.add(stt(f"s{at}", client=f"c{at}", arrival=at), at)
            plan, done, end = step(policy, now)
            if isinstance(plan, IdlePlan):
                now = min([t for t in (plan.wake_at, pending[0] if pending else None) if t])
                continue
            now = end
            finished.update({r.id: end - r.arrival for r in done})
        first = next(iter(finished))
        return len(finished), sum(finished.values()) / len(finished), first
    with_window, without = first_batch(True), first_batch(False)
    assert with_window[1] < without[1]  # mean time to transcript is lower with the window


# --- 8. the chat ITL target holds with slack and ride-along both in play (R14) ---------------


@pytest.mark.parametrize("profile_name", ["rtx4090", "cpu-2core"])
def test_chat_tokens_arrive_on_time_with_embeddings_and_a_document(profile_name: str) -> None:
    profile, device = load_profile(profile_name)
    cfg = PolicyConfig() if device == "gpu" else PolicyConfig().scaled(8.0)
    policy = make_policy("fairlane", cfg, CostModel(profile))
    policy.add(llm("chat", CHAT, client="c0", prompt=50, max_tokens=20_000), 0.0)
    for i in range(20_000):
        policy.add(embed(f"e{i}", tokens=256), 0.0)
    policy.add(llm("doc", BACKGROUND, client="docs", prompt=20_000), 0.0)
    times, now = [], 0.0
    while now < 3.0 * (8 if device == "cpu" else 1):
        plan, _, now = step(policy, now)
        if isinstance(plan, LlmPlan) and any(c.request_id == "chat" and c.samples
                                             for c in plan.chunks):
            times.append(now)
    gaps = [b - a for a, b in itertools.pairwise(times[1:])]
    target = cfg.slo[CHAT].itl_ms / 1000.0
    assert len(gaps) > 10 and max(gaps) <= target + 1e-9


# --- 9. interactive prefill is chunked too (R17) ---------------------------------------------


def test_a_voice_command_waits_at_most_one_chat_chunk_on_a_cpu() -> None:
    policy = server_policy("cpu", "cpu-2core")
    policy.add(llm("chat", CHAT, client="teen", prompt=3000, max_tokens=50), 0.0)
    plan, _, now = step(policy, 0.0)
    assert isinstance(plan, LlmPlan)
    assert plan.predicted_s <= policy.config.arrival_wait_s + 1e-9  # 2 s, not 16 s
    policy.add(stt("u", VOICE), 0.001)
    plan, _, _ = step(policy, now)
    assert isinstance(plan, SttPlan)


# --- 10. rule 9 for real (R9) --------------------------------------------------------------


@pytest.mark.parametrize("profile_name", ["cpu-2core", "rtx4090"])
def test_an_idle_device_admits_a_voice_command_whose_deadline_is_the_slo(profile_name) -> None:
    profile, device = load_profile(profile_name)
    cfg = PolicyConfig() if device == "gpu" else PolicyConfig().scaled(8.0)
    policy = make_policy("fairlane", cfg, CostModel(profile))
    deadline = cfg.slo[VOICE].stt_ms / 1000.0
    request = stt("u", VOICE, audio_s=2.0)
    request.deadline_s = deadline
    assert policy._predicted_wait(request) == pytest.approx(policy.cost.stt_s(1, 2.0))
    assert policy.add(request, 0.0).accepted


def test_a_cached_prompt_predicts_a_short_wait() -> None:
    policy = make()
    cached = llm("cached", CHAT, prompt=2000)
    cached.computed_tokens = cached.cached_tokens = 1990
    assert policy._predicted_wait(cached) == pytest.approx(
        policy._predicted_wait(llm("tiny", CHAT, prompt=10)))


def test_the_llm_estimate_counts_every_chunk() -> None:
    policy = make()
    policy.add(llm("c0", CHAT, prompt=50, max_tokens=1000), 0.0)
    now = 0.0
    for _ in range(3):
        _, _, now = step(policy, now)
    for i in range(3):
        policy.add(llm(f"w{i}", CHAT, client=f"x{i}", prompt=2000), now)
    probe = llm("probe", CHAT, client="p", prompt=2000)
    predicted = policy._predicted_wait(probe)
    policy.add(probe, now)
    start = now
    now = run_until(policy, now, lambda plan: isinstance(plan, LlmPlan) and any(
        c.request_id == "probe" and c.samples for c in plan.chunks))
    assert predicted == pytest.approx(now - start, rel=0.35)


def test_a_waiting_request_past_its_deadline_fails_fast() -> None:
    """A chat turn admitted on an idle device, then overtaken by voice commands it could not
    foresee: when its deadline passes it leaves the queue, and the caller tells its client."""
    policy = make()
    assert policy.add(llm("late", CHAT, client="b", prompt=100, deadline_s=0.3), 0.0).accepted
    for i in range(3):
        policy.add(llm(f"v{i}", VOICE, client=f"s{i}", prompt=3000, max_tokens=5), 0.0)
    now, expired = 0.0, []
    while not expired:
        expired = policy.expire(now)
        plan, _, now = step(policy, now)
        assert "late" not in ids(plan)
    assert [r.id for r in expired] == ["late"] and now <= 0.3 + 0.25
    assert "late" not in policy.requests and policy.waiting_count(CHAT) == 0


# --- 13. cancelling behind a long backlog is O(1) per request (R11b) --------------------------


def test_a_queued_request_is_removed_without_scanning_its_queue() -> None:
    queue = FairQueue()
    backlog = [embed(f"doc{i}", client="documents") for i in range(1000)]
    for request in backlog:
        queue.push(request)
    assert Request.__eq__ is object.__eq__  # identity: no field-by-field comparisons
    assert queue.remove(backlog[500]) and not queue.remove(backlog[500])
    assert len(queue) == 999 and backlog[500] not in list(queue)
    assert queue.peek() is backlog[0]
    queue.remove(backlog[0])
    assert queue.peek() is backlog[1]


# --- the property test's missing states (R13) ------------------------------------------------


def test_the_state_the_property_test_missed_now_drains() -> None:
    policy = make(kv_blocks=100, block_size=16, max_num_seqs=8, max_batch_tokens=512)
    admission = policy.add(llm("a", BACKGROUND, prompt=1450, max_tokens=10), 0.0)
    assert not admission.accepted  # 1460 > 1440: 90% of the 1600-token cache
    policy.add(llm("b", BACKGROUND, prompt=1400, max_tokens=10), 0.0)
    now = 0.0
    while policy.has_work():
        plan = policy.schedule(now)
        assert not isinstance(plan, IdlePlan)
        now += plan.predicted_s
        policy.update_from_output(plan, StepResult(plan.predicted_s, outputs_for(plan)), now)


def test_one_chunk_names_a_request_once(  # the plan shape the engine relies on
) -> None:
    policy = make()
    policy.add(llm("a", CHAT, prompt=100), 0.0)
    assert chunk_of(policy.schedule(0.0), "a").num_tokens == 100
