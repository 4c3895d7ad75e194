"""Bookkeeping every policy shares: request table, running LLM batch, KV cache, results.

A policy subclass only decides *what runs next* (`schedule`) and how its waiting queues are kept;
admitting, cancelling, preempting and applying results are the same for all of them.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from fairlane.policy.config import PolicyConfig
from fairlane.policy.cost import CostModel
from fairlane.policy.kv import KvCache
from fairlane.policy.plan import (
    Admission,
    Chunk,
    EmbedPlan,
    LlmPlan,
    Plan,
    StepPlan,
    StepResult,
    SttPlan,
)
from fairlane.policy.request import Kind, Priority, Request, Status


@dataclass
class DeviceShare:
    """Each class's share of device time over a sliding (exponentially decayed) window."""

    window_s: float
    busy: dict[Priority, float] = field(default_factory=lambda: dict.fromkeys(Priority, 0.0))
    total: float = 0.0
    last: float | None = None

    def record(self, seconds: dict[Priority, float], now: float) -> None:
        elapsed = sum(seconds.values())
        span = max(now - self.last, elapsed) if self.last is not None else elapsed
        decay = math.exp(-span / self.window_s)
        for priority in self.busy:
            self.busy[priority] = self.busy[priority] * decay + seconds.get(priority, 0.0)
        self.total = self.total * decay + span
        self.last = now

    def share(self, priority: Priority, now: float) -> float:
        if self.last is None:
            return 0.0
        idle = max(0.0, now - self.last)
        total = self.total * math.exp(-idle / self.window_s) + idle
        busy = self.busy[priority] * math.exp(-idle / self.window_s)
        return busy / total if total > 0 else 0.0


@dataclass
class IterationBuilder:
    """Accumulates one LLM iteration's chunks against its token and sequence budgets."""

    cost: CostModel
    max_tokens: int
    max_seqs: int
    chunks: list[Chunk] = field(default_factory=list)
    scheduled: set[str] = field(default_factory=set)
    tokens: int = 0
    prefill: int = 0
    decodes: int = 0
    context: int = 0

    @property
    def token_room(self) -> int:
        return self.max_tokens - self.tokens

    @property
    def full(self) -> bool:
        return self.tokens >= self.max_tokens or len(self.chunks) >= self.max_seqs

    def predicted_s(self, prefill: int = 0, decodes: int = 0, context: int = 0) -> float:
        return self.cost.llm_s(
            self.prefill + prefill, self.decodes + decodes, self.context + context
        )

    def prefill_room(self, budget_s: float | None) -> int:
        """Prefill tokens that still fit both the token budget and the time budget."""
        if budget_s is None:
            return self.token_room
        fits = self.cost.prefill_tokens_within(budget_s, self.prefill, self.decodes, self.context)
        return min(self.token_room, fits)

    def add(self, request: Request, num_tokens: int) -> Chunk:
        start = request.computed_tokens
        chunk = Chunk(
            request_id=request.id,
            start=start,
            num_tokens=num_tokens,
            samples=start + num_tokens == request.target_tokens,
            decode=request.is_decode,
            priority=request.priority,
        )
        self.chunks.append(chunk)
        self.scheduled.add(request.id)
        self.tokens += num_tokens
        if chunk.decode:
            self.decodes += 1
        else:
            self.prefill += num_tokens
        self.context += start + num_tokens
        return chunk

    def plan(self, preempted: list[str]) -> LlmPlan:
        return LlmPlan(
            chunks=tuple(self.chunks),
            preempted=tuple(preempted),
            predicted_s=self.predicted_s(),
            context_tokens=self.context,
        )


