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
from collections.abc import Sequence
from dataclasses import dataclass, field

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
from fairlane.runtime.metrics import RequestRecord
from fairlane.sim.workload import Job, Loop, Workload


@dataclass(frozen=True)
class Step:
    """One device step on the timeline: when it ran and how its time split between classes."""

    start: float
    end: float
    kind: Kind
    seconds: dict[Priority, float]
    # LLM tokens the step computed per class, each position of a sequence once (as the
    # server's `class_llm_tokens_total` counts them: a recompute after preemption is not new).
    tokens: dict[Priority, int] = field(default_factory=dict)


@dataclass
class SimResult:
    policy: str
    records: list[RequestRecord]
    steps: list[Step]
    end_time: float
    drained: bool
    # Spoken turns: turn number → (end of speech, end of its first sentence's synthesis).
    first_audio: dict[int, tuple[float, float]] | None = None
    # Spoken turns: each transcription's record beside its reply's (what `bench family`
    # times from the end of speech to the reply's first token).
    turns: list[tuple[RequestRecord, RequestRecord]] = field(default_factory=list)
    # Closed loops' units done: (loop, the unit's prompt tokens, when its last job ended).
    units_done: list[tuple[str, int, float]] = field(default_factory=list)


# An arrival the server heard before a run: its time (before the run's 0), engine, class.
Heard = tuple[float, Kind, Priority]


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
        warm_prefixes: bool = True,
        round_trip_s: float = 0.0,
        history: Sequence[Heard] = (),
    ) -> None:
        self.policy = policy
        self.truth = truth
        self.workload = workload
        self.noise = noise
        # A client that gets no answer within this long cancels (a satellite times out).
        self.give_up_s = give_up_s or {}
        self.rng = random.Random(seed)
        # The host's client round trip: a client sends its next request (a closed loop's next
        # unit, a summary's reduction, a spoken command's reply turn) this long after the
        # answer it waited for; the device meanwhile runs whatever else is queued.
        self.round_trip_s = round_trip_s
        # Requests the device's server heard before this run (their times are before 0, each
        # with its engine and class): the policy's forecasts begin from them, as a running
        # server's do.
        self.history = sorted(history, key=lambda arrival: arrival[0])
        self._ids = itertools.count()
        self._queue: list[tuple[float, int, Job]] = []
        self._give_ups: list[tuple[float, str]] = []
        self._live: dict[str, tuple[Job, RequestRecord]] = {}
        self.records: list[RequestRecord] = []
        self.steps: list[Step] = []
        # Closed loops: each job's unit, each unit's unfinished jobs, each loop's next unit.
        self._unit_of: dict[int, tuple[Loop, int]] = {}
        self._open: dict[tuple[str, int], int] = {}
        self._next_unit: dict[str, int] = {}
        # Shared prompt prefixes the engine holds: warm from the start, as in a running home
        # (and after `bench family`'s warm-up); with `warm_prefixes=False`, once one has run.
        self._cached_prefixes: set[tuple[int, str, int]] = (
            _shared_prefixes(workload) if warm_prefixes else set()
        )
        self._spoken_start: dict[int, float] = {}  # a spoken turn's end of speech
        self._first_audio: dict[int, tuple[float, float]] = {}
        self._sentences: dict[int, int] = {}  # a reply job (by id) → sentences sent to speak
        self._turn_records: dict[int, dict[Kind, RequestRecord]] = {}
        self._reached: dict[str, int] = {}  # per LLM sequence: the positions computed so far
        self._units_done: list[tuple[str, int, float]] = []

    def run(self, max_time: float | None = None) -> SimResult:
        """Simulate until every job is done (or `max_time`, default 4× the workload's duration)."""
        horizon = max_time if max_time is not None else 4 * self.workload.duration_s
        for at, kind, priority in self.history:
            self.policy.heard(kind, priority, at)
        for job in self.workload.jobs:
            self._push(job.at, job)
        for loop in self.workload.loops:
            for _ in range(loop.in_flight):
                self._start_unit(loop, 0.0)
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
        turns = [
            (kinds[Kind.STT], kinds[Kind.LLM])
            for _, kinds in sorted(self._turn_records.items())
            if Kind.STT in kinds and Kind.LLM in kinds
        ]
        return SimResult(
            self.policy.name,
            self.records,
            self.steps,
            now,
            drained,
            self._first_audio,
            turns,
            self._units_done,
        )

    # --- arrivals --------------------------------------------------------------------------

    def _push(self, at: float, job: Job) -> None:
        heapq.heappush(self._queue, (at, next(self._ids), job))

    def _start_unit(self, loop: Loop, at: float) -> None:
        """A closed loop's next unit of work arrives (if it has one and its time is not up)."""
        index = self._next_unit.get(loop.name, 0)
        if index >= len(loop.units) or (loop.until is not None and at >= loop.until):
            return
        self._next_unit[loop.name] = index + 1
        jobs = loop.units[index]
        self._open[(loop.name, index)] = sum(_chain_length(job) for job in jobs)
        for job in jobs:
            self._unit_of[id(job)] = (loop, index)
            self._push(at, job)

    def _job_ended(self, job: Job, at: float, ran: bool) -> None:
        """Finished (`ran`), refused or given up: a closed loop sends its next unit when the
        last job of one ends (a job that did not run takes its `then` chain with it)."""
        owner = self._unit_of.pop(id(job), None)
        if owner is None:
            return
        loop, index = owner
        skipped = 0
        if job.then is not None:
            if ran:
                self._unit_of[id(job.then)] = owner
            else:
                skipped = _chain_length(job.then)
        self._open[(loop.name, index)] -= 1 + skipped
        if self._open[(loop.name, index)] == 0:
            if ran:
                tokens = sum(j.prompt_tokens for j in loop.units[index])
                self._units_done.append((loop.name, tokens, at))
            self._start_unit(loop, at + self.round_trip_s)

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
            if job.kind is Kind.STT and job.turn >= 0:
                self._spoken_start[job.turn] = at
            if job.turn >= 0 and job.kind in (Kind.STT, Kind.LLM):
                self._turn_records.setdefault(job.turn, {})[job.kind] = record
            self.records.append(record)
            if job.prefix_tokens and _prefix_key(job) in self._cached_prefixes:
                # The engine holds the shared prefix: only the rest of the prompt is prefilled.
                cached = min(job.prefix_tokens, job.prompt_tokens - 1)
                request.computed_tokens = request.cached_tokens = cached
            admission = self.policy.add(request, now)
            if admission.accepted:
                self._live[request.id] = (job, record)
                if (patience := self.give_up_s.get(job.priority)) is not None:
                    heapq.heappush(self._give_ups, (at + patience, request.id))
            else:
                record.refused = admission.reason
                self._job_ended(job, now, ran=False)

    def _cancel_overdue(self, now: float) -> None:
        """Clients that waited longer than they would: their requests are cancelled."""
        while self._give_ups and self._give_ups[0][0] <= now:
            _, request_id = heapq.heappop(self._give_ups)
            if request_id in self._live and self.policy.cancel(request_id, now):
                job, record = self._live.pop(request_id)
                record.refused = "cancelled: the client gave up"
                self._job_ended(job, now, ran=False)

    # --- steps -----------------------------------------------------------------------------

    def _execute(self, plan: StepPlan, start: float) -> float:
        elapsed = self._duration(plan)
        end = start + elapsed
        outputs = self._outputs(plan)
        finished = self.policy.update_from_output(plan, StepResult(elapsed, outputs), end)
        self.steps.append(
            Step(start, end, plan.kind, class_seconds(plan, elapsed), self._computed(plan))
        )
        for output in outputs:
            if output.new_tokens and output.request_id in self._live:
                job, record = self._live[output.request_id]
                record.token_times.append(end)
                if job.prefix_tokens:  # prefilled: the engine holds the prefix from now on
                    self._cached_prefixes.add(_prefix_key(job))
                if job.sentence_tokens and len(record.token_times) % job.sentence_tokens == 0:
                    self._speak(job, end, job.sentence_tokens)
        for request in finished:
            if request.id not in self._live:
                continue
            job, record = self._live.pop(request.id)
            record.finished_at = end
            if job.kind is Kind.TTS and job.turn >= 0 and job.turn not in self._first_audio:
                self._first_audio[job.turn] = (self._spoken_start.get(job.turn, job.at), end)
            if job.sentence_tokens:  # the last words: a sentence however short
                rest = len(record.token_times) % job.sentence_tokens
                if rest or not record.token_times:
                    self._speak(job, end, max(rest, 1))
            if job.then is not None:
                self._push(end + self.round_trip_s, job.then)
            self._reached.pop(request.id, None)
            self._job_ended(job, end, ran=True)
        return end

    def _computed(self, plan: StepPlan) -> dict[Priority, int]:
        """The LLM tokens a step computed per class, each position once."""
        tokens: dict[Priority, int] = {}
        if isinstance(plan, LlmPlan):
            for chunk in plan.chunks:
                end = chunk.start + chunk.num_tokens
                new = end - max(chunk.start, self._reached.get(chunk.request_id, 0))
                if new > 0:
                    tokens[chunk.priority] = tokens.get(chunk.priority, 0) + new
                    self._reached[chunk.request_id] = end
        return tokens

    def _speak(self, reply: Job, at: float, tokens: int) -> None:
        """A sentence of a spoken reply is complete: it is synthesised as one request."""
        ids = max(1, round(tokens * reply.ids_per_token))
        sentence = Job(
            at,
            f"{reply.group}-speech",
            Kind.TTS,
            reply.priority,
            reply.client,
            prompt_tokens=ids,
            turn=reply.turn,
        )
        self._push(at, sentence)

    def _duration(self, plan: StepPlan) -> float:
        seconds = self.truth.plan_s(plan)
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


def _chain_length(job: Job) -> int:
    """The job and the jobs that start when it finishes."""
    length = 1
    while job.then is not None:
        job, length = job.then, length + 1
    return length


def _prefix_key(job: Job) -> tuple[int, str, int]:
    """Which cached prompt prefix a job starts with: its home's, for its group."""
    return (job.household, job.group, job.prefix_tokens)


def _shared_prefixes(workload: Workload) -> set[tuple[int, str, int]]:
    jobs = [*workload.jobs, *(j for loop in workload.loops for unit in loop.units for j in unit)]
    found = set()
    for job in jobs:
        chain: Job | None = job
        while chain is not None:
            if chain.prefix_tokens:
                found.add(_prefix_key(chain))
            chain = chain.then
    return found
