"""Fairlane's policy: lanes with explicit priority rules (DESIGN.md §3).

`schedule(now)` reads top to bottom: rank the lanes that have work (rules 1 and 8), maybe hold
a batch window when only one class is waiting (rule 7), then build the first ranked lane's step
that can run within its budgets (rules 2–6). A lane that cannot run now (no KV, no sequence
slot) never blocks the next one, so the device is never left idle while some work can run.
Each rule lives in one helper whose docstring names it.

The policy is four small modules read in this order: `lanes` (the queues, arrival rates and the
rules every step shares), this file (the step: which lane runs, admission), `batch_steps`
(speech, synthesis and embedding batches, the batch window) and `llm_step` (the LLM iteration).
"""

from __future__ import annotations

import math

from fairlane.policy.batch_steps import BatchSteps
from fairlane.policy.lanes import INTERACTIVE, LANE_ORDER, LaneChoice
from fairlane.policy.llm_step import LlmIteration
from fairlane.policy.plan import Admission, IdlePlan, Plan, StepPlan
from fairlane.policy.request import Kind, Priority, Request, Status


class FairlaneScheduler(BatchSteps, LlmIteration):
    name = "fairlane"

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
                self.owed_last = choice.owed
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
        # Rule 2 beside rule 8: an interactive prompt waits for one owed slice, never two.
        one_owed = self.owed_last and self._interactive_prompt_waits()
        if background and ranked[0][1].interactive and not one_owed and self._background_owed(now):
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

    def _interactive_prompt_waits(self) -> bool:
        """An interactive request whose first output is still to come (its TTFT or its
        transcript is running): waiting, or part-way through its prompt."""
        return any(len(q) for (_, p), q in self.waiting.items() if p.interactive) or any(
            r.priority.interactive and not r.is_decode for r in self.running.values()
        )

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

        `slice_ms` while interactive work is running or waiting, or a turn's next request is
        due within moments; `forecast_wait_s` (the slice on a GPU, 250 ms on a CPU) while only
        a conversation's next turn is expected (the last arrival is recent next to the usual
        pause between them): a step short enough for an arrival to wait for, long enough to be
        worth its fixed cost; with none of that the step may grow to `arrival_wait_s` (the
        longest step an interactive arrival can wait for and still meet its target), so
        background work runs in efficient batches when nobody is talking.
        """
        interactive_busy = any(r.priority.interactive for r in self.running.values()) or any(
            len(q) for (_, p), q in self.waiting.items() if p.interactive
        )
        if interactive_busy or self._turn_continues(now):
            return self.config.slice_s
        if any(rate.active(now) for (_, p), rate in self.arrivals.items() if p.interactive):
            return self.config.forecast_wait_s
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
        # A step of e seconds in the slack makes the decode after it pay share · e more too.
        left = min(due) - now - self.cost.llm_s(0, decodes, context, self.held_tokens())
        return left / (1.0 + self.cost.switch_share())

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
        held = self.held_tokens()
        chunk = min(
            self.config.max_batch_tokens,
            max(
                self.config.min_prefill_chunk,
                self.cost.prefill_tokens_within(self.config.arrival_wait_s, 0, decodes, 0, held),
            ),
        )
        iterations = max(1, math.ceil(prefill / chunk))
        # Each iteration: the decodes riding along, and the fixed cost of a prompt chunk (the
        # prompt's own tokens are counted once, below, with the prompt's fixed cost).
        per_iteration = self.cost.llm_s(0, decodes, 0, held) + self.cost.prompt_fixed_s()
        return (
            in_flight
            + iterations * per_iteration
            - self.cost.prompt_fixed_s()
            + self.cost.llm_s(prefill, 0, 0, held)
            - self.cost.llm_s(0, 0, 0, held)
        )

    def _retire(self, request: Request, status: Status, now: float) -> None:
        super()._retire(request, status, now)
        if status is Status.FINISHED and request.priority.interactive:
            self.last_interactive_end = now

    def _account(self, plan: StepPlan, seconds: dict[Priority, float], now: float) -> None:
        """Keep each lane's background device time: it rotates the background lanes."""
        elapsed = sum(seconds.values())
        self.lane_share.record({plan.kind: seconds.get(Priority.BACKGROUND, 0.0)}, now, elapsed)