class Policy(ABC):
    """The scheduling contract: `add` → `schedule(now)` → run the plan → `update_from_output`."""

    name: str

    def __init__(self, config: PolicyConfig, cost: CostModel) -> None:
        self.config = config
        self.cost = cost
        self.kv = KvCache(config.kv_blocks, config.block_size)
        self.requests: dict[str, Request] = {}
        self.running: dict[str, Request] = {}  # LLM sequences holding KV, in admission order
        self.share = DeviceShare(config.share_window_s)

    # --- what subclasses decide -------------------------------------------------------------

    @abstractmethod
    def schedule(self, now: float) -> Plan:
        """Decide the next device step."""

    @abstractmethod
    def _enqueue(self, request: Request, now: float) -> None:
        """Put a newly admitted request in its waiting queue."""

    @abstractmethod
    def _requeue_preempted(self, request: Request) -> None:
        """Put a preempted request back at the head of its waiting queue."""

    @abstractmethod
    def _dequeue(self, request: Request) -> bool:
        """Take a waiting request out of its queue (cancellation)."""

    @abstractmethod
    def waiting_count(self, priority: Priority | None = None) -> int:
        """Requests waiting (not running), of one class or of all."""

    def _admission_refusal(self, request: Request, now: float) -> Admission | None:
        """A reason to refuse the request at once, or None to accept it (rule 9)."""
        return None

    def _charge(self, request: Request, tokens: float) -> None:  # noqa: B027
        """Account service to a request's client (fairness); the baseline keeps no counters."""

    def _account(self, plan: StepPlan, seconds: dict[Priority, float]) -> None:  # noqa: B027
        """Hook for a policy that keeps its own record of where device time went."""

    # --- the shared contract ----------------------------------------------------------------

    def add(self, request: Request, now: float) -> Admission:
        """Admit a request to its queue, or refuse it with a reason."""
        if request.id in self.requests:
            return Admission(False, f"duplicate request id {request.id!r}")
        refusal = self._admission_refusal(request, now)
        if refusal is not None:
            return refusal
        request.status = Status.WAITING
        self.requests[request.id] = request
        self._enqueue(request, now)
        return Admission(True)

    def cancel(self, request_id: str, now: float) -> bool:
        """Drop a request wherever it is; a running sequence's KV is freed at once."""
        request = self.requests.get(request_id)
        if request is None:
            return False
        if request.status is Status.WAITING:
            self._dequeue(request)
        self._retire(request, Status.CANCELLED, now)
        return True

    def has_work(self) -> bool:
        return bool(self.requests)

    def update_from_output(self, plan: StepPlan, result: StepResult, now: float) -> list[Request]:
        """Apply one step's results; returns the requests that finished with it."""
        self.cost.observe(plan.kind, plan.predicted_s, result.elapsed_s)
        seconds = class_seconds(plan, result.elapsed_s)
        self.share.record(seconds, now)
        self._account(plan, seconds)
        outputs = {o.request_id: o for o in result.outputs}
        finished: list[Request] = []
        if isinstance(plan, LlmPlan):
            for chunk in plan.chunks:
                request = self.requests.get(chunk.request_id)
                if request is None or request.status is not Status.RUNNING:
                    continue  # cancelled while the step ran
                request.computed_tokens = chunk.start + chunk.num_tokens
                if not chunk.samples:
                    continue
                output = outputs.get(request.id)
                new_tokens = output.new_tokens if output is not None else 0
                request.output_tokens += new_tokens
                if new_tokens:
                    request.last_token_at = now
                    self._charge(request, new_tokens * self.config.vtc_output_weight)
                ended = output is None or output.finished or new_tokens == 0
                if ended or request.output_tokens >= request.max_tokens:
                    self._retire(request, Status.FINISHED, now)
                    finished.append(request)
        else:
            for request_id in plan.request_ids:
                request = self.requests.get(request_id)
                if request is not None and request.status is Status.RUNNING:
                    self._retire(request, Status.FINISHED, now)
                    finished.append(request)
        return finished

    # --- helpers for subclasses ---------------------------------------------------------------

    def _start(self, request: Request, now: float) -> None:
        """A waiting request enters its first (or first resumed) step."""
        request.status = Status.RUNNING
        if request.first_scheduled is None:
            request.first_scheduled = now
        if request.kind is Kind.LLM:
            self.running[request.id] = request

    def _retire(self, request: Request, status: Status, now: float) -> None:
        request.status = status
        request.finished_at = now
        self.kv.release(request.id)
        self.running.pop(request.id, None)
        self.requests.pop(request.id, None)

    def _preempt(self, request: Request) -> None:
        """Free a sequence's KV; it resumes later by recomputing prompt and output so far."""
        self.kv.release(request.id)
        self.running.pop(request.id, None)
        request.status = Status.WAITING
        request.computed_tokens = 0
        request.preemptions += 1
        self._requeue_preempted(request)

    def _make_room(
        self,
        request: Request,
        tokens: int,
        batch: IterationBuilder,
        preempted: list[str],
        may_evict: Callable[[Request], bool],
    ) -> bool:
        """Get KV for `tokens` positions of `request`, preempting running sequences if needed.

        Victims are running sequences not yet in this iteration that `may_evict` allows: the
        least urgent and newest first (vLLM's order).
        """
        while self.kv.extra_blocks(request.id, tokens) > self.kv.free_blocks:
            victims = [
                r
                for r in self.running.values()
                if r.id not in batch.scheduled and r.id != request.id and may_evict(r)
            ]
            if not victims:
                return False
            victim = max(victims, key=lambda r: (r.priority, r.arrival, r.id))
            self._preempt(victim)
            preempted.append(victim.id)
        self.kv.grow(request.id, tokens)
        return True


def class_seconds(plan: StepPlan, elapsed_s: float) -> dict[Priority, float]:
    """Attribute a step's device time to classes, in proportion to the tokens each carried."""
    if isinstance(plan, EmbedPlan | SttPlan):
        return {plan.priority: elapsed_s}
    weights: dict[Priority, float] = {}
    for chunk in plan.chunks:
        weights[chunk.priority] = weights.get(chunk.priority, 0.0) + chunk.num_tokens
    total = sum(weights.values())
    return {p: elapsed_s * w / total for p, w in weights.items()} if total else {}
