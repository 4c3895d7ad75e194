"""Playing one phase of a workload against a target in real time, recording what every
request waited for."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fairlane.bench.family_load import Prompts
from fairlane.bench.family_targets import (
    Target,
)
from fairlane.policy import Kind
from fairlane.runtime.metrics import RequestRecord
from fairlane.sim.workload import Job, Workload

PHASES = ("interactive", "background", "mixed")
ALONE = "alone:"



@dataclass
class Played:
    """What one phase of one target recorded."""

    target: str
    phase: str
    round: int
    duration_s: float
    records: list[RequestRecord] = field(default_factory=list)
    turns: list[tuple[RequestRecord, RequestRecord]] = field(default_factory=list)  # voice
    # Background work done within the phase: LLM tokens (the prompts of answers that began, and
    # the tokens received) and embedded tokens (documents finished), apart: they differ a
    # hundredfold in cost.
    background_llm_tokens: int = 0
    # A Fairlane target's own count of the background LLM tokens it computed in the phase
    # (each position once: a summary's prompt half prefilled at the end counts what is done).
    background_llm_computed: int | None = None
    embedded_tokens: int = 0
    # Summaries whose last turn (the one turn, or the reduction of the pieces) finished within
    # the phase: the work a household sees done, whatever turns it took.
    summaries_done: int = 0
    summarised_tokens: int = 0  # their texts' tokens (the pieces' together)
    errors: list[str] = field(default_factory=list)
    timed_out: int = 0  # interactive requests still unanswered `give_up_s` after the phase
    # A Fairlane target's cost-model error over the phase, by device loop and step kind
    # (`fairlane.runtime.prediction`), and its background-only steps beside the slice.
    prediction_error: dict[str, Any] = field(default_factory=dict)
    background_steps: dict[str, Any] = field(default_factory=dict)
    # A Fairlane target's LLM loop over the phase's duration: the share of it spent in steps,
    # and in steps that carried interactive work (what work-conserving efficiency reads).
    device_busy: float | None = None
    interactive_busy: float | None = None
    # The share of the phase's LLM steps run on fewer threads than the server has
    # (`llm.give_way`: a neighbour held a core); None when the server's threads are fixed.
    fewer_threads: float | None = None
    background_busy: dict[str, float] = field(default_factory=dict)  # background-only, per kind


class Player:
    """Plays one phase of a workload against a target in real time."""

    def __init__(
        self,
        target: Target,
        workload: Workload,
        prompts: Prompts,
        audio: dict[int, bytes],
        played: Played,
        give_up_s: float,
    ) -> None:
        self.target = target
        self.workload = workload
        self.prompts = prompts
        self.audio = audio
        self.played = played
        self.give_up_s = give_up_s
        self.stop_background = threading.Event()
        self.abandon = threading.Event()
        self._lock = threading.Lock()
        self._finished: set[int] = set()  # the jobs that finished within the phase (by id)
        self._t0 = 0.0

    def now(self) -> float:
        return time.monotonic() - self._t0

    def play(self, phase: str) -> None:
        stats = getattr(self.target, "stats", None)
        before = stats() if stats is not None else None
        self._t0 = time.monotonic()
        duration = self.workload.duration_s
        jobs = [j for j in self.workload.jobs if in_phase(j, phase)]
        loops = [lp for lp in self.workload.loops if in_phase(lp.units[0][0], phase)]
        threads: list[threading.Thread] = []
        for loop in loops:
            units = iter(loop.units)
            lock = threading.Lock()

            def next_unit(
                units: Iterator[tuple[Job, ...]] = units, lock: threading.Lock = lock
            ) -> tuple[Job, ...] | None:
                with lock:
                    return next(units, None)

            for _ in range(loop.in_flight):
                threads.append(self._spawn(self._loop, next_unit, loop.until))
        interactive: list[threading.Thread] = []
        for job in jobs:
            wait = job.at - self.now()
            if wait > 0:
                time.sleep(wait)
            worker = self._spawn(self._job, job)
            (interactive if job.priority.interactive else threads).append(worker)
        time.sleep(max(0.0, duration - self.now()))
        self.stop_background.set()  # unfinished background work does not count
        if stats is not None and before is not None:
            self._device_use(before, stats())
        deadline = time.monotonic() + self.give_up_s
        for worker in interactive:
            worker.join(max(0.0, deadline - time.monotonic()))
        self.played.timed_out = sum(worker.is_alive() for worker in interactive)
        self.abandon.set()
        for worker in threads + interactive:
            worker.join(30)
        if stats is not None:
            # The steps of the whole phase, its interactive work's tail included.
            steps = stats(self.now())
            self.played.prediction_error = steps["prediction_error"]
            self.played.background_steps = steps["background_steps"]

    def _device_use(self, before: dict[str, Any], after: dict[str, Any]) -> None:
        """The LLM loop's busy shares over the phase's duration, from two reads of its
        counters."""
        seconds = self.now()
        threads_before, threads_after = before.get("llm_threads", {}), after.get("llm_threads", {})
        if "steps_on_fewer_threads" in threads_after:
            steps = threads_after["steps"] - threads_before.get("steps", 0)
            fewer = threads_after["steps_on_fewer_threads"] - threads_before.get(
                "steps_on_fewer_threads", 0
            )
            self.played.fewer_threads = round(fewer / steps, 3) if steps else 0.0
        start, end = before["device"], after["device"]
        self.played.device_busy = round((end["busy_s_total"] - start["busy_s_total"]) / seconds, 3)
        self.played.interactive_busy = round(
            (end["interactive_busy_s_total"] - start["interactive_busy_s_total"]) / seconds, 3
        )
        before, after = start.get("background_busy_s_total", {}), end.get(
            "background_busy_s_total", {}
        )
        self.played.background_busy = {
            kind: round((after[kind] - before.get(kind, 0.0)) / seconds, 3) for kind in after
        }
        if "class_llm_tokens_total" in end:
            self.played.background_llm_computed = (
                end["class_llm_tokens_total"]["background"]
                - start.get("class_llm_tokens_total", {}).get("background", 0)
            )

    def _spawn(self, target: Callable[..., object], *args: Any) -> threading.Thread:
        thread = threading.Thread(target=self._guard, args=(target, *args), daemon=True)
        thread.start()
        return thread

    def _guard(self, target: Callable[..., object], *args: Any) -> None:
        try:
            target(*args)
        except Exception as err:  # a failed request is counted, never fatal to the phase
            with self._lock:
                self.played.errors.append(f"{type(err).__name__}: {err}")

    def _loop(self, next_unit: Callable[[], tuple[Job, ...] | None], until: float | None) -> None:
        end = self.workload.duration_s if until is None else min(until, self.workload.duration_s)
        while not self.stop_background.is_set() and self.now() < end:
            unit = next_unit()
            if unit is None:
                return
            if unit[0].kind is Kind.EMBED:
                self._document(unit)
                continue
            # A summary's pieces go together; the last one's `then` (the summary of the
            # pieces) follows it.
            pieces = [self._spawn(self._job, job) for job in unit]
            for piece in pieces:
                piece.join()
            last = unit[-1]
            while last.then is not None:
                last = last.then
            if last.group == "summary" and id(last) in self._finished:
                with self._lock:
                    self.played.summaries_done += 1
                    self.played.summarised_tokens += sum(job.prompt_tokens for job in unit)

    def _stop_for(self, job: Job) -> threading.Event:
        return self.abandon if job.priority.interactive else self.stop_background

    def _record(self, job: Job, kind: Kind | None = None) -> RequestRecord:
        record = RequestRecord(
            kind or job.kind, job.priority, job.client, job.group, self.now(), job.prompt_tokens
        )
        with self._lock:
            self.played.records.append(record)
        return record

    def _job(self, job: Job, said: str = "") -> RequestRecord | None:
        if self._stop_for(job).is_set():
            return None
        if job.kind is Kind.STT:
            self._voice(job)
            return None
        messages = self.prompts.messages(job, said)
        record = self._record(job)
        timing = self.target.chat(messages, job.output_tokens, job, self._stop_for(job))
        record.token_times = [t - self._t0 for t in timing.token_times]
        if not job.priority.interactive:
            # Work done within the phase: the prompt of an answer that began, and every token
            # received (a summary cut at the end still counts what it got through; a prompt
            # cut mid-prefill counts nothing, as the client cannot see it).
            received = [t for t in record.token_times if t <= self.workload.duration_s]
            if received:
                with self._lock:
                    self.played.background_llm_tokens += job.prompt_tokens + len(received)
        if timing.error is None and not self._stop_for(job).is_set():
            record.finished_at = self.now()
            self._finished.add(id(job))
            if job.then is not None:
                self._job(job.then)
        elif timing.error:
            record.refused = timing.error
        return record

    def _voice(self, job: Job) -> None:
        """A spoken command: its recording through speech-to-text, then the LLM turn."""
        record = self._record(job, Kind.STT)
        text = self.target.transcribe(self.audio[id(job)], job.client)
        record.finished_at = self.now()
        if job.then is not None:
            reply = self._job(job.then, said=text)
            if reply is not None:
                with self._lock:
                    self.played.turns.append((record, reply))

    def _document(self, unit: tuple[Job, ...]) -> None:
        """A document's chunks in one embeddings request, as an indexer sends them."""
        record = self._record(unit[0])
        record.prompt_tokens = sum(job.prompt_tokens for job in unit)
        self.target.embed(self.prompts.chunks(unit), unit[0].client)
        if not self.stop_background.is_set():
            record.finished_at = self.now()
            with self._lock:
                self.played.embedded_tokens += record.prompt_tokens


def in_phase(job: Job, phase: str) -> bool:
    """`alone:MEMBER` plays one member's own requests (the fairness case's baseline)."""
    if phase.startswith(ALONE):
        return job.client == phase.removeprefix(ALONE)
    return phase == "mixed" or (phase == "interactive") == job.priority.interactive
