"""The cost model: how long a step of a given shape takes on this device.

Linear in the quantities that dominate each engine (Sarathi-Serve and vLLM's own profiling use the
same shape): an LLM iteration pays a fixed launch/weight-read cost, a cost per prefill token, a
cost per decoding sequence and a cost per KV position attended to. The real engines feed measured
step times back through `observe()`, so predictions converge to this machine's numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fairlane.policy.request import Kind


@dataclass(frozen=True)
class LlmCost:
    base_ms: float
    prefill_token_ms: float
    decode_seq_ms: float
    context_token_us: float = 0.0


@dataclass(frozen=True)
class EmbedCost:
    base_ms: float
    token_ms: float  # per padded token


@dataclass(frozen=True)
class SttCost:
    base_ms: float
    utterance_ms: float  # Whisper encodes a fixed 30 s window, so the cost is per utterance
    audio_s_ms: float = 0.0  # decoding grows a little with the words spoken


@dataclass(frozen=True)
class CostProfile:
    name: str
    llm: LlmCost
    embed: EmbedCost
    stt: SttCost
    description: str = ""


@dataclass
class CostModel:
    """Predicts step times from a profile, corrected online by measured/predicted ratios."""

    profile: CostProfile
    smoothing: float = 0.2  # weight of each new observation in the correction factor
    correction: dict[Kind, float] = field(default_factory=lambda: dict.fromkeys(Kind, 1.0))

    def llm_s(self, prefill_tokens: int, decode_seqs: int, context_tokens: int) -> float:
        c = self.profile.llm
        ms = (
            c.base_ms
            + c.prefill_token_ms * prefill_tokens
            + c.decode_seq_ms * decode_seqs
            + c.context_token_us * context_tokens / 1000.0
        )
        return ms / 1000.0 * self.correction[Kind.LLM]

    def embed_s(self, padded_tokens: int) -> float:
        c = self.profile.embed
        return (c.base_ms + c.token_ms * padded_tokens) / 1000.0 * self.correction[Kind.EMBED]

    def stt_s(self, utterances: int, audio_s: float) -> float:
        c = self.profile.stt
        ms = c.base_ms + c.utterance_ms * utterances + c.audio_s_ms * audio_s
        return ms / 1000.0 * self.correction[Kind.STT]

    def fixed_s(self, kind: Kind) -> float:
        """The part of a step's cost that batching shares (what a batch window can save)."""
        base = {
            Kind.LLM: self.profile.llm.base_ms,
            Kind.EMBED: self.profile.embed.base_ms,
            Kind.STT: self.profile.stt.base_ms,
        }[kind]
        return base / 1000.0 * self.correction[kind]

    def prefill_tokens_within(
        self, budget_s: float, prefill_tokens: int, decode_seqs: int, context_tokens: int
    ) -> int:
        """The most extra prefill tokens an iteration can carry and still finish in `budget_s`."""
        spare_s = budget_s - self.llm_s(prefill_tokens, decode_seqs, context_tokens)
        per_token_s = (
            (self.profile.llm.prefill_token_ms + self.profile.llm.context_token_us / 1000.0)
            / 1000.0
            * self.correction[Kind.LLM]
        )
        if spare_s <= 0 or per_token_s <= 0:
            return 0
        return math.floor(spare_s / per_token_s)

    def embed_tokens_within(self, budget_s: float) -> int:
        """The most padded tokens one embedding micro-batch can hold within `budget_s`."""
        c = self.profile.embed
        spare_ms = budget_s * 1000.0 / self.correction[Kind.EMBED] - c.base_ms
        if spare_ms <= 0 or c.token_ms <= 0:
            return 0
        return math.floor(spare_ms / c.token_ms)

    def observe(self, kind: Kind, predicted_s: float, measured_s: float) -> None:
        """Fold a measured step time into the correction factor for its engine."""
        if predicted_s <= 0 or measured_s <= 0:
            return
        uncorrected = predicted_s / self.correction[kind]
        ratio = min(max(measured_s / uncorrected, 0.05), 20.0)
        self.correction[kind] += self.smoothing * (ratio - self.correction[kind])
