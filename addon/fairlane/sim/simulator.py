"""A discrete-event simulator: the real policy against a cost model instead of a device.

Time only moves when a step finishes or a request arrives. Requests that arrive while a step runs
are handed to the policy at the next step boundary with their true arrival time, exactly as the
device loop does. The simulated engine is what it says: it knows each job's output length (its
EOS) and takes its step time from the cost model, nothing more.
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass

from fairlane.metrics import RequestRecord
from fairlane.policy import (
    CostModel,
    IdlePlan,
    Kind,
    LlmPlan,
    Policy,
    Priority,
    Request,
    SeqOutput,
    StepPlan,
    StepResult,
)
from fairlane.policy.base import class_seconds
from fairlane.sim.workload import Job, Workload


@dataclass(frozen=True)
class Step:
    """One device step on the timeline: when it ran and how its time split between classes."""

    start: float
    end: float
    kind: Kind
    seconds: dict[Priority, float]


@dataclass
class SimResult:
    policy: str
    records: list[RequestRecord]
    steps: list[Step]
    end_time: float
    drained: bool


class Simulator:
    """Runs `policy` over `workload`, taking step durations from `truth`."""

    def __init__(
        self,
        policy: Policy,
        truth: CostModel,
        workload: Workload,
        noise: float = 0.0,
        seed: int = 0,
        give_up_s: dict[Priority, float] | None = None,
    ) -> None:
        self.policy = policy
        self.truth = truth
        self.workload = workload
        self.noise = noise
        # A client that gets no answer within this long cancels (a satellite times out).
        self.give_up_s = give_up_s or {}
        self.rng = random.Random(seed)
        self._ids = itertools.count()
        self._queue: list[tuple[float, int, Job]] = []
        self._give_ups: list[tuple[float, str]] = []
        self._live: dict[str, tuple[Job, RequestRecord]] = {}
        self.records: list[RequestRecord] = []
        self.steps: list[Step] = []

    def run(self, max_time: float | None = None) -> SimResult:
        """Simulate until every job is done (or `max_time`, default 4× the workload's duration)."""
        horizon = max_time if max_time is not None else 4 * self.workload.duration_s
        for job in self.workload.jobs:
            self._push(job.at, job)
        now = 0.0
        while now <= horizon:
            self._deliver(now)
            self._cancel_overdue(now)
            plan = self.policy.schedule(now)
            if isinstance(plan, IdlePlan):
                upcoming = [t for t in (self._next_arrival(), plan.wake_at) if t is not None]
                upcoming += [t for t, _ in self._give_ups[:1] if plan.wake_at is None]
                if not upcoming:
                    break
                now = max(now, min(upcoming))
                continue
            now = self._execute(plan, now)
        drained = not self._queue and not self.policy.has_work()
        return SimResult(self.policy.name, self.records, self.steps, now, drained)

    # --- arrivals --------------------------------------------------------------------------

    def _push(self, at: float, job: Job) -> None:
        heapq.heappush(self._queue, (at, next(self._ids), job))

    def _next_arrival(self) -> float | None:
        return self._queue[0][0] if self._queue else None

    def _deliver(self, now: float) -> None:
        while self._queue and self._queue[0][0] <= now:
            at, seq, job = heapq.heappop(self._queue)
            # The API's clamp: a reply cap of twice what the model will say, within what a
            # request of its class may hold (a prompt that cannot fit is refused, as the
            # server answers 400).
            capacity = self.policy.capacity_tokens(job.priority)
            max_tokens = min(max(2 * job.output_tokens, 1), capacity - job.prompt_tokens)
            request = Request(
                id=f"{job.group}-{seq}",
                kind=job.kind,
                priority=job.priority,
                client=job.client,
                arrival=at,
                prompt_tokens=job.prompt_tokens,
                max_tokens=max(max_tokens, 1),
                audio_s=job.audio_s,
            )
            record = RequestRecord(
                job.kind, job.priority, job.client, job.group, at, prompt_tokens=job.prompt_tokens
            )
            self.records.append(record)
            admission = self.policy.add(request, now)
            if admission.accepted:
                self._live[request.id] = (job, record)
                if (patience := self.give_up_s.get(job.priority)) is not None:
                    heapq.heappush(self._give_ups, (at + patience, request.id))
            else:
                record.refused = admission.reason

    def _cancel_overdue(self, now: float) -> None:
        """Clients that waited longer than they would: their requests are cancelled."""
        while self._give_ups and self._give_ups[0][0] <= now:
            _, request_id = heapq.heappop(self._give_ups)
            if request_id in self._live and self.policy.cancel(request_id, now):
                _, record = self._live.pop(request_id)
                record.refused = "cancelled: the client gave up"

    # --- steps -----------------------------------------------------------------------------

    def _execute(self, plan: StepPlan, start: float) -> float:
        elapsed = self._duration(plan)
        end = start + elapsed
        outputs = self._outputs(plan)
        finished = self.policy.update_from_output(plan, StepResult(elapsed, outputs), end)
        self.steps.append(Step(start, end, plan.kind, class_seconds(plan, elapsed)))
        for output in outputs:
            if output.new_tokens and output.request_id in self._live:
                self._live[output.request_id][1].token_times.append(end)
        for request in finished:
            if request.id not in self._live:
                continue
            job, record = self._live.pop(request.id)
            record.finished_at = end
            if job.then is not None:
                self._push(end, job.then)
        return end

    def _duration(self, plan: StepPlan) -> float:
        if isinstance(plan, LlmPlan):
            seconds = self.truth.llm_s(plan.prefill_tokens, plan.decode_seqs, plan.context_tokens)
        elif plan.kind is Kind.EMBED:
            seconds = self.truth.embed_s(plan.padded_tokens)  # type: ignore[union-attr]
        else:
            seconds = self.truth.stt_s(len(plan.request_ids), plan.audio_s)  # type: ignore[union-attr]
        if self.noise:
            seconds *= max(0.2, self.rng.gauss(1.0, self.noise))
        return seconds

    def _outputs(self, plan: StepPlan) -> tuple[SeqOutput, ...]:
        """The simulated model: a token per sampling chunk; EOS at the job's output length."""
        if not isinstance(plan, LlmPlan):
            return tuple(SeqOutput(rid, finished=True) for rid in plan.request_ids)
        outputs = []
        for chunk in plan.chunks:
            if not chunk.samples or chunk.request_id not in self._live:
                continue
            request = self.policy.requests[chunk.request_id]
            job = self._live[chunk.request_id][0]
            eos = request.output_tokens + 1 >= job.output_tokens
            outputs.append(SeqOutput(chunk.request_id, new_tokens=1, finished=eos))
        return tuple(outputs)
