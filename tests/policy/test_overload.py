"""Overload with the default configuration: every interactive request gets an answer in time.

The load is the report's: more voice and chat work than the queues hold, offered again the
moment a place frees, for two minutes of simulated device time (bounded loops, a clock that
is passed in: nothing here waits on the machine)."""

from __future__ import annotations

import itertools

from fairlane.policy import IdlePlan, LlmPlan
from tests.policy.helpers import CHAT, VOICE, llm, make, step


def test_under_constant_voice_overload_every_chat_request_is_answered_by_its_deadline() -> None:
    policy = make()  # the default waiting limits and queue limits
    deadline_s = policy.config.max_wait_ms[CHAT] / 1000.0
    numbers = itertools.count()
    admitted: dict[str, float] = {}  # chat request → when it was admitted
    answered: dict[str, float] = {}  # → its first output, or the moment it was dropped
    voice_tokens = 0
    now, longest_step = 0.0, 0.0
    while now < 120.0:
        for priority in (VOICE, CHAT):  # fill each queue until admission says no
            while True:
                rid = f"{priority.label}-{next(numbers)}"
                request = llm(rid, priority, client=rid, arrival=now, prompt=50, max_tokens=500)
                if not policy.add(request, now).accepted:
                    break
                if priority is CHAT:
                    admitted[rid] = now
        for request in policy.expire(now):  # as the device loop does before each step
            answered.setdefault(request.id, now)
        plan, _, end = step(policy, now)
        if isinstance(plan, IdlePlan):
            now += 0.01
            continue
        assert isinstance(plan, LlmPlan)
        for chunk in plan.chunks:
            if chunk.samples and chunk.request_id in admitted:
                answered.setdefault(chunk.request_id, end)
            voice_tokens += bool(chunk.samples and chunk.priority is VOICE)
        longest_step = max(longest_step, end - now)
        now = end
    # Every chat request old enough has its answer, and none waited past its deadline (plus
    # the one step in flight when it passed).
    due = [rid for rid, at in admitted.items() if at + deadline_s + longest_step < now]
    assert due and all(rid in answered for rid in due), "a chat request was left waiting"
    waits = [answered[rid] - admitted[rid] for rid in due]
    assert max(waits) <= deadline_s + longest_step
    assert voice_tokens > 0 and len(due) > policy.config.queue_limit[CHAT]


def test_a_clients_background_request_is_answered_by_its_waiting_limit_a_durable_job_waits() -> (
        None):
    """Under constant voice work a client's background request (an automation's embeddings)
    once waited without end: now it is dropped (a 429) at its class's waiting limit. The
    server's own durable job (the indexer's) keeps waiting for its turn."""
    from fairlane.policy import NO_WAIT_LIMIT, Priority

    policy = make()
    limit_s = policy.config.max_wait_ms[Priority.BACKGROUND] / 1000.0
    client = llm("automation", Priority.BACKGROUND, client="automation", arrival=0.0)
    durable = llm("indexer", Priority.BACKGROUND, client="documents", arrival=0.0)
    durable.max_wait_s = NO_WAIT_LIMIT
    assert policy.add(client, 0.0).accepted and policy.add(durable, 0.0).accepted
    assert client.max_wait_s == limit_s
    dropped = {r.id for r in policy.expire(limit_s - 0.001)}
    assert not dropped
    dropped = {r.id for r in policy.expire(limit_s + 0.001)}
    assert dropped == {"automation"}
    assert not policy.expire(10 * limit_s)
