"""The baseline: first come, first served, as Ollama, llama.cpp and vLLM do by default.

No classes, no chunked prefill, no fairness, no slices. One FIFO over all work; the oldest
request decides which engine runs next. LLM iterations still batch (continuous batching with
whole-prompt prefill, like llama-server's slots), so the comparison is with a real server's
default behaviour, not a strawman that runs one request at a time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from fairlane.policy.base import IterationBuilder, Policy
from fairlane.policy.config import PolicyConfig
from fairlane.policy.cost import CostModel
from fairlane.policy.plan import EmbedPlan, IdlePlan, Plan, SttPlan
from fairlane.policy.request import Kind, Priority, Request, Status


class FcfsScheduler(Policy):
    name = "fcfs"

    def __init__(self, config: PolicyConfig, cost: CostModel) -> None:
        super().__init__(config, cost)
        self.queues: dict[Kind, deque[Request]] = {k: deque() for k in Kind}

    def _enqueue(self, request: Request, now: float) -> None:
        self.queues[request.kind].append(request)

    def _requeue_preempted(self, request: Request) -> None:
        self.queues[request.kind].appendleft(request)

    def _dequeue(self, request: Request) -> bool:
        try:
            self.queues[request.kind].remove(request)
        except ValueError:
            return False
        return True

    def waiting_count(self, priority: Priority | None = None) -> int:
        return sum(1 for q in self.queues.values() for r in q if priority in (None, r.priority))

    def schedule(self, now: float) -> Plan:
        """The engine whose oldest request (waiting or running) arrived first runs next."""
        heads = {k: q[0].arrival for k, q in self.queues.items() if q}
        if self.running:
            oldest_running = min(r.arrival for r in self.running.values())
            heads[Kind.LLM] = min(heads.get(Kind.LLM, oldest_running), oldest_running)
        if not heads:
            return IdlePlan()
        kind = min(heads, key=lambda k: heads[k])
        if kind is Kind.STT:
            taken = self._take(Kind.STT, self.config.stt_max_batch, now)
            audio_s = sum(r.audio_s for r in taken)
            return SttPlan(
                request_ids=tuple(r.id for r in taken),
                priority=Priority.VOICE,
                audio_s=audio_s,
                predicted_s=self.cost.stt_s(len(taken), audio_s),
            )
        if kind is Kind.EMBED:
            taken = self._take(Kind.EMBED, self.config.embed_max_batch, now)
            padded = max(r.prompt_tokens for r in taken) * len(taken)
            return EmbedPlan(
                request_ids=tuple(r.id for r in taken),
                priority=Priority.BACKGROUND,
                padded_tokens=padded,
                predicted_s=self.cost.embed_s(padded),
            )
        return self._plan_llm(now)

    def _take(self, kind: Kind, limit: int, now: float) -> list[Request]:
        queue = self.queues[kind]
        taken = [queue.popleft() for _ in range(min(limit, len(queue)))]
        for request in taken:
            self._start(request, now)
        return taken

    def _plan_llm(self, now: float) -> Plan:
        """All running sequences advance; waiting prompts join whole, in arrival order."""
        batch = IterationBuilder(self.cost, self.config.max_batch_tokens, self.config.max_num_seqs)
        preempted: list[str] = []
        for request in sorted(self.running.values(), key=lambda r: r.order):
            if request.status is not Status.RUNNING or len(batch.chunks) >= batch.max_seqs:
                continue
            tokens = request.remaining_prefill
            # Without classes the newest running sequence yields, whatever it is.
            total = request.computed_tokens + tokens
            if self._make_room(request, total, batch, preempted, _newer_than(request)):
                batch.add(request, tokens)
        queue = self.queues[Kind.LLM]
        while queue and len(self.running) < self.config.max_num_seqs:
            request = queue[0]
            if request.id in preempted:
                break  # preempted for room in this very iteration: it waits for the next
            tokens = request.remaining_prefill
            # No chunking: a prompt joins whole, and the first one joins even when it is larger
            # than the token budget (a server without chunked prefill has no other choice).
            if batch.prefill and tokens > batch.token_room:
                break
            held = request.kv_tokens(request.target_tokens)
            if not self.kv.can_hold(request.id, held):
                break
            queue.popleft()
            self._start(request, now)
            self.kv.grow(request.id, held)
            batch.add(request, tokens)
        if not batch.chunks:
            return IdlePlan(reason="waiting for KV space")
        return batch.plan(preempted)


def _newer_than(request: Request) -> Callable[[Request], bool]:
    return lambda other: other.order > request.order
