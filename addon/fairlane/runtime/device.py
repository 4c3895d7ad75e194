"""The device loops: one thread per device that runs its policy's steps one at a time.

Engines are grouped by the device they run on (or the `worker` the configuration names for
them); each group gets its own loop, with its own policy, queues and step clock, so a CPU
Whisper step never holds up the GPU's decode iterations (rule 10). `Devices` routes each
request to the loop that runs its kind; handlers talk to it as to one loop.

HTTP handlers never touch an engine. They `submit()` a request (the policy admits or refuses it
at once) and receive its output through a callback; the loop thread asks the policy for the next
plan, runs it on the engine outside the lock, applies the results and hands out the tokens.
Only this thread calls into an engine's device state, so cancellations are applied here too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from fairlane.engines.llm import TokenEvent
from fairlane.policy import (
    Admission,
    IdlePlan,
    Kind,
    LlmPlan,
    Policy,
    Priority,
    Request,
    StepPlan,
    StepResult,
)
from fairlane.policy.cost import PLAUSIBLE

_LOGGER = logging.getLogger(__name__)

Sink = Callable[[Any], None]  # receives an engine's events for one request, on the loop thread


@dataclass(frozen=True)
class LoopSink:
    """A sink whose events are delivered on an asyncio event loop (an HTTP stream's queue).

    Called alone it posts one event; the device loop posts all of a step's events for one
    event loop together (`DeviceLoop._hand_off`): at 32 streams, one wake-up a step, not 32."""

    loop: Any  # asyncio.AbstractEventLoop
    deliver: Callable[[Any], None]  # runs on `loop`

    def __call__(self, event: Any) -> None:
        self.loop.call_soon_threadsafe(self.deliver, event)


def _deliver_all(items: list[tuple[Callable[[Any], None], Any]]) -> None:
    for deliver, event in items:
        deliver(event)


class Engine(Protocol):
    """What the loop needs of an engine: run a planned step, forget a request."""

    def execute(self, plan: Any) -> tuple[StepResult, list[Any]]: ...

    def release(self, request_id: str) -> None: ...


@dataclass(frozen=True)
class StepRecord:
    """What the device ran: the evidence tests, stats and the dashboard read."""

    start: float
    end: float
    kind: Kind
    request_ids: tuple[str, ...]
    decodes: tuple[str, ...]  # the sequences that fed one generated token (not a prompt chunk)
    classes: tuple[Priority, ...]
    prefill_tokens: int
    decode_seqs: int
    predicted_s: float
    device: str = ""  # the loop that ran it
    # The loop's own work for this step outside the device call: planning, the engine's batch
    # filling and sampling, applying the outputs and handing tokens to their streams.
    host_s: float = 0.0
    device_s: float | None = None  # of end - start, the device call's (None: all of it)
    budget_s: float | None = None  # the plan's time bound for background work (`LlmPlan`)


class DeviceLoop:
    """Owns the policy and the engines; everything else talks to it through `submit`/`cancel`."""

    def __init__(
        self,
        policy: Policy,
        engines: dict[Kind, Engine],
        clock: Callable[[], float] = time.monotonic,
        history: int = 20_000,
        name: str = "device",
    ) -> None:
        self.name = name
        self.policy = policy
        self.engines = engines
        self.clock = clock
        self.records: deque[StepRecord] = deque(maxlen=history)
        # Since start: seconds the loop spent in steps, and in steps that carried each class
        # (a step with several classes counts for each). Differences between two reads give
        # a period's device use, as the records' window cannot once they roll over.
        self.busy_s = 0.0
        self.class_busy_s = dict.fromkeys((p.label for p in Priority), 0.0)
        self.interactive_busy_s = 0.0  # in steps that carried voice or chat work
        # In steps that carried background work and nothing else, per engine kind.
        self.background_busy_s = dict.fromkeys((k.value for k in engines), 0.0)
        # LLM tokens computed per class since start, each position of a sequence once: a
        # prompt chunk's tokens as they are prefilled (a summary's half-done prompt counts what
        # is done), a decode's one, and nothing for a preempted sequence's recompute.
        self.class_llm_tokens = dict.fromkeys((p.label for p in Priority), 0)
        self._reached: dict[str, int] = {}  # per sequence: the positions computed so far
        self._form_errors_said: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._sinks: dict[str, Sink] = {}
        self._kinds: dict[str, Kind] = {}
        self._release: list[tuple[Kind, str]] = []
        self._stopping = False
        # Why the loop stopped on a fault (None while it runs): its requests were ended, new
        # ones are refused (HTTP 503) and /health fails, so a watchdog restarts the server.
        self.fault: str | None = None
        self._planning_s = 0.0  # the last plan's: expiring, releasing and scheduling
        self._handoff_s = 0.0  # the last step's: its tokens handed to their streams
        self._thread = threading.Thread(target=self._run, name=f"fairlane-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=30)

    # --- called from the HTTP side -----------------------------------------------------------

    def submit(self, request: Request, register: Callable[[], int | None], sink: Sink) -> Admission:
        """Admit a request (or refuse it with a reason); its events go to `sink` from the loop.

        `register` hands the request's data to its engine first (it raises for data the engine
        cannot take), so the policy never admits a request its engine does not know. It may
        return how many prompt tokens the engine already holds (a cached prefix): the policy
        then plans the prefill from there.
        """
        with self._wake:
            if self.fault is not None:
                return self._stopped()
            request.computed_tokens = request.cached_tokens = register() or 0
            request.arrival = self.clock()
            admission = self.policy.add(request, request.arrival)
            if admission.accepted:
                self._sinks[request.id] = sink
                self._kinds[request.id] = request.kind
                self._wake.notify()
            else:
                self.engines[request.kind].release(request.id)  # it never ran
            return admission

    def quick_refusal(self, priority: Priority) -> Admission | None:
        """The policy's refusal of any new request of this class (a full queue), asked before
        a handler spends time on the request; None when it may go on.

        Without the lock: it only reads queue lengths, a stale answer costs nothing (`submit`
        asks the policy again under the lock), and under overload the loop thread holds the
        lock often enough that taking it for every refusal stalls the event loop."""
        if self.fault is not None:
            return self._stopped()
        return self.policy.quick_refusal(priority)

    def _stopped(self) -> Admission:
        return Admission(
            False, f"the {self.name} device loop stopped ({self.fault}); the server must be "
            "restarted", retryable=False, unavailable=True,
        )

    def cancel(self, request_id: str) -> bool:
        """Drop a request; a running sequence leaves at the next iteration, its KV freed.

        Whoever is waiting for its tokens gets a last event with finish reason "cancelled".
        """
        with self._wake:
            sink = self._sinks.pop(request_id, None)
            kind = self._kinds.pop(request_id, None)
            self._reached.pop(request_id, None)
            if sink is not None:
                sink(TokenEvent(request_id, "", "cancelled"))
            cancelled = self.policy.cancel(request_id, self.clock())
            if cancelled and kind is not None:
                self._release.append((kind, request_id))
                self._wake.notify()
            return cancelled

    def snapshot(self) -> dict[str, object]:
        """Queue depths, running sequences and KV use, read consistently."""
        with self._lock:
            running = list(self.policy.running.values())
            return {
                "waiting": {p.label: self.policy.waiting_count(p) for p in Priority},
                "running": {p.label: sum(1 for r in running if r.priority is p) for p in Priority},
                "kv_used_blocks": self.policy.kv.used_blocks,
                "kv_total_blocks": self.policy.kv.num_blocks,
                "kv_block_size": self.policy.kv.block_size,
                "cost_fit": self.policy.cost.weights(),
                "cost_form_errors": self.policy.cost.form_errors,
            }

    # --- the loop thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._step():
                pass
        except Exception as err:  # a fault outside the engines: the policy, the bookkeeping
            _LOGGER.critical("%s: the device loop stopped", self.name, exc_info=True)
            self._halt(f"{type(err).__name__}: {err}")

    def _halt(self, message: str) -> None:
        """The loop cannot go on (its policy's state is no longer to be trusted): every request
        it holds ends with an error, new ones are refused, and /health says so, so that a
        watchdog restarts the server rather than every client waiting for tokens forever."""
        with self._lock:
            self.fault = message
            reason = f"error: the {self.name} loop stopped ({message})"
            for request_id, sink in self._sinks.items():
                sink(TokenEvent(request_id, "", reason))  # the client first: it must not hang
            for request_id, kind in self._kinds.items():
                try:
                    self.engines[kind].release(request_id)
                except Exception:  # the engine's own state may be what broke
                    _LOGGER.exception("%s: releasing %s after the fault", self.name, request_id)
            self._sinks.clear()
            self._kinds.clear()
            self._reached.clear()

    def _step(self) -> bool:
        """Plan, run and apply one step; False once the loop is stopping."""
        plan = self._next_plan()
        if plan is None:
            return False
        start = self.clock()
        try:
            result, events = self._execute(plan)
        except Exception as err:  # an engine failure must not kill the loop
            _LOGGER.exception("device step failed")
            self._fail(plan, str(err))
            return True
        end = self.clock()
        with self._lock:
            finished = self.policy.update_from_output(plan, result, end)
            self._report_form_errors()
            # Host work: planning, the engine's outside its device call, applying the outputs,
            # and the last step's hand-off of tokens (recorded before this step's hand-off, so
            # a stream's last token never precedes its step's record).
            device_s = result.device_s if result.device_s is not None else end - start
            handed = self.clock()
            host_s = self._planning_s + (end - start - device_s) + (handed - end)
            record = _record(plan, start, end, self.name, host_s + self._handoff_s, device_s)
            self.records.append(record)
            self.busy_s += end - start
            for label in {p.label for p in record.classes}:
                self.class_busy_s[label] += end - start
            if any(p.interactive for p in record.classes):
                self.interactive_busy_s += end - start
            elif record.classes:
                self.background_busy_s[record.kind.value] += end - start
            if isinstance(plan, LlmPlan):
                self._count_tokens(plan)
            self._hand_off(events)
            for request in finished:
                self._sinks.pop(request.id, None)
                self._kinds.pop(request.id, None)
                self._reached.pop(request.id, None)
                self.engines[request.kind].release(request.id)
            self._handoff_s = self.clock() - handed
        return True

    def _count_tokens(self, plan: LlmPlan) -> None:
        for chunk in plan.chunks:
            if chunk.request_id not in self._kinds:  # cancelled while the step ran
                continue
            end = chunk.start + chunk.num_tokens
            # From the chunk's start (a prefix reused from the cache was not computed), less
            # what an earlier chunk already computed (a preempted sequence's recompute).
            new = end - max(chunk.start, self._reached.get(chunk.request_id, 0))
            if new > 0:
                self.class_llm_tokens[chunk.priority.label] += new
                self._reached[chunk.request_id] = end

    def _hand_off(self, events: list[Any]) -> None:
        """Each event to its request's sink; the sinks that live on an asyncio event loop get
        all of this step's events for that loop in one wake-up, not one per token."""
        batches: dict[Any, list[tuple[Callable[[Any], None], Any]]] = {}
        for event in events:
            sink = self._sinks.get(event.request_id)
            if isinstance(sink, LoopSink):
                batches.setdefault(sink.loop, []).append((sink.deliver, event))
            elif sink is not None:
                sink(event)
        for loop, items in batches.items():
            loop.call_soon_threadsafe(_deliver_all, items)

    def _report_form_errors(self) -> None:
        """Say once per term when the cost model's form cannot explain the measured steps."""
        for kind, terms in self.policy.cost.form_errors.items():
            for term, entry in terms.items():
                if (kind, term) not in self._form_errors_said:
                    self._form_errors_said.add((kind, term))
                    _LOGGER.warning(
                        "%s: the cost model cannot explain the %s steps it measures: the %s "
                        "term's multiplier would be %.2f, outside %s (a cost the model lacks, or "
                        "a profile of another device); refit the profile (fairlane profile fit)",
                        self.name, kind, term, entry["proposed"], PLAUSIBLE,
                    )

    def _next_plan(self) -> StepPlan | None:
        with self._wake:
            while not self._stopping:
                for kind, request_id in self._release:
                    self.engines[kind].release(request_id)
                self._release.clear()
                now = self.clock()
                self._planning_s = 0.0
                for request in self.policy.expire(now):
                    reason = (
                        "deadline: not started before its deadline (the request's deadline_ms, "
                        "or its class's policy.max_wait_ms)"
                    )
                    self._end(request.id, request.kind, reason)
                plan = self.policy.schedule(now)
                if not isinstance(plan, IdlePlan):
                    self._planning_s = self.clock() - now
                    return plan
                timeout = None if plan.wake_at is None else max(0.0, plan.wake_at - now)
                self._wake.wait(timeout)
            return None

    def _execute(self, plan: StepPlan) -> tuple[StepResult, list[Any]]:
        engine = self.engines.get(plan.kind)
        if engine is None:
            raise RuntimeError(f"no engine for {plan.kind.value} steps")
        return engine.execute(plan)

    def _end(self, request_id: str, kind: Kind, reason: str) -> None:
        """A request the policy no longer holds (dropped by rule 9, or its step failed): its
        engine forgets it, and its client is told why."""
        sink = self._sinks.pop(request_id, None)
        self._kinds.pop(request_id, None)
        self._reached.pop(request_id, None)
        self.engines[kind].release(request_id)
        if sink is not None:
            sink(TokenEvent(request_id, "", reason))

    def _fail(self, plan: StepPlan, message: str) -> None:
        with self._lock:
            for request_id in plan.request_ids:
                self.policy.cancel(request_id, self.clock())
                self._end(request_id, plan.kind, f"error: {message}")


def _record(
    plan: StepPlan, start: float, end: float, device: str, host_s: float, device_s: float
) -> StepRecord:
    if isinstance(plan, LlmPlan):
        return StepRecord(
            start,
            end,
            plan.kind,
            plan.request_ids,
            tuple(c.request_id for c in plan.chunks if c.decode),
            tuple(c.priority for c in plan.chunks),
            plan.prefill_tokens,
            plan.decode_seqs,
            plan.predicted_s,
            device,
            host_s,
            device_s,
            plan.budget_s,
        )
    return StepRecord(
        start, end, plan.kind, plan.request_ids, (), (plan.priority,), 0, 0, plan.predicted_s,
        device, host_s, device_s, plan.budget_s,
    )


class Devices:
    """Every device loop, and which kind of work each runs.

    A request goes to the loop that holds its kind's engine; that loop's policy admits it,
    orders it against the other work on the same device and plans its steps. Work on
    different loops overlaps; the priority rules hold on each.
    """

    def __init__(self, loops: list[DeviceLoop]) -> None:
        if not loops:
            raise ValueError("at least one device loop")
        self.loops = {loop.name: loop for loop in loops}
        self._by_kind = {kind: loop for loop in loops for kind in loop.engines}
        self.clock = loops[0].clock

    def loop_for(self, kind: Kind) -> DeviceLoop:
        loop = self._by_kind.get(kind)
        if loop is None:
            raise RuntimeError(f"no engine runs {kind.value} work")
        return loop

    def policy_for(self, kind: Kind) -> Policy:
        return self.loop_for(kind).policy

    @property
    def policy(self) -> Policy:
        """The LLM's policy (the one that holds the KV cache)."""
        return self.policy_for(Kind.LLM)

    @property
    def records(self) -> list[StepRecord]:
        """Every loop's step records, in order of start."""
        if len(self.loops) == 1:
            return list(next(iter(self.loops.values())).records)
        merged = [r for loop in self.loops.values() for r in list(loop.records)]
        return sorted(merged, key=lambda r: r.start)

    def start(self) -> None:
        for loop in self.loops.values():
            loop.start()

    def stop(self) -> None:
        for loop in self.loops.values():
            loop.stop()

    def submit(self, request: Request, register: Callable[[], int | None], sink: Sink) -> Admission:
        return self.loop_for(request.kind).submit(request, register, sink)

    def quick_refusal(self, priority: Priority, kind: Kind = Kind.LLM) -> Admission | None:
        return self.loop_for(kind).quick_refusal(priority)

    def cancel(self, request_id: str) -> bool:
        return any(loop.cancel(request_id) for loop in self.loops.values())

    def faults(self) -> dict[str, str]:
        """The loops that stopped on a fault, and why (empty while all run)."""
        return {name: loop.fault for name, loop in self.loops.items() if loop.fault is not None}

    def snapshot(self) -> dict[str, object]:
        """Queues summed over the loops; the KV cache and cost fit are the LLM loop's."""
        snapshots = {name: loop.snapshot() for name, loop in self.loops.items()}
        first = snapshots[self.loop_for(Kind.LLM).name] if Kind.LLM in self._by_kind else \
            next(iter(snapshots.values()))
        combined = dict(first)
        for key in ("waiting", "running"):
            combined[key] = {
                p.label: sum(s[key][p.label] for s in snapshots.values())  # type: ignore[index]
                for p in Priority
            }
        return combined
