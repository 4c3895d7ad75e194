"""Fairlane's policy: lanes with explicit priority rules (DESIGN.md §3).

`schedule(now)` reads top to bottom: find the lanes with work, pick one by class (rules 1 and 8),
maybe hold a batch window (rule 7), then fill that lane's step within its budgets (rules 2–6).
Each rule lives in one helper whose docstring names it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fairlane.policy.base import IterationBuilder, Policy
from fairlane.policy.config import PolicyConfig
from fairlane.policy.cost import CostModel
from fairlane.policy.fairness import FairQueue
from fairlane.policy.plan import Admission, EmbedPlan, IdlePlan, Plan, StepPlan, SttPlan
from fairlane.policy.request import Kind, Priority, Request, Status

# Within one class the speech lane goes first (the speaker is waiting for the transcript before
# the LLM turn can even start), then the LLM, then embeddings.
LANE_ORDER = {Kind.STT: 0, Kind.LLM: 1, Kind.EMBED: 2}
INTERACTIVE = (Priority.VOICE, Priority.CHAT)


def as_urgent(request: Request) -> Callable[[Request], bool]:
    """A running sequence may evict sequences of its own class or a less urgent one: it never
    takes KV from more urgent work, and within a class the newest yields (so no deadlock)."""
    return lambda other: other.priority >= request.priority


def less_urgent(request: Request) -> Callable[[Request], bool]:
    """A new sequence may evict only strictly less urgent classes: interactive evicts
    background, never the reverse, and equals do not thrash each other."""
    return lambda other: other.priority > request.priority


@dataclass
class ArrivalRate:
    """Smoothed gap between arrivals on one lane: the forecast that batch windows rely on."""

    mean_gap: float | None = None
    last: float | None = None

    def observe(self, now: float) -> None:
        if self.last is not None:
            gap = max(0.0, now - self.last)
            self.mean_gap = gap if self.mean_gap is None else 0.7 * self.mean_gap + 0.3 * gap
        self.last = now

    def expected_next(self, now: float) -> float | None:
        if self.mean_gap is None or self.last is None:
            return None
        return max(now, self.last + self.mean_gap)


@dataclass(frozen=True)
class LaneChoice:
    kind: Kind
    priority: Priority
    budget_s: float | None  # a background step's time budget; None: bounded by batch limits


class FairlaneScheduler(Policy):
    name = "fairlane"

    def __init__(self, config: PolicyConfig, cost: CostModel) -> None:
        super().__init__(config, cost)
        self.waiting = {(k, p): FairQueue() for k in Kind for p in Priority}
        self.arrivals = {k: ArrivalRate() for k in Kind}
        self.lane_seconds = dict.fromkeys(Kind, 0.0)  # background device time per lane

    # --- queues ----------------------------------------------------------------------------

    def _enqueue(self, request: Request, now: float) -> None:
        self.waiting[request.kind, request.priority].push(request)
        self.arrivals[request.kind].observe(now)

    def _requeue_preempted(self, request: Request) -> None:
        self.waiting[request.kind, request.priority].push_front(request)

    def _dequeue(self, request: Request) -> bool:
        return self.waiting[request.kind, request.priority].remove(request)

    def waiting_count(self, priority: Priority | None = None) -> int:
        return sum(len(q) for (_, p), q in self.waiting.items() if priority in (None, p))

    def _charge(self, request: Request, tokens: float) -> None:
        self.waiting[request.kind, request.priority].charge(request.client, tokens)

    def _dispatch(self, request: Request, now: float) -> None:
        """A waiting request's first step: VTC charges its input once, not on recompute."""
        if not request.charged_input:
            request.charged_input = True
            self._charge(request, request.prompt_tokens * self.config.vtc_input_weight)
        self._start(request, now)

    # --- the step ----------------------------------------------------------------------------

    def schedule(self, now: float) -> Plan:
        """Decide the next device step."""
        pending = self._pending_lanes()
        if not pending:
            return IdlePlan()
        choice = self._pick_lane(pending, now)
        if len(pending) == 1:
            hold = self._hold_window(choice, now)
            if hold is not None:
                return hold
        if choice.kind is Kind.STT:
            return self._plan_stt(choice, now)
        if choice.kind is Kind.EMBED:
            return self._plan_embed(choice, now)
        return self._plan_llm(now, background_owed=choice.priority is Priority.BACKGROUND)

    def _pending_lanes(self) -> dict[Kind, Priority]:
        """Each lane with work, mapped to the most urgent class waiting or running on it."""
        pending: dict[Kind, Priority] = {}
        for (kind, priority), queue in self.waiting.items():
            if len(queue) and (kind not in pending or priority < pending[kind]):
                pending[kind] = priority
        for request in self.running.values():
            if Kind.LLM not in pending or request.priority < pending[Kind.LLM]:
                pending[Kind.LLM] = request.priority
        return pending

    def _pick_lane(self, pending: dict[Kind, Priority], now: float) -> LaneChoice:
        """Rules 1 and 8: the most urgent class decides, unless background is owed its share.

        Background is owed a slice when its oldest work has waited `background_max_wait_s` and its
        recent device share is below `background_min_share`. It also gets the slack an
        interactive stream leaves: the time before the next decode of that stream is due.
        """
        kind, priority = min(pending.items(), key=lambda kv: (kv[1], LANE_ORDER[kv[0]]))
        background = self._background_lanes()
        if priority is Priority.BACKGROUND or (background and self._background_owed(now)):
            # Between background lanes, the one that has had less device time goes next.
            lane = min(background, key=lambda k: (self.lane_seconds[k], LANE_ORDER[k]))
            return LaneChoice(lane, Priority.BACKGROUND, self.config.slice_s)
        if kind is Kind.LLM and Kind.EMBED in background:
            slack = self._decode_slack(now)
            if slack is not None and slack > self.cost.embed_s(self.config.min_prefill_chunk):
                return LaneChoice(Kind.EMBED, Priority.BACKGROUND, min(slack, self.config.slice_s))
        return LaneChoice(kind, priority, None)

    def _background_lanes(self) -> list[Kind]:
        lanes = [k for k in Kind if len(self.waiting[k, Priority.BACKGROUND])]
        if Kind.LLM not in lanes and any(
            r.priority is Priority.BACKGROUND for r in self.running.values()
        ):
            lanes.append(Kind.LLM)
        return lanes

    def _background_owed(self, now: float) -> bool:
        """Rule 8: the progress guarantee."""
        arrivals = [
            a
            for k in Kind
            if (a := self.waiting[k, Priority.BACKGROUND].oldest_arrival()) is not None
        ]
        arrivals += [r.arrival for r in self.running.values() if r.priority is Priority.BACKGROUND]
        if not arrivals or now - min(arrivals) < self.config.background_max_wait_s:
            return False
        return self.share.share(Priority.BACKGROUND, now) < self.config.background_min_share

    def _decode_slack(self, now: float) -> float | None:
        """Seconds a background step may take before the next interactive decode is due.

        Only when the interactive LLM work is decodes alone: a waiting or half-prefilled prompt
        wants the device now (its TTFT is running).
        """
        if any(len(self.waiting[Kind.LLM, p]) for p in INTERACTIVE):
            return None
        due: list[float] = []
        decodes = context = 0
        for request in self.running.values():
            if not request.priority.interactive:
                continue
            budget = self.config.itl_budget_s(request.priority)
            if not request.is_decode or request.last_token_at is None or budget is None:
                return None
            due.append(request.last_token_at + budget)
            decodes += 1
            context += request.computed_tokens
        if not due:
            return None
        return min(due) - now - self.cost.llm_s(0, decodes, context)

    def _hold_window(self, choice: LaneChoice, now: float) -> IdlePlan | None:
        """Rule 7: a batching lane waits for more work only when waiting is predicted to pay.

        It pays when the device is otherwise idle (the caller checks), the next arrival is
        forecast inside the class window, and the fixed step cost it would share is larger than
        the wait it adds to the requests already queued.
        """
        if choice.kind is Kind.LLM:
            return None  # sequences join a running LLM batch between iterations anyway
        queue = self.waiting[choice.kind, choice.priority]
        oldest = queue.oldest_arrival()
        window_s = self.config.batch_window_ms[choice.priority] / 1000.0
        max_batch = (
            self.config.stt_max_batch if choice.kind is Kind.STT else self.config.embed_max_batch
        )
        if oldest is None or window_s <= 0 or len(queue) >= max_batch:
            return None
        close = oldest + window_s
        expected = self.arrivals[choice.kind].expected_next(now)
        if now >= close or expected is None or expected > close:
            return None
        if (expected - now) * len(queue) >= self.cost.fixed_s(choice.kind):
            return None
        return IdlePlan(wake_at=close, reason="batch window")

    # --- speech and embedding steps ----------------------------------------------------------

    def _plan_stt(self, choice: LaneChoice, now: float) -> SttPlan:
        """One batch of utterances of one class; a background batch stays within its slice."""
        queue = self.waiting[Kind.STT, choice.priority]
        taken: list[Request] = []
        audio_s = 0.0
        while len(taken) < self.config.stt_max_batch and (request := queue.peek()) is not None:
            cost = self.cost.stt_s(len(taken) + 1, audio_s + request.audio_s)
            if taken and choice.budget_s is not None and cost > choice.budget_s:
                break
            queue.pop()
            self._dispatch(request, now)
            taken.append(request)
            audio_s += request.audio_s
        return SttPlan(
            request_ids=tuple(r.id for r in taken),
            priority=choice.priority,
            audio_s=audio_s,
            predicted_s=self.cost.stt_s(len(taken), audio_s),
        )

    def _plan_embed(self, choice: LaneChoice, now: float) -> EmbedPlan:
        """One micro-batch in a padded-token budget (rule 2), texts of similar length together.

        The head of the fair queue always goes; the rest are picked from the next few in service
        order by closeness in length to it, which cuts padding without starving long texts.
        """
        cfg = self.config
        queue = self.waiting[Kind.EMBED, choice.priority]
        token_budget = cfg.embed_max_batch_tokens
        if choice.budget_s is not None:
            token_budget = min(token_budget, self.cost.embed_tokens_within(choice.budget_s))
        candidates = queue.in_service_order(4 * cfg.embed_max_batch)
        head = candidates[0]
        candidates.sort(key=lambda r: (abs(r.prompt_tokens - head.prompt_tokens), r.arrival))
        batch: list[Request] = []
        longest = 0
        for request in candidates:
            if len(batch) >= cfg.embed_max_batch:
                break
            padded = max(longest, request.prompt_tokens) * (len(batch) + 1)
            if batch and padded > token_budget:
                continue
            batch.append(request)
            longest = max(longest, request.prompt_tokens)
        for request in batch:
            queue.remove(request)
            self._dispatch(request, now)
        batch.sort(key=lambda r: r.prompt_tokens)
        return EmbedPlan(
            request_ids=tuple(r.id for r in batch),
            priority=choice.priority,
            padded_tokens=longest * len(batch),
            predicted_s=self.cost.embed_s(longest * len(batch)),
        )

    # --- the LLM iteration -------------------------------------------------------------------

    def _plan_llm(self, now: float, background_owed: bool) -> Plan:
        """Rules 3–5: running decodes, then prefill chunks, within token, time and KV budgets."""
        batch = IterationBuilder(self.cost, self.config.max_batch_tokens, self.config.max_num_seqs)
        preempted: list[str] = []
        self._schedule_interactive_decodes(batch, preempted)
        itl_limits = self._itl_limits(batch)
        self._schedule_interactive_prefills(batch, preempted, itl_limits, now)
        # Background rides along only in an iteration that carries no interactive prompt (its
        # TTFT is running) and only while the iteration keeps every interactive ITL target and
        # the slice; when background is owed its share (rule 8), only the slice bounds it.
        carries_prompt = any(c.priority.interactive and not c.decode for c in batch.chunks)
        if background_owed or not carries_prompt:
            limit_s = self.config.slice_s
            itl_limit = itl_limits[Priority.BACKGROUND]
            if not background_owed and itl_limit is not None:
                limit_s = min(limit_s, itl_limit)
            self._schedule_background(batch, preempted, limit_s, now)
        if not batch.chunks:
            return IdlePlan(reason="waiting for KV space")
        return batch.plan(preempted)

    def _itl_limits(self, batch: IterationBuilder) -> dict[Priority, float | None]:
        """For each class, the tightest ITL budget among decodes of that class or a more urgent one.

        A prefill chunk of class C must keep the ITL of decodes of C and of classes above C; it
        may slow decodes of less urgent classes.
        """
        limits: dict[Priority, float | None] = {}
        tightest: float | None = None
        for priority in Priority:
            for chunk in batch.chunks:
                budget = self.config.itl_budget_s(priority)
                if chunk.decode and chunk.priority is priority and budget is not None:
                    tightest = budget if tightest is None else min(tightest, budget)
                    break
            limits[priority] = tightest
        return limits

    def _by_urgency(self, interactive: bool) -> list[Request]:
        return sorted(
            (r for r in self.running.values() if r.priority.interactive is interactive),
            key=lambda r: (r.priority, r.arrival),
        )

    def _schedule_interactive_decodes(self, batch: IterationBuilder, preempted: list[str]) -> None:
        """Every interactive stream gets its next token in every iteration (rule 3)."""
        for request in self._by_urgency(interactive=True):
            if batch.full:
                return
            if request.status is Status.RUNNING and request.is_decode:
                tokens = request.computed_tokens + 1
                if self._make_room(request, tokens, batch, preempted, as_urgent(request)):
                    batch.add(request, 1)

    def _schedule_interactive_prefills(
        self,
        batch: IterationBuilder,
        preempted: list[str],
        itl_limits: dict[Priority, float | None],
        now: float,
    ) -> None:
        """Rule 4 for interactive prompts: half-done ones first, then new ones by class and VTC."""
        for request in self._by_urgency(interactive=True):
            if request.status is Status.RUNNING and not request.is_decode:
                self._add_prefill(request, batch, preempted, itl_limits[request.priority])
        for priority in INTERACTIVE:
            queue = self.waiting[Kind.LLM, priority]
            while (waiting := queue.peek()) is not None and self._seq_slot_free(batch):
                if not self._add_prefill(waiting, batch, preempted, itl_limits[priority], now):
                    break

    def _schedule_background(
        self, batch: IterationBuilder, preempted: list[str], limit_s: float, now: float
    ) -> None:
        """Background decodes, then background prefill, while the iteration fits in `limit_s`."""
        running = self._by_urgency(interactive=False)
        for request in running:
            if batch.full:
                return
            if request.status is not Status.RUNNING or not request.is_decode:
                continue
            extra = batch.predicted_s(decodes=1, context=request.computed_tokens + 1)
            if batch.chunks and extra > limit_s:
                return
            tokens = request.computed_tokens + 1
            if self._make_room(request, tokens, batch, preempted, as_urgent(request)):
                batch.add(request, 1)
        prefilling = [r for r in running if r.status is Status.RUNNING and not r.is_decode]
        for request in prefilling:
            if not self._add_prefill(request, batch, preempted, limit_s):
                return
        queue = self.waiting[Kind.LLM, Priority.BACKGROUND]
        reserve = int(self.config.kv_watermark * self.kv.num_blocks)
        while (waiting := queue.peek()) is not None and self._seq_slot_free(batch):
            # Rule 5: a background prompt is admitted only when all of it fits beside the
            # watermark, so it will not be preempted by the next interactive arrival at once.
            if not self.kv.can_hold(waiting.id, waiting.target_tokens, reserve):
                return
            if not self._add_prefill(waiting, batch, preempted, limit_s, now):
                return

    def _seq_slot_free(self, batch: IterationBuilder) -> bool:
        return not batch.full and len(self.running) < self.config.max_num_seqs

    def _add_prefill(
        self,
        request: Request,
        batch: IterationBuilder,
        preempted: list[str],
        budget_s: float | None,
        now: float | None = None,
    ) -> bool:
        """Add the largest chunk of `request`'s prompt that the budgets allow.

        Progress is guaranteed: the first interactive prompt of an iteration, or anything in an
        otherwise empty one, gets at least `min_prefill_chunk` tokens even when the decodes
        already fill the time budget. `now` is given for a waiting request.
        """
        room = batch.prefill_room(budget_s)
        if room < self.config.min_prefill_chunk:
            guaranteed = not batch.chunks or (request.priority.interactive and not batch.prefill)
            if not guaranteed:
                return False
            room = min(self.config.min_prefill_chunk, batch.token_room)
        num_tokens = min(request.remaining_prefill, room)
        if num_tokens <= 0:
            return False
        if request.status is Status.WAITING:
            # A new sequence only takes KV from strictly less urgent classes.
            if not self._make_room(request, num_tokens, batch, preempted, less_urgent(request)):
                return False
            self.waiting[request.kind, request.priority].remove(request)
            assert now is not None
            self._dispatch(request, now)
        else:
            tokens = request.computed_tokens + num_tokens
            if not self._make_room(request, tokens, batch, preempted, as_urgent(request)):
                return False
        batch.add(request, num_tokens)
        return True

    # --- admission (rule 9) ------------------------------------------------------------------

    def _admission_refusal(self, request: Request, now: float) -> Admission | None:
        """Rule 9: refuse at once what cannot be served, with a reason a person can read."""
        priority = request.priority
        waiting = sum(len(self.waiting[k, priority]) for k in Kind)
        if waiting >= self.config.queue_limit[priority]:
            return Admission(False, f"the {priority.label} queue is full ({waiting} waiting)")
        if request.kind is Kind.LLM:
            needed = request.prompt_tokens + 1
            if self.kv.blocks_for(needed) > self.kv.num_blocks:
                return Admission(
                    False,
                    f"prompt of {request.prompt_tokens} tokens does not fit the KV cache "
                    f"({self.kv.capacity_tokens} tokens)",
                )
        deadline_ms = self.config.deadline_ms[priority]
        deadline_s = request.deadline_s
        if deadline_s is None and deadline_ms is not None:
            deadline_s = deadline_ms / 1000.0
        if deadline_s is not None and priority.interactive:
            wait_s = self._predicted_wait(request)
            if wait_s > deadline_s:
                return Admission(
                    False,
                    f"predicted wait {wait_s * 1000:.0f} ms exceeds the "
                    f"{deadline_s * 1000:.0f} ms deadline of this {priority.label} request",
                    predicted_wait_s=wait_s,
                )
        return None

    def _predicted_wait(self, request: Request) -> float:
        """Time until the request's first output, from the work queued ahead of it."""
        ahead = [
            r
            for (kind, p), q in self.waiting.items()
            if kind is request.kind and p <= request.priority
            for r in q
        ]
        in_flight = self.config.slice_s  # the step running now finishes first
        if request.kind is Kind.STT:
            batches = -(-(len(ahead) + 1) // self.config.stt_max_batch)
            return in_flight + batches * self.cost.stt_s(self.config.stt_max_batch, 0.0)
        if request.kind is Kind.EMBED:
            tokens = sum(r.prompt_tokens for r in ahead) + request.prompt_tokens
            return in_flight + self.cost.embed_s(tokens)
        prefill = sum(r.remaining_prefill for r in ahead) + request.prompt_tokens
        prefill += sum(
            r.remaining_prefill
            for r in self.running.values()
            if r.priority <= request.priority and not r.is_decode
        )
        decodes = sum(1 for r in self.running.values() if r.priority.interactive)
        iterations = max(1, -(-prefill // self.config.max_batch_tokens))
        return in_flight + self.cost.llm_s(prefill, decodes * iterations, 0)

    def _account(self, plan: StepPlan, seconds: dict[Priority, float]) -> None:
        """Keep each lane's background device time: it rotates the background lanes."""
        self.lane_seconds[plan.kind] += seconds.get(Priority.BACKGROUND, 0.0)
