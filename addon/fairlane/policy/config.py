"""Every knob of the scheduling policy, typed, with its default (validated in fairlane.config)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from fairlane.policy.request import Priority


@dataclass(frozen=True)
class Slo:
    """Latency targets of one class. `None` means no target (background)."""

    ttft_ms: float | None = None
    itl_ms: float | None = None
    stt_ms: float | None = None


def _default_slos() -> dict[Priority, Slo]:
    return {
        Priority.VOICE: Slo(ttft_ms=500, itl_ms=80, stt_ms=500),
        Priority.CHAT: Slo(ttft_ms=1000, itl_ms=100, stt_ms=1000),
        Priority.BACKGROUND: Slo(),
    }


def _per_class(voice: float, chat: float, background: float) -> dict[Priority, float]:
    return {Priority.VOICE: voice, Priority.CHAT: chat, Priority.BACKGROUND: background}


@dataclass(frozen=True)
class PolicyConfig:
    # Rule 2: no background step may be predicted to run longer than this while interactive
    # work is running or expected.
    slice_ms: float = 50.0
    # Rules 2 and 4: with no interactive work running or expected, a background step may grow,
    # and an interactive prefill step may always run, up to this fraction of the tightest
    # interactive first-output target (TTFT or STT): an arrival that waits for such a step
    # still meets its own target.
    arrival_wait_fraction: float = 0.25
    # Rule 2 between turns: while a conversation is only forecast (its next turn is expected
    # within seconds, but no interactive request runs or waits and no turn is mid-way), a
    # background step may grow to this fraction of the same target, never below the slice.
    # On a GPU's targets that is the slice itself (31 ms < 50 ms); on a CPU (targets × 8) it is
    # 250 ms, where the smallest prompt chunk beside long summaries already takes 100-200 ms
    # and runs the prompt at well under its rate in long steps (docs/history/benchmarks.md).
    forecast_wait_fraction: float = 0.0625
    # Rules 4 and 5: what one LLM iteration may carry, and how many sequences may hold KV.
    max_batch_tokens: int = 2048
    max_num_seqs: int = 32
    min_prefill_chunk: int = 8
    # Rule 2 for background prompts: an otherwise empty step runs at least this many prompt
    # tokens even past its time bound. 1 keeps background steps within the slice wherever one
    # token fits it; on 2 CPU cores beside long summaries' KV an 8-token chunk takes 3x the
    # slice, so an arrival waited for 3 slices (docs/history/benchmarks.md).
    background_min_chunk: int = 1
    # Rule 8 where a prompt chunk's fixed cost (the prompt kernels, attention over its
    # position) alone fills the slice: an owed background slice may grow until its prompt
    # tokens cost this multiple of that fixed cost (never past `arrival_wait_s`), so the
    # share owed is spent on tokens, not overhead. 0: owed slices keep to the slice (the
    # 2-core host's 55 ms fixed cost then left 1-token chunks at ~15% of the step on tokens).
    owed_chunk_worth: float = 1.0
    # Plan iterations to this fraction of the tightest ITL target, for noise in step times.
    itl_headroom: float = 0.8
    # Rule 4 for voice: a spoken reply is heard once whole sentences are written, so its pace is
    # its latency. A voice stream's token may come at most this much later than its own decode
    # alone would take: background fills no slack beyond that (rule 8 still owes it its share).
    voice_pace: float = 1.3
    # Rule 5: KV cache in blocks, and the fraction kept free when admitting background prompts.
    kv_blocks: int = 2048
    block_size: int = 16
    kv_watermark: float = 0.1
    # Embedding and speech batches. Speech synthesis: sentences per step (a Piper voice's graph
    # returns no per-sentence lengths, so the engine runs a step's sentences one after another).
    embed_max_batch: int = 64
    embed_max_batch_tokens: int = 8192
    stt_max_batch: int = 8
    tts_max_batch: int = 1
    # Rule 6: weights of VTC's service counter.
    vtc_input_weight: float = 1.0
    vtc_output_weight: float = 2.0
    # Rule 7: how long a lane may hold a batch open for more arrivals, per class.
    batch_window_ms: dict[Priority, float] = field(default_factory=lambda: _per_class(2, 10, 200))
    # Rule 14: for this long after an interactive request finishes, its turn's next request is
    # expected (the agent's call after a transcript, the spoken reply after the text), so
    # background steps stay within `slice_ms`.
    turn_gap_s: float = 2.0
    # Rule 8: background owed `background_min_share` of device time once it waited this long.
    background_min_share: float = 0.2
    background_max_wait_s: float = 5.0
    share_window_s: float = 10.0
    # Rule 9: per-class waiting-queue limits, and default deadlines for the first output.
    queue_limit: dict[Priority, float] = field(
        default_factory=lambda: _per_class(32, 128, 1_000_000)
    )
    deadline_ms: dict[Priority, float | None] = field(
        default_factory=lambda: {
            Priority.VOICE: None,
            Priority.CHAT: None,
            Priority.BACKGROUND: None,
        }
    )
    # The longest a request may wait before its first step: a spoken command not started in
    # 10 s, a chat turn not started in 30 s gets a 429 (the person is better told "busy" than
    # kept waiting), a client's background request not started in 120 s too (an automation's
    # call is answered, not left open). The server's own durable jobs (indexing, summaries)
    # wait their turn however long. Unlike a deadline it does not count the request's own
    # prefill, so it never refuses a long prompt on a slow device.
    max_wait_ms: dict[Priority, float | None] = field(
        default_factory=lambda: {
            Priority.VOICE: 10_000,
            Priority.CHAT: 30_000,
            Priority.BACKGROUND: 120_000,
        }
    )
    slo: dict[Priority, Slo] = field(default_factory=_default_slos)

    @property
    def slice_s(self) -> float:
        return self.slice_ms / 1000.0

    @property
    def arrival_wait_s(self) -> float:
        """The longest step an interactive arrival can wait for and still meet its target."""
        return max(self.slice_s, self._first_output_target_s() * self.arrival_wait_fraction)

    def _first_output_target_s(self) -> float:
        """The tightest interactive first-output target (TTFT or STT); 0 without one."""
        targets = [
            ms
            for p in Priority
            if p.interactive
            for ms in (self.slo[p].ttft_ms, self.slo[p].stt_ms)
            if ms is not None
        ]
        return min(targets) / 1000.0 if targets else 0.0

    @property
    def forecast_wait_s(self) -> float:
        """The longest background step while a conversation is forecast (rule 2)."""
        forecast = self._first_output_target_s() * self.forecast_wait_fraction
        return min(self.arrival_wait_s, max(self.slice_s, forecast))

    @property
    def kv_reserve_blocks(self) -> int:
        """Rule 5: KV blocks a background sequence may not take (the watermark)."""
        return math.ceil(self.kv_watermark * self.kv_blocks)

    def capacity_tokens(self, priority: Priority) -> int:
        """The most KV positions (prompt + output) one request of this class may hold."""
        blocks = self.kv_blocks
        if not priority.interactive:
            blocks -= self.kv_reserve_blocks
        return blocks * self.block_size

    def itl_budget_s(self, priority: Priority) -> float | None:
        """The iteration time a decode of this class can bear, or None without a target."""
        itl = self.slo[priority].itl_ms
        return None if itl is None else itl / 1000.0 * self.itl_headroom

    def scaled(self, factor: float) -> PolicyConfig:
        """The same policy with every interactive latency target multiplied (CPU profiles).

        `slice_ms` is not scaled: it bounds how long an arrival waits for the step in flight
        while someone is mid-turn. The steps between turns (`forecast_wait_fraction`) and with
        nobody talking (`arrival_wait_fraction`) follow the scaled targets: on a CPU a step's
        fixed cost and its attention over long summaries' KV are most of a 50 ms slice.
        """

        def scale(value: float | None) -> float | None:
            return None if value is None else value * factor

        slo = {
            p: Slo(scale(s.ttft_ms), scale(s.itl_ms), scale(s.stt_ms)) for p, s in self.slo.items()
        }
        return replace(self, slo=slo)
