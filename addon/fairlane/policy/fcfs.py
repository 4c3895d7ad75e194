"""Baselines: how work is served without Fairlane's classes, slices and fairness.

- `separate` is what a household runs today: llama-server (or Ollama) for the LLM,
  wyoming-faster-whisper for speech, wyoming-piper for the voice and an embedding server, as
  separate processes on one
  device. Each server keeps its own FIFO; they do not coordinate, so the device runs their steps
  in turn (the operating system or the GPU time-slices the processes). The LLM server batches
  continuously: every generating slot decodes each iteration and prompts join in arrival order,
  split at the server's batch size (llama-server's `n_batch`, this config's `max_batch_tokens`).
  The speech server transcribes one request at a time.
- `vllm` is one engine serving everything from one FIFO with chunked prefill, as a vLLM-style
  server does: the oldest request decides what runs next; decodes go first, then prompt chunks
  within the token budget.
- `fcfs` is the same single FIFO without chunked prefill: a prompt joins its iteration whole.
  No household stack works quite like it (it is kept as the simplest reference, and for the
  real server's `--policy fcfs`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from fairlane.policy.base import IterationBuilder, Policy
from fairlane.policy.config import PolicyConfig
from fairlane.policy.cost import CostModel
from fairlane.policy.plan import EmbedPlan, IdlePlan, Plan, SttPlan, TtsPlan
from fairlane.policy.request import Kind, Priority, Request, Status


class FcfsScheduler(Policy):
    name = "fcfs"
    chunked_prefill = False  # a prompt larger than the token budget is split across iterations

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
        heads = {k: q[0].arrival for k, q in self.queues.items() if q}
        if self.running:
            oldest_running = min(r.arrival for r in self.running.values())
            heads[Kind.LLM] = min(heads.get(Kind.LLM, oldest_running), oldest_running)
        if not heads:
            return IdlePlan()
        kind = self._next_kind(heads)
        if kind is Kind.STT:
            taken = self._take(Kind.STT, self._stt_batch, now)
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
        if kind is Kind.TTS:
            taken = self._take(Kind.TTS, self.config.tts_max_batch, now)
            phonemes = max(r.prompt_tokens for r in taken) * len(taken)
            return TtsPlan(
                request_ids=tuple(r.id for r in taken),
                priority=taken[0].priority,
                phonemes=phonemes,
                predicted_s=self.cost.tts_s(phonemes),
            )
        return self._plan_llm(now)

    @property
    def _stt_batch(self) -> int:
        return self.config.stt_max_batch

    def _next_kind(self, heads: dict[Kind, float]) -> Kind:
        """One FIFO: the engine whose oldest request (waiting or running) arrived first."""
        return min(heads, key=lambda k: heads[k])

    def _take(self, kind: Kind, limit: int, now: float) -> list[Request]:
        queue = self.queues[kind]
        taken = [queue.popleft() for _ in range(min(limit, len(queue)))]
        for request in taken:
            self._start(request, now)
        return taken

    def _plan_llm(self, now: float) -> Plan:
        """Running sequences advance (decodes first when prompts are chunked); waiting prompts
        join in arrival order."""
        batch = IterationBuilder.after(self)
        preempted: list[str] = []
        if self.chunked_prefill:
            order = sorted(self.running.values(), key=lambda r: (not r.is_decode, r.order))
        else:
            order = sorted(self.running.values(), key=lambda r: r.order)
        for request in order:
            if request.status is not Status.RUNNING or len(batch.chunks) >= batch.max_seqs:
                continue
            tokens = self._prompt_part(request.remaining_prefill, batch)
            if tokens <= 0:
                continue
            # Without classes the newest running sequence yields, whatever it is.
            total = request.computed_tokens + tokens
            if self._make_room(request, total, batch, preempted, _newer_than(request)):
                batch.add(request, tokens)
        queue = self.queues[Kind.LLM]
        while queue and len(self.running) < self.config.max_num_seqs:
            request = queue[0]
            if request.id in preempted:
                break  # preempted for room in this very iteration: it waits for the next
            tokens = self._prompt_part(request.remaining_prefill, batch)
            if tokens <= 0:
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

    def _prompt_part(self, remaining: int, batch: IterationBuilder) -> int:
        """How much of a prompt (or a decode's one token) joins this iteration; 0: it waits."""
        if self.chunked_prefill:
            return min(remaining, batch.token_room)
        # Whole prompts: the first joins even when it is larger than the token budget (a server
        # without chunked prefill has no other choice); later ones only if they fit.
        if batch.prefill and remaining > batch.token_room:
            return 0
        return remaining


class SingleEngineFcfs(FcfsScheduler):
    """vLLM-like: one engine, one FIFO over all work, chunked prefill within the token budget."""

    name = "vllm"
    chunked_prefill = True


class SeparateServers(FcfsScheduler):
    """llama-server, wyoming-faster-whisper and an embedding server sharing one device."""

    name = "separate"
    chunked_prefill = True  # llama-server splits prompts at n_batch

    def __init__(self, config: PolicyConfig, cost: CostModel) -> None:
        super().__init__(config, cost)
        self._last: Kind | None = None

    @property
    def _stt_batch(self) -> int:
        return 1  # wyoming-faster-whisper transcribes one request at a time

    def _next_kind(self, heads: dict[Kind, float]) -> Kind:
        """The servers that have work take the device in turn, one step each."""
        kinds = list(Kind)
        start = 0 if self._last is None else kinds.index(self._last) + 1
        for offset in range(len(kinds)):
            kind = kinds[(start + offset) % len(kinds)]
            if kind in heads:
                self._last = kind
                return kind
        raise AssertionError("no engine has work")  # heads is never empty here


def _newer_than(request: Request) -> Callable[[Request], bool]:
    return lambda other: other.order > request.order
