"""Fairlane's policy: lanes with explicit priority rules (DESIGN.md §3).

`schedule(now)` reads top to bottom: rank the lanes that have work (rules 1 and 8), maybe hold
a batch window when only one class is waiting (rule 7), then build the first ranked lane's step
that can run within its budgets (rules 2–6). A lane that cannot run now (no KV, no sequence
slot) never blocks the next one, so the device is never left idle while some work can run.
Each rule lives in one helper whose docstring names it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fairlane.policy.base import DeviceShare, IterationBuilder, Policy
from fairlane.policy.config import PolicyConfig
from fairlane.policy.cost import CostModel
from fairlane.policy.fairness import FairQueue
from fairlane.policy.plan import (
    Admission,
    EmbedPlan,
    IdlePlan,
    LlmPlan,
    Plan,
    StepPlan,
    SttPlan,
    TtsPlan,
)
from fairlane.policy.request import Kind, Priority, Request, Status

# Within one class the speech lane goes first (the speaker is waiting for the transcript before
# the LLM turn can even start), then speech synthesis (a finished sentence is what the person
# hears next; its text is already there), then the LLM, then embeddings.
LANE_ORDER = {Kind.STT: 0, Kind.TTS: 1, Kind.LLM: 2, Kind.EMBED: 3}
INTERACTIVE = (Priority.VOICE, Priority.CHAT)
# VTC's service unit for speech: Whisper's encoder makes 50 frames per second of audio.
STT_TOKENS_PER_AUDIO_S = 50.0


def as_urgent(request: Request) -> Callable[[Request], bool]:
    """A running sequence may evict a less urgent one, or a newer one of its own class: it never
    takes KV from more urgent work, and within a class the newest yields (so no deadlock)."""
    return lambda other: (
        other.priority > request.priority
        or (other.priority is request.priority and other.order > request.order)
    )


def less_urgent(request: Request) -> Callable[[Request], bool]:
    """A new sequence may evict only strictly less urgent classes: interactive evicts
    background, never the reverse, and equals do not thrash each other."""
    return lambda other: other.priority > request.priority


@dataclass
class ArrivalRate:
    """Arrivals of one lane and class: the smoothed gap inside a burst (what batch windows rely
    on; a gap longer than the class's window is the pause between bursts, not a rate), and the
    smoothed gap between any two arrivals (whether someone is still talking)."""

    window_s: float
    mean_gap: float | None = None
    mean_pause: float | None = None
    last: float | None = None

    def observe(self, now: float) -> None:
        if self.last is not None:
            gap = max(0.0, now - self.last)
            if gap <= self.window_s:
                self.mean_gap = _smooth(self.mean_gap, gap)
            self.mean_pause = _smooth(self.mean_pause, gap)
        self.last = now

    def active(self, now: float) -> bool:
        """Arrivals are still coming: the last one is recent next to the usual pause."""
        if self.last is None or self.mean_pause is None:
            return False
        return now - self.last <= 2 * self.mean_pause

    def expected_next(self, now: float) -> float | None:
        """When the next arrival is due; None without a forecast or when it is overdue (the
        burst is over: waiting for it would hold the device idle for nothing)."""
        if self.mean_gap is None or self.last is None:
            return None
        expected = self.last + self.mean_gap
        return None if expected < now else expected


@dataclass(frozen=True)
class LaneChoice:
    kind: Kind
    priority: Priority
    budget_s: float | None  # a background step's time budget; None: bounded by batch limits
    owed: bool = False  # rule 8: a background slice taken ahead of interactive work


class FairlaneScheduler(Policy):
    name = "fairlane"

    def __init__(self, config: PolicyConfig, cost: CostModel) -> None:
        super().__init__(config, cost)
        self.waiting = {(k, p): FairQueue() for k in Kind for p in Priority}
        self.arrivals = {
            (k, p): ArrivalRate(config.batch_window_ms[p] / 1000.0) for k in Kind for p in Priority
        }
        # Background device time per lane, decayed: it rotates the background lanes (rule 8).
        self.lane_share: DeviceShare[Kind] = DeviceShare(config.share_window_s)
        self.last_interactive_end: float | None = None

    # --- queues ----------------------------------------------------------------------------

    def _enqueue(self, request: Request, now: float) -> None:
        self.waiting[request.kind, request.priority].push(request)
        self.arrivals[request.kind, request.priority].observe(now)

    def _requeue_preempted(self, request: Request) -> None:
        self.waiting[request.kind, request.priority].push_front(request)

    def _dequeue(self, request: Request) -> bool:
        return self.waiting[request.kind, request.priority].remove(request)

    def waiting_count(self, priority: Priority | None = None) -> int:
        return sum(len(q) for (_, p), q in self.waiting.items() if priority in (None, p))

    def _charge(self, request: Request, tokens: float) -> None:
        self.waiting[request.kind, request.priority].charge(request.client, tokens)

    def _dispatch(self, request: Request, now: float) -> None:
        """A waiting request's first step: it leaves its queue (the VTC floor moves to its
        client) and VTC charges its input once, not on recompute."""
        charge = 0.0
        if not request.charged_input:
            request.charged_input = True
            size = max(request.prompt_tokens, request.audio_s * STT_TOKENS_PER_AUDIO_S)
            charge = size * self.config.vtc_input_weight
        self.waiting[request.kind, request.priority].take(request, charge)
        self._start(request, now)

    def capacity_tokens(self, priority: Priority) -> int:
        return self.config.capacity_tokens(priority)

    # --- the step ----------------------------------------------------------------------------

    def schedule(self, now: float) -> Plan:
        """Decide the next device step."""
        choices = self._lane_choices(now)
        if not choices:
            return IdlePlan()
        if len(self._ready_queues()) == 1 and not self.running:
            hold = self._hold_window(choices[0], now)
            if hold is not None:
                return hold
        for choice in choices:
            plan = self._plan(choice, now)
            if plan is not None:
                return plan
        # Unreachable: admission guarantees every request fits alone, so some lane can always
        # run (the property tests drive the policy into every corner to check it). Should it
        # happen, ask again after a slice rather than leave the device stopped.
        return IdlePlan(wake_at=now + self.config.slice_s, reason="no lane can run")

    def _plan(self, choice: LaneChoice, now: float) -> StepPlan | None:
        if choice.kind is Kind.STT:
            return self._plan_stt(choice, now)
        if choice.kind is Kind.EMBED:
            return self._plan_embed(choice, now)
        if choice.kind is Kind.TTS:
            return self._plan_tts(choice, now)
        return self._plan_llm(choice, now)

    def _ready_queues(self) -> list[tuple[Kind, Priority]]:
        return [key for key, queue in self.waiting.items() if len(queue)]

    def _pending_lanes(self) -> dict[Kind, Priority]:
        """Each lane with work, mapped to the most urgent class waiting or running on it."""
        pending: dict[Kind, Priority] = {}
        for kind, priority in self._ready_queues():
            if kind not in pending or priority < pending[kind]:
                pending[kind] = priority
        for request in self.running.values():
            if Kind.LLM not in pending or request.priority < pending[Kind.LLM]:
                pending[Kind.LLM] = request.priority
        return pending

    def _lane_choices(self, now: float) -> list[LaneChoice]:
        """Rules 1 and 8: the lanes in the order they should get the device.

        Background owed its share (rule 8) comes first, its lanes by least recent device time;
        then an embedding step that fits the slack before the next interactive decode is due;
        then every lane by its most urgent class: interactive lanes speech before the LLM,
        background lanes by least recent device time (documents keep being indexed while
        summaries run, and the other way round).
        """
        pending = self._pending_lanes()
        if not pending:
            return []

        def rank(lane: tuple[Kind, Priority]) -> tuple[Priority, float, int]:
            kind, priority = lane
            share = 0.0 if priority.interactive else self.lane_share.share(kind, now)
            return priority, share, LANE_ORDER[kind]

        ranked = sorted(pending.items(), key=rank)
        background = self._background_lanes()
        choices: list[LaneChoice] = []
        if background and ranked[0][1].interactive and self._background_owed(now):
            for lane in sorted(background, key=lambda k: (self.lane_share.share(k, now), k.value)):
                choices.append(LaneChoice(lane, Priority.BACKGROUND, self.config.slice_s, True))
        kind, priority = ranked[0]
        if kind is Kind.LLM and priority.interactive and Kind.EMBED in background:
            slack = self._decode_slack(now)
            if slack is not None and slack > self.cost.embed_s(self.config.min_prefill_chunk):
                choices.append(
                    LaneChoice(Kind.EMBED, Priority.BACKGROUND, min(slack, self.config.slice_s))
                )
        background_budget = self._background_budget(now)
        for kind, priority in ranked:
            budget = None if priority.interactive else background_budget
            choices.append(LaneChoice(kind, priority, budget))
        return choices

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

    def _background_budget(self, now: float) -> float:
        """Rules 2 and 14: how long a background step may run.

        `slice_ms` while interactive work is running or waiting, or its arrivals are still
        coming (the last one is recent next to the usual pause between them); with none of that
        the step may grow to `arrival_wait_s` (the longest step an interactive arrival can wait
        for and still meet its target), so background work runs in efficient batches when
        nobody is talking.
        """
        interactive_busy = any(r.priority.interactive for r in self.running.values()) or any(
            len(q) for (_, p), q in self.waiting.items() if p.interactive
        )
        forecast = any(rate.active(now) for (_, p), rate in self.arrivals.items() if p.interactive)
        if interactive_busy or forecast or self._turn_continues(now):
            return self.config.slice_s
        return self.config.arrival_wait_s

    def _turn_continues(self, now: float) -> bool:
        """Rule 14: an interactive request just finished, and its turn's next request is due
        within moments (the agent's model call after a transcript, the next call after a tool
        result, the spoken reply after the text)."""
        last = self.last_interactive_end
        return last is not None and now - last < self.config.turn_gap_s

    def _decode_slack(self, now: float) -> float | None:
        """Seconds a background step may take before the next interactive decode is due.

        Only when the interactive LLM work is chat decodes alone: a waiting or half-prefilled
        prompt wants the device now (its TTFT is running), and a voice reply's slack
        (`voice_pace`) is smaller than what the step of another engine reliably takes.
        """
        if any(len(self.waiting[Kind.LLM, p]) for p in INTERACTIVE):
            return None
        due: list[float] = []
        decodes = context = 0
        for request in self.running.values():
            if request.priority is Priority.VOICE:
                return None
            if not request.priority.interactive:
                continue
            budget = self._itl_budget(request)
            if not request.is_decode or request.last_token_at is None or budget is None:
                return None
            due.append(request.last_token_at + budget)
            decodes += 1
            context += request.computed_tokens
        if not due:
            return None
        return min(due) - now - self.cost.llm_s(0, decodes, context)

    def _itl_budget(self, request: Request) -> float | None:
        """Rule 4: how long after a stream's last token its next may come.

        The class's ITL target (less headroom); for voice also no more than `voice_pace` times
        what the stream's own decode step costs alone: text that is read keeps pace with a
        reader, but text that is spoken waits for whole sentences, so every token's delay
        delays what the person hears.
        """
        budget = self.config.itl_budget_s(request.priority)
        if request.priority is Priority.VOICE and budget is not None:
            alone = self.cost.llm_s(0, 1, request.computed_tokens)
            budget = min(budget, self.config.voice_pace * alone)
        return budget

    def _hold_window(self, choice: LaneChoice, now: float) -> IdlePlan | None:
        """Rule 7: a batching lane waits for more work only when waiting is predicted to pay.

        It pays when the device is otherwise idle (the caller checks that this lane and class
        is the only work), the next arrival of the same lane and class is forecast inside the
        class window, and the fixed step cost the newcomer would share is larger than what
        holding adds: the wait, for the n queued and the newcomer, and the newcomer's own share
        of the batch, for the n queued. (Total time to result falls when
        (n + 1) · wait + n · per-item cost < fixed cost.)
        """
        if choice.kind in (Kind.LLM, Kind.TTS):
            # Sequences join a running LLM batch between iterations anyway; a reply's sentences
            # come one by one as the LLM writes them, so waiting for the next pays nothing.
            return None
        queue = self.waiting[choice.kind, choice.priority]
        oldest = queue.oldest_arrival()
        window_s = self.config.batch_window_ms[choice.priority] / 1000.0
        max_batch = (
            self.config.stt_max_batch if choice.kind is Kind.STT else self.config.embed_max_batch
        )
        if oldest is None or window_s <= 0 or len(queue) >= max_batch:
            return None
        close = oldest + window_s
        expected = self.arrivals[choice.kind, choice.priority].expected_next(now)
        if now >= close or expected is None or not now < expected <= close:
            return None
        waiting = list(queue)
        if choice.kind is Kind.STT:
            audio = sum(r.audio_s for r in waiting)
            mean = audio / len(waiting)
            per_item = self.cost.stt_s(len(waiting) + 1, audio + mean) - self.cost.stt_s(
                len(waiting), audio
            )
        else:
            longest = max(r.prompt_tokens for r in waiting)
            per_item = self.cost.embed_s(longest * (len(waiting) + 1)) - self.cost.embed_s(
                longest * len(waiting)
            )
        added = (len(waiting) + 1) * (expected - now) + len(waiting) * per_item
        if added >= self.cost.fixed_s(choice.kind):
            return None
        # Wake when the arrival is due: if it has not come by then, the forecast is overdue
        # and the queue runs without it.
        return IdlePlan(wake_at=min(close, expected), reason="batch window")

    # --- speech and embedding steps ----------------------------------------------------------

    def _plan_stt(self, choice: LaneChoice, now: float) -> SttPlan | None:
        """One batch of utterances of one class; a background batch stays within its slice."""
        queue = self.waiting[Kind.STT, choice.priority]
        taken: list[Request] = []
        audio_s = 0.0
        while len(taken) < self.config.stt_max_batch and (request := queue.peek()) is not None:
            cost = self.cost.stt_s(len(taken) + 1, audio_s + request.audio_s)
            if taken and choice.budget_s is not None and cost > choice.budget_s:
                break
            self._dispatch(request, now)
            taken.append(request)
            audio_s += request.audio_s
        if not taken:
            return None
        return SttPlan(
            request_ids=tuple(r.id for r in taken),
            priority=choice.priority,
            audio_s=audio_s,
            predicted_s=self.cost.stt_s(len(taken), audio_s),
        )

    def _plan_tts(self, choice: LaneChoice, now: float) -> TtsPlan | None:
        """Sentences to speak, oldest (by VTC) first; each is one bounded unit of work."""
        queue = self.waiting[Kind.TTS, choice.priority]
        taken: list[Request] = []
        longest = 0
        while len(taken) < self.config.tts_max_batch and (request := queue.peek()) is not None:
            cost = self.cost.tts_s(max(longest, request.prompt_tokens) * (len(taken) + 1))
            if taken and choice.budget_s is not None and cost > choice.budget_s:
                break
            self._dispatch(request, now)
            taken.append(request)
            longest = max(longest, request.prompt_tokens)
        if not taken:
            return None
        return TtsPlan(
            request_ids=tuple(r.id for r in taken),
            priority=choice.priority,
            phonemes=longest * len(taken),
            predicted_s=self.cost.tts_s(longest * len(taken)),
        )

    def _plan_embed(self, choice: LaneChoice, now: float) -> EmbedPlan | None:
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
        if not candidates:
            return None
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
            self._dispatch(request, now)
        batch.sort(key=lambda r: r.prompt_tokens)
        return EmbedPlan(
            request_ids=tuple(r.id for r in batch),
            priority=choice.priority,
            padded_tokens=longest * len(batch),
            predicted_s=self.cost.embed_s(longest * len(batch)),
        )

    # --- the LLM iteration -------------------------------------------------------------------

    def _plan_llm(self, choice: LaneChoice, now: float) -> LlmPlan | None:
        """Rules 3–5: running decodes, then prefill chunks, within token, time and KV budgets.

        A step owed to background (rule 8) carries background work and the interactive decodes
        (they never miss a token), but no interactive prompt: it is background's slice.
        """
        batch = IterationBuilder(self.cost, self.config.max_batch_tokens, self.config.max_num_seqs)
        preempted: list[str] = []
        if choice.owed:
            decodes = [r for r in self._by_urgency(interactive=True) if r.is_decode]
            decode_cost = self.cost.llm_s(0, len(decodes), 0) - self.cost.llm_s(0, 0, 0)
            self._schedule_background(batch, preempted, self.config.slice_s - decode_cost, now)
            if not batch.chunks:
                return None  # background cannot run on this lane now: the next lane may
            self._schedule_interactive_decodes(batch, preempted)
            return batch.plan(preempted)
        self._schedule_interactive_decodes(batch, preempted)
        itl_limits = self._itl_limits(batch, now)
        self._schedule_interactive_prefills(batch, preempted, itl_limits, now)
        # Background rides along only in an iteration that carries no interactive prompt (its
        # TTFT is running) and only while the iteration still delivers every interactive token
        # when it is due; with no interactive work, the lane's budget bounds it.
        carries_prompt = any(c.priority.interactive and not c.decode for c in batch.chunks)
        if not carries_prompt:
            limit_s = _min(itl_limits[Priority.BACKGROUND], choice.budget_s or self.config.slice_s)
            self._schedule_background(batch, preempted, limit_s, now)
        if not batch.chunks:
            return None
        return batch.plan(preempted)

    def _itl_limits(self, batch: IterationBuilder, now: float) -> dict[Priority, float | None]:
        """For each class, how long this iteration may run and still deliver, on time, the next
        token of every decode of that class or a more urgent one (rule 4).

        The time is counted from each stream's last token, not from now: time already spent
        since then (an embedding step in the slack) is not spent twice.
        """
        remaining: dict[Priority, float] = {}
        for chunk in batch.chunks:
            request = self.requests[chunk.request_id]
            budget = self._itl_budget(request)
            if not chunk.decode or budget is None or request.last_token_at is None:
                continue
            left = request.last_token_at + budget - now
            remaining[chunk.priority] = min(remaining.get(chunk.priority, left), left)
        limits: dict[Priority, float | None] = {}
        tightest: float | None = None
        for priority in Priority:
            if priority in remaining:
                left = remaining[priority]
                tightest = left if tightest is None else min(tightest, left)
            limits[priority] = tightest
        return limits

    def _by_urgency(self, interactive: bool) -> list[Request]:
        return sorted(
            (r for r in self.running.values() if r.priority.interactive is interactive),
            key=lambda r: (r.priority, r.order),
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
        """Rule 4 for interactive prompts: half-done ones first, then new ones by class and VTC.

        An interactive prompt is chunked too, to `arrival_wait_s`: a voice command that arrives
        during a chat prompt's prefill waits for one chunk, not the whole prompt.
        """
        wait_s = self.config.arrival_wait_s
        for request in self._by_urgency(interactive=True):
            if request.status is Status.RUNNING and not request.is_decode:
                limit = _min(itl_limits[request.priority], wait_s)
                self._add_prefill(request, batch, preempted, limit)
        for priority in INTERACTIVE:
            queue = self.waiting[Kind.LLM, priority]
            limit = _min(itl_limits[priority], wait_s)
            while (waiting := queue.peek()) is not None and waiting.id not in preempted:
                if not self._add_prefill(waiting, batch, preempted, limit, now):
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
        reserve = self.config.kv_reserve_blocks
        while (waiting := queue.peek()) is not None and waiting.id not in preempted:
            # Rule 5: a background prompt starts only when all of it fits beside the
            # watermark, so the next interactive arrival does not preempt it at once. (It
            # always can eventually: admission refused any that could never fit.)
            if not self.kv.can_hold(waiting.id, waiting.kv_tokens(waiting.target_tokens), reserve):
                return
            if not self._add_prefill(waiting, batch, preempted, limit_s, now):
                return

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
        already fill the time budget. `now` is given for a waiting request, which also needs a
        sequence slot: an interactive one takes a background sequence's slot (rule 5).
        """
        room = batch.prefill_room(budget_s)
        if room < self.config.min_prefill_chunk:
            guaranteed = not batch.chunks or (request.priority.interactive and not batch.prefill)
            if not guaranteed:
                return False
            room = min(self.config.min_prefill_chunk, batch.token_room)
        num_tokens = min(request.remaining_prefill, room)
        if num_tokens <= 0 or (request.status is Status.WAITING and batch.full):
            return False
        positions = request.computed_tokens + num_tokens
        if request.status is Status.WAITING:
            # A new sequence only takes KV, or a slot, from strictly less urgent classes.
            slot_victim: Request | None = None
            if len(self.running) >= self.config.max_num_seqs:
                victims = self._victims(request, batch, less_urgent(request))
                if not victims:
                    return False
                slot_victim = victims[0]
            if not self._make_room(
                request, positions, batch, preempted, less_urgent(request), slot_victim
            ):
                return False
            assert now is not None
            self._dispatch(request, now)
        elif not self._make_room(request, positions, batch, preempted, as_urgent(request)):
            return False
        batch.add(request, num_tokens)
        return True

    # --- admission (rule 9) ------------------------------------------------------------------

    def _admission_refusal(self, request: Request, now: float) -> Admission | None:
        """Rule 9: refuse at once what cannot be served in time, with a reason a person can
        read. (A request too large ever to fit was refused before this, for good.)"""
        priority = request.priority
        full = self.quick_refusal(priority)
        if full is not None:
            return full
        deadline_ms = self.config.deadline_ms[priority]
        if request.deadline_s is None and deadline_ms is not None:
            request.deadline_s = deadline_ms / 1000.0
        max_wait_ms = self.config.max_wait_ms[priority]
        if request.max_wait_s is None and max_wait_ms is not None:
            request.max_wait_s = max_wait_ms / 1000.0
        if request.deadline_s is not None and priority.interactive:
            wait_s = self._predicted_wait(request)
            if wait_s > request.deadline_s:
                return Admission(
                    False,
                    f"predicted wait {wait_s * 1000:.0f} ms exceeds the "
                    f"{request.deadline_s * 1000:.0f} ms deadline of this {priority.label} request",
                    predicted_wait_s=wait_s,
                )
        return None

    def queue_limit(self, priority: Priority) -> float:
        return self.config.queue_limit[priority]

    def _predicted_wait(self, request: Request) -> float:
        """Time until the request's first output: the step in flight, then the work of its lane
        queued ahead of it, in the batches it will really run in."""
        ahead = [
            r
            for (kind, p), q in self.waiting.items()
            if kind is request.kind and p <= request.priority
            for r in q
        ]
        in_flight = self.config.slice_s if self.has_work() else 0.0
        if request.kind is Kind.STT:
            utterances = [r.audio_s for r in ahead] + [request.audio_s]
            size = self.config.stt_max_batch
            groups = [utterances[i : i + size] for i in range(0, len(utterances), size)]
            return in_flight + sum(self.cost.stt_s(len(g), sum(g)) for g in groups)
        if request.kind is Kind.TTS:
            return in_flight + sum(self.cost.tts_s(r.prompt_tokens) for r in [*ahead, request])
        if request.kind is Kind.EMBED:
            tokens = sum(r.prompt_tokens for r in ahead) + request.prompt_tokens
            batches = math.ceil(tokens / self.config.embed_max_batch_tokens)
            return (
                in_flight
                + self.cost.embed_s(tokens)
                + (batches - 1) * self.cost.fixed_s(Kind.EMBED)
            )
        prefill = sum(r.remaining_prefill for r in ahead) + request.remaining_prefill
        prefill += sum(
            r.remaining_prefill
            for r in self.running.values()
            if r.priority <= request.priority and not r.is_decode
        )
        decodes = sum(1 for r in self.running.values() if r.priority.interactive)
        chunk = min(
            self.config.max_batch_tokens,
            max(
                self.config.min_prefill_chunk,
                self.cost.prefill_tokens_within(self.config.arrival_wait_s, 0, decodes, 0),
            ),
        )
        iterations = max(1, math.ceil(prefill / chunk))
        per_iteration = self.cost.llm_s(0, decodes, 0)
        return (
            in_flight
            + iterations * per_iteration
            + self.cost.llm_s(prefill, 0, 0)
            - (self.cost.llm_s(0, 0, 0))
        )

    def _retire(self, request: Request, status: Status, now: float) -> None:
        super()._retire(request, status, now)
        if status is Status.FINISHED and request.priority.interactive:
            self.last_interactive_end = now

    def _account(self, plan: StepPlan, seconds: dict[Priority, float], now: float) -> None:
        """Keep each lane's background device time: it rotates the background lanes."""
        elapsed = sum(seconds.values())
        self.lane_share.record({plan.kind: seconds.get(Priority.BACKGROUND, 0.0)}, now, elapsed)


def _smooth(mean: float | None, value: float) -> float:
    return value if mean is None else 0.7 * mean + 0.3 * value


def _min(a: float | None, b: float) -> float:
    return b if a is None else min(a, b)
