"""Bookkeeping every policy shares: request table, running LLM batch, KV cache, results.

A policy subclass only decides *what runs next* (`schedule`) and how its waiting queues are kept;
admitting, cancelling, preempting and applying results are the same for all of them.
"""

from __future__ import annotations

import heapq
import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

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
    TtsPlan,
)
from fairlane.policy.request import Kind, Priority, Request, Status

K = TypeVar("K")


@dataclass
class DeviceShare(Generic[K]):
    """Each key's share of device time (a class's, or a lane's) over a decayed window."""

    window_s: float
    busy: dict[K, float] = field(default_factory=dict)
    total: float = 0.0
    last: float | None = None

    def record(self, seconds: Mapping[K, float], now: float, elapsed: float | None = None) -> None:
        elapsed = sum(seconds.values()) if elapsed is None else elapsed
        span = max(now - self.last, elapsed) if self.last is not None else elapsed
        decay = math.exp(-span / self.window_s)
        for key in self.busy.keys() | seconds.keys():
            self.busy[key] = self.busy.get(key, 0.0) * decay + seconds.get(key, 0.0)
        self.total = self.total * decay + span
        self.last = now

    def share(self, key: K, now: float) -> float:
        if self.last is None:
            return 0.0
        idle = max(0.0, now - self.last)
        total = self.total * math.exp(-idle / self.window_s) + idle
        busy = self.busy.get(key, 0.0) * math.exp(-idle / self.window_s)
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
    held: int = 0  # KV cells the running sequences hold; grows with every token added
    # The sequences whose cells `held` counts (those running when the iteration began, and
    # those added since).
    counted: set[str] = field(default_factory=set)
    budget_s: float | None = None  # the time bound its background work was given
    after_other_s: float = 0.0  # other engines' time since the last LLM step (switch term)

    @property
    def token_room(self) -> int:
        return self.max_tokens - self.tokens

    @property
    def full(self) -> bool:
        return self.tokens >= self.max_tokens or len(self.chunks) >= self.max_seqs

    def predicted_s(
        self, prefill: int = 0, decodes: int = 0, context: int = 0, cells: int = 0
    ) -> float:
        """The iteration with `prefill` and `decodes` more, and `cells` more KV cells held
        (a new sequence's cached prefix, see `unheld`)."""
        return self.cost.llm_s(
            self.prefill + prefill,
            self.decodes + decodes,
            self.context + context,
            self.held + cells + prefill + decodes,
            self.after_other_s,
        )

    def unheld(self, request: Request) -> int:
        """KV cells `request` already holds that `held` does not count: a sequence that starts
        in this iteration from a cached prefix (Home Assistant's system prompt), whose cells its
        prompt's tokens attend to as much as to their own."""
        return 0 if request.id in self.counted else request.computed_tokens

    def prefill_room(self, budget_s: float | None, request: Request) -> int:
        """Tokens of `request`'s next prompt chunk that still fit both the token budget and
        the time budget."""
        if budget_s is None:
            return self.token_room
        fits = self.cost.prefill_tokens_within(
            budget_s,
            self.prefill,
            self.decodes,
            self.context,
            self.held + self.unheld(request),
            request.computed_tokens,
            self.after_other_s,
        )
        return min(self.token_room, fits)

    def chunk_fixed_s(self, request: Request) -> float:
        """What `request`'s next prompt chunk costs before its tokens do: the prompt kernels'
        fixed cost if it is the iteration's first prompt chunk, and its attention over the
        positions before it (the intercept of the chunk's cost against its length)."""
        position, cells = request.computed_tokens, self.unheld(request)
        now = self.predicted_s()
        one = self.predicted_s(prefill=1, context=position + 1, cells=cells)
        two = self.predicted_s(prefill=2, context=position + 2, cells=cells)
        return max(0.0, 2 * one - two - now)

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
        self.held += self.unheld(request) + num_tokens
        self.counted.add(request.id)
        if chunk.decode:
            self.decodes += 1
        else:
            self.prefill += num_tokens
        self.context += start + num_tokens
        return chunk

    @classmethod
    def after(cls, policy: Policy) -> IterationBuilder:
        """An empty iteration for `policy`'s next LLM step (after whatever engine ran last),
        holding the running sequences' cells."""
        return cls(
            policy.cost,
            policy.config.max_batch_tokens,
            policy.config.max_num_seqs,
            held=policy.held_tokens(),
            counted=set(policy.running),
            after_other_s=policy.after_other_s,
        )

    def plan(self, preempted: list[str]) -> LlmPlan:
        return LlmPlan(
            chunks=tuple(self.chunks),
            preempted=tuple(preempted),
            predicted_s=self.predicted_s(),
            context_tokens=self.context,
            held_tokens=self.held,
            budget_s=self.budget_s,
            after_other_s=self.after_other_s,
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
        self.share: DeviceShare[Priority] = DeviceShare(config.share_window_s)
        # (deadline, admission order, request): waiting requests that must have started by
        # then (rule 9).
        self._deadlines: list[tuple[float, int, Request]] = []
        self._admitted = itertools.count()
        # Other engines' step time on this loop since its last LLM step (the switch term).
        self.after_other_s = 0.0

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

    def capacity_tokens(self, priority: Priority) -> int:
        """The most KV positions (prompt + output) one request of this class may hold."""
        return self.kv.capacity_tokens

    def queue_limit(self, priority: Priority) -> float:
        """The most requests of this class that may wait at once (rule 9; none here)."""
        return math.inf

    def quick_refusal(self, priority: Priority) -> Admission | None:
        """A refusal known before the request is read further (its class's queue is full):
        the server answers it without rendering or tokenizing anything. None: go on."""
        limit = self.queue_limit(priority)
        if limit == math.inf:
            return None  # no limit: nothing to count
        waiting = self.waiting_count(priority)
        if waiting >= limit:
            return Admission(False, f"the {priority.label} queue is full ({waiting} waiting)")
        return None

    def _admission_refusal(self, request: Request, now: float) -> Admission | None:
        """A reason to refuse the request at once, or None to accept it (rule 9)."""
        return None

    def _charge(self, request: Request, tokens: float) -> None:  # noqa: B027
        """Account service to a request's client (fairness); the baseline keeps no counters."""

    def _account(self, plan: StepPlan, seconds: dict[Priority, float], now: float) -> None:  # noqa: B027
        """Hook for a policy that keeps its own record of where device time went."""

    # --- the shared contract ----------------------------------------------------------------

    def add(self, request: Request, now: float) -> Admission:
        """Admit a request to its queue, or refuse it with a reason."""
        if request.id in self.requests:
            return Admission(False, f"duplicate request id {request.id!r}", retryable=False)
        refusal = self._never_fits(request) or self._admission_refusal(request, now)
        if refusal is not None:
            return refusal
        request.status = Status.WAITING
        request.order = next(self._admitted)
        self.requests[request.id] = request
        self._enqueue(request, now)
        # A durable job's limit (NO_WAIT_LIMIT) never fires: it is not kept on the heap.
        limits = [
            s for s in (request.deadline_s, request.max_wait_s) if s is not None and s < math.inf
        ]
        if limits:
            deadline = request.arrival + min(limits)
            heapq.heappush(self._deadlines, (deadline, request.order, request))
        return Admission(True)

    def _never_fits(self, request: Request) -> Admission | None:
        """Rules 5 and 9: a turn whose prompt and reply cannot fit its class's share of the KV
        cache would wait forever; it is refused at once, and retrying cannot help."""
        if request.kind is not Kind.LLM:
            return None
        capacity = self.capacity_tokens(request.priority)
        needed = request.prompt_tokens + max(request.max_tokens, 1)
        if needed <= capacity:
            return None
        return Admission(
            False,
            f"{request.prompt_tokens} prompt tokens and up to {request.max_tokens} reply tokens "
            f"do not fit the {capacity} tokens a {request.priority.label} request may hold",
            retryable=False,
        )

    def heard(self, kind: Kind, priority: Priority, at: float) -> None:
        """An arrival before this policy began (the simulator replays a server's earlier
        requests): a policy that forecasts arrivals counts it; it schedules nothing."""
        return None

    def cancel(self, request_id: str, now: float) -> bool:
        """Drop a request wherever it is; a running sequence's KV is freed at once."""
        request = self.requests.get(request_id)
        if request is None:
            return False
        if request.status is Status.WAITING:
            self._dequeue(request)
        self._retire(request, Status.CANCELLED, now)
        return True

    def expire(self, now: float) -> list[Request]:
        """Rule 9: drop waiting requests whose deadline for starting has passed, and return them
        (the caller tells their clients at once instead of letting them wait on)."""
        expired: list[Request] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, request = heapq.heappop(self._deadlines)
            live = self.requests.get(request.id) is request
            if live and request.status is Status.WAITING and request.first_scheduled is None:
                self.cancel(request.id, now)
                expired.append(request)
        return expired

    def held_tokens(self) -> int:
        """KV cells the running sequences hold (what every token's attention is masked over)."""
        return sum(r.computed_tokens for r in self.running.values())

    def has_work(self) -> bool:
        return bool(self.requests)

    def update_from_output(self, plan: StepPlan, result: StepResult, now: float) -> list[Request]:
        """Apply one step's results; returns the requests that finished with it."""
        self.cost.observe(plan, result.elapsed_s)
        llm = plan.kind is Kind.LLM
        self.after_other_s = 0.0 if llm else self.after_other_s + result.elapsed_s
        seconds = class_seconds(plan, result.elapsed_s)
        self.share.record(seconds, now)
        self._account(plan, seconds, now)
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
        request.cached_tokens = 0  # the engine drops its cached prefix with the cells
        request.preemptions += 1
        self._requeue_preempted(request)

    def _victims(
        self, request: Request, batch: IterationBuilder, may_evict: Callable[[Request], bool]
    ) -> list[Request]:
        """Running sequences `request` may preempt, the first to go first: least urgent, then
        newest (vLLM's order). Never one already in this iteration."""
        victims = [
            r
            for r in self.running.values()
            if r.id not in batch.scheduled and r is not request and may_evict(r)
        ]
        victims.sort(key=lambda r: (r.priority, r.order), reverse=True)
        return victims

    def _make_room(
        self,
        request: Request,
        positions: int,
        batch: IterationBuilder,
        preempted: list[str],
        may_evict: Callable[[Request], bool],
        must_free: Request | None = None,
    ) -> bool:
        """Get KV for `positions` of `request`, preempting running sequences if needed
        (`must_free` goes in any case: the sequence slot it holds is needed).

        Nothing is preempted unless the victims together free enough: a failed attempt leaves
        the state as it was.
        """
        tokens = request.kv_tokens(positions)
        missing = self.kv.extra_blocks(request.id, tokens) - self.kv.free_blocks
        chosen: list[Request] = []
        if must_free is not None:
            chosen.append(must_free)
            missing -= self.kv.held.get(must_free.id, 0)
        if missing > 0:  # only then look for victims: most calls need no preemption at all
            for victim in self._victims(request, batch, may_evict):
                if victim is not must_free:
                    chosen.append(victim)
                    missing -= self.kv.held.get(victim.id, 0)
                if missing <= 0:
                    break
            if missing > 0:
                return False
        for victim in chosen:
            self._preempt(victim)
            preempted.append(victim.id)
        self.kv.grow(request.id, tokens)
        return True


def class_seconds(plan: StepPlan, elapsed_s: float) -> dict[Priority, float]:
    """Attribute a step's device time to classes, in proportion to the tokens each carried."""
    if isinstance(plan, EmbedPlan | SttPlan | TtsPlan):
        return {plan.priority: elapsed_s}
    weights: dict[Priority, float] = {}
    for chunk in plan.chunks:
        weights[chunk.priority] = weights.get(chunk.priority, 0.0) + chunk.num_tokens
    total = sum(weights.values())
    return {p: elapsed_s * w / total for p, w in weights.items()} if total else {}
