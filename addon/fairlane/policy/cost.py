"""The cost model: how long a step of a given shape takes on this device.

Linear in the quantities that dominate each engine (Sarathi-Serve and vLLM's own profiling use the
same shape). An LLM iteration pays a fixed launch/weight-read cost; a further fixed cost when it
carries a prompt chunk (the large-batch kernels); a cost per prefill token; a cost per decoding
sequence (its logits, sampling and hand-off on the host); a cost per KV position each sequence
attends to; and a cost per KV cell held by *all* sequences, for each decoding sequence and for
each prompt token: llama.cpp's unified KV cache masks every token's attention over every cell
in use, so a voice decode slows while background summaries hold cells. The two are separate
terms because they are different work: a decode reads every held cell for one query (memory
bound), a prompt chunk reads them once for many queries (compute bound, and on a GPU far
cheaper per query); one shared coefficient, fitted to decodes, overcharged every prompt chunk
that ran beside held cells.

A profile gives each term's value, fitted from `fairlane bench engine` sweeps
(`fairlane profile fit`, `fairlane.profiles.fit`). The real engines feed measured step times
back through `observe()`, and a least-squares fit over the recent steps, held to the device's
common scale where they say nothing, learns one multiplier per term, so a device whose prefill
is slower but whose decode is faster than the profile says is learned term by term. A
multiplier the fit would move out of `PLAUSIBLE` is not a device that differs from its profile
but a cost the model's form lacks: predictions keep the term's last plausible multiplier and
the term is reported (`form_errors`, in /v1/stats' `cost_fit`), not clamped silently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fairlane.policy.plan import EmbedPlan, LlmPlan, StepPlan, SttPlan
from fairlane.policy.request import Kind


@dataclass(frozen=True)
class LlmCost:
    base_ms: float  # every iteration
    prefill_token_ms: float  # per prompt token
    decode_seq_ms: float  # per decoding sequence
    context_token_us: float = 0.0  # per KV position a sequence's chunk attends to
    prefill_base_ms: float = 0.0  # an iteration that carries a prompt chunk
    attention_ns: float = 0.0  # per decoding sequence per KV cell held by all sequences
    prefill_attention_ns: float = 0.0  # per prompt token per KV cell held by all sequences
    # An iteration right after other engines' steps on the same loop pays this share of their
    # time again (up to `SWITCH_CAP_S` of it): on a CPU the embedder's or Whisper's run leaves
    # the caches cold, the more so the longer it ran (a decode after a 15-30 ms embedding step
    # ~1 ms slower, after a 45 ms one ~12 ms; docs/history/benchmarks.md).
    switch_share: float = 0.0


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
class TtsCost:
    base_ms: float
    phoneme_ms: float  # per phoneme synthesised (about 12 per second of speech)


@dataclass(frozen=True)
class HostCost:
    """The host around the device, which no step's cost holds: a client's round trip, from an
    answer to the same client's next request (its JSON, its HTTP, the server's admission),
    while the device runs whatever else is queued. Only the simulator uses it: the server
    lives it."""

    round_trip_ms: float = 0.0


# A profile that predates speech synthesis: this machine's measured Piper voice (cpu-2core.yaml).
DEFAULT_TTS = TtsCost(base_ms=8.0, phoneme_ms=2.1)


@dataclass(frozen=True)
class CostProfile:
    name: str
    llm: LlmCost
    embed: EmbedCost
    stt: SttCost
    description: str = ""
    tts: TtsCost = DEFAULT_TTS
    host: HostCost = HostCost()


@dataclass
class OnlineFit:
    """Exponentially weighted least squares for the multipliers of a step's cost terms, each
    held towards the device's common scale where the recent steps say nothing about it.

    Each observation is divided by its own size, so the fit minimises relative error: a 2 s
    prefill step and a 20 ms decode step count alike. Two fits run side by side: one scale for
    all the terms (a device uniformly 2× slower is learned exactly), and a multiplier per term,
    pulled towards that scale with the weight of `prior` steps. Without the pull, a run of
    steps of one shape (a summary's decodes: the base, per-sequence and context terms move
    together) let the terms drift apart in opposite directions while their sum fitted, until
    they sat against the plausible range and every later decode was predicted 2× wrong
    (docs/history/benchmarks.md, "The online fit held to its scale, and a decode after an embedding
    batch").
    """

    size: int
    forget: float = 0.98
    prior: float = 0.3  # how many steps' worth of evidence the pull towards the scale weighs
    weights: list[float] = field(default_factory=list)  # what predictions use
    last_proposed: list[float] = field(default_factory=list)  # the fit's solution, unrefused
    scale: float = 1.0

    def __post_init__(self) -> None:
        self.weights = [1.0] * self.size
        self.last_proposed = [1.0] * self.size
        self._information = np.zeros((self.size, self.size))
        self._pull = self.prior * np.eye(self.size)
        self._moment = np.zeros(self.size)
        self._scale_moments = (0.0, 0.0)  # Σ u, Σ u² of u = the profile's prediction ÷ measured

    def update(self, terms: tuple[float, ...], measured: float) -> list[int]:
        """Fold in one step; the terms whose solution was refused as implausible (they keep
        their last plausible multiplier, and the fit keeps the evidence)."""
        x = np.asarray(terms, dtype=float) / max(measured, 1e-3)
        if not np.all(np.isfinite(x)):  # not evidence of anything
            return []
        u = float(x.sum())
        first, second = self._scale_moments
        self._scale_moments = (self.forget * first + u, self.forget * second + u * u)
        if self._scale_moments[1] > 0:
            self.scale = self._scale_moments[0] / self._scale_moments[1]
        self._information = self.forget * self._information + np.outer(x, x)
        self._moment = self.forget * self._moment + x  # each relative target is 1.0
        solved = np.linalg.solve(
            self._information + self._pull, self._moment + self.prior * self.scale
        )
        self.last_proposed = solved.tolist()
        refused = [
            i for i, w in enumerate(self.last_proposed) if not PLAUSIBLE[0] <= w <= PLAUSIBLE[1]
        ]
        self.weights = [
            old if i in refused else new
            for i, (old, new) in enumerate(zip(self.weights, self.last_proposed, strict=True))
        ]
        return refused


# Other engines' time beyond this adds nothing to the switch term: the measurements end at
# ~60 ms steps, and what a cold cache costs cannot grow without bound.
SWITCH_CAP_S = 0.1


def _whole(count: float) -> int:
    """How many whole tokens fit: a budget met exactly (up to the fit's rounding) is met."""
    return math.floor(count + 1e-9)


# A term's multiplier beyond these is not a device that differs from its profile: the model's
# form lacks a cost (or the profile is of another device). Predictions keep the term's last
# plausible multiplier, and the term is reported.
PLAUSIBLE = (0.2, 5.0)
TERMS: dict[Kind, tuple[str, ...]] = {
    Kind.LLM: (
        "base",
        "prefill_base",
        "prefill_token",
        "decode_seq",
        "context_token",
        "attention",
        "prefill_attention",
        "switch",
    ),
    Kind.EMBED: ("base", "token"),
    Kind.STT: ("base", "utterance", "audio_s"),
    Kind.TTS: ("base", "phoneme"),
}


@dataclass
class CostModel:
    """Predicts step times from a profile, each term corrected online from measured steps."""

    profile: CostProfile
    fits: dict[Kind, OnlineFit] = field(
        default_factory=lambda: {k: OnlineFit(len(names)) for k, names in TERMS.items()}
    )
    # Per engine and term: how many updates were refused as implausible, and the last
    # multiplier the fit proposed (a model-form error: see the module's docstring).
    form_errors: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)

    # --- each engine's terms, in milliseconds as the profile states them --------------------

    def _llm_terms(
        self, prefill: int, decodes: int, context: int, held: int, after_other_s: float = 0.0
    ) -> tuple[float, ...]:
        c = self.profile.llm
        return (
            c.base_ms,
            c.prefill_base_ms if prefill else 0.0,
            c.prefill_token_ms * prefill,
            c.decode_seq_ms * decodes,
            c.context_token_us * context / 1000.0,
            c.attention_ns * decodes * held / 1e6,
            c.prefill_attention_ns * prefill * held / 1e6,
            c.switch_share * min(after_other_s, SWITCH_CAP_S) * 1000.0,
        )

    def _embed_terms(self, padded_tokens: int) -> tuple[float, ...]:
        return (self.profile.embed.base_ms, self.profile.embed.token_ms * padded_tokens)

    def _stt_terms(self, utterances: int, audio_s: float) -> tuple[float, ...]:
        c = self.profile.stt
        return (c.base_ms, c.utterance_ms * utterances, c.audio_s_ms * audio_s)

    def _tts_terms(self, phonemes: int) -> tuple[float, ...]:
        return (self.profile.tts.base_ms, self.profile.tts.phoneme_ms * phonemes)

    def _seconds(self, kind: Kind, terms: tuple[float, ...]) -> float:
        weights = self.fits[kind].weights
        return sum(w * t for w, t in zip(weights, terms, strict=True)) / 1000.0

    # --- predictions ---------------------------------------------------------------------------

    def llm_s(
        self,
        prefill_tokens: int,
        decode_seqs: int,
        context_tokens: int,
        held_tokens: int = 0,
        after_other_s: float = 0.0,
    ) -> float:
        """An iteration of this shape; `held_tokens`: KV cells in use by all sequences;
        `after_other_s`: the time other engines' steps ran since the last LLM step."""
        return self._seconds(
            Kind.LLM,
            self._llm_terms(
                prefill_tokens, decode_seqs, context_tokens, held_tokens, after_other_s
            ),
        )

    def embed_s(self, padded_tokens: int) -> float:
        return self._seconds(Kind.EMBED, self._embed_terms(padded_tokens))

    def stt_s(self, utterances: int, audio_s: float) -> float:
        return self._seconds(Kind.STT, self._stt_terms(utterances, audio_s))

    def tts_s(self, phonemes: int) -> float:
        return self._seconds(Kind.TTS, self._tts_terms(phonemes))

    def plan_s(self, plan: StepPlan) -> float:
        """What a plan of this shape costs on this device."""
        return self._seconds(plan.kind, self._terms(plan))

    def _terms(self, plan: StepPlan) -> tuple[float, ...]:
        if isinstance(plan, LlmPlan):
            return self._llm_terms(
                plan.prefill_tokens,
                plan.decode_seqs,
                plan.context_tokens,
                plan.held_tokens,
                plan.after_other_s,
            )
        if isinstance(plan, EmbedPlan):
            return self._embed_terms(plan.padded_tokens)
        if isinstance(plan, SttPlan):
            return self._stt_terms(len(plan.request_ids), plan.audio_s)
        return self._tts_terms(plan.phonemes)

    def fixed_s(self, kind: Kind) -> float:
        """The part of a step's cost that batching shares (what a batch window can save)."""
        base = {
            Kind.LLM: self.profile.llm.base_ms,
            Kind.EMBED: self.profile.embed.base_ms,
            Kind.STT: self.profile.stt.base_ms,
            Kind.TTS: self.profile.tts.base_ms,
        }[kind]
        return base * self.fits[kind].weights[0] / 1000.0

    def switch_share(self) -> float:
        """The share of other engines' step time the next LLM step pays again, as learned."""
        return self.fits[Kind.LLM].weights[7] * self.profile.llm.switch_share

    def prompt_fixed_s(self) -> float:
        """The fixed cost an LLM iteration pays for carrying a prompt chunk at all."""
        return self.fits[Kind.LLM].weights[1] * self.profile.llm.prefill_base_ms / 1000.0

    def prefill_tokens_within(
        self,
        budget_s: float,
        prefill_tokens: int,
        decode_seqs: int,
        context_tokens: int,
        held_tokens: int = 0,
        position: int = 0,
        after_other_s: float = 0.0,
    ) -> int:
        """The most extra prefill tokens an iteration can carry and still finish in `budget_s`
        (each new token is held and attended to as well); `position`: where the chunk starts in
        its sequence (a chunk at position p with n tokens adds p + n to the context)."""
        spare_s = budget_s - self.llm_s(
            prefill_tokens, decode_seqs, context_tokens + position, held_tokens, after_other_s
        )
        w = self.fits[Kind.LLM].weights
        c = self.profile.llm
        if not prefill_tokens:  # the first prompt chunk brings the prompt's fixed cost
            spare_s -= w[1] * c.prefill_base_ms / 1000.0
        # n more tokens cost linear_ms · n + square_ms · n²: each is a prompt token attending
        # to its position and to every cell held, the n new ones included (unified KV), and a
        # cell more for every decoding sequence (and every prompt token already planned).
        linear_ms = (
            w[2] * c.prefill_token_ms
            + w[4] * c.context_token_us / 1000.0
            + w[5] * c.attention_ns * decode_seqs / 1e6
            + w[6] * c.prefill_attention_ns * (prefill_tokens + held_tokens) / 1e6
        )
        square_ms = w[6] * c.prefill_attention_ns / 1e6
        spare_ms = spare_s * 1000.0
        if spare_ms <= 0 or linear_ms + square_ms <= 0:
            return 0
        if square_ms <= 0:
            return _whole(spare_ms / linear_ms)
        root = (-linear_ms + math.sqrt(linear_ms**2 + 4 * square_ms * spare_ms)) / (2 * square_ms)
        return _whole(root)

    def embed_tokens_within(self, budget_s: float) -> int:
        """The most padded tokens one embedding micro-batch can hold within `budget_s`."""
        w = self.fits[Kind.EMBED].weights
        c = self.profile.embed
        spare_ms = budget_s * 1000.0 - w[0] * c.base_ms
        if spare_ms <= 0 or c.token_ms <= 0:
            return 0
        return _whole(spare_ms / (w[1] * c.token_ms))

    # --- learning ------------------------------------------------------------------------------

    def observe(self, plan: StepPlan, measured_s: float) -> None:
        """Fold a measured step time into the fit of its engine's terms."""
        if measured_s <= 0:
            return
        refused = self.fits[plan.kind].update(self._terms(plan), measured_s * 1000.0)
        for index in refused:
            errors = self.form_errors.setdefault(plan.kind.value, {})
            entry = errors.setdefault(TERMS[plan.kind][index], {"refused": 0, "proposed": 0.0})
            entry["refused"] += 1
            entry["proposed"] = round(self.fits[plan.kind].last_proposed[index], 3)

    def weights(self) -> dict[str, dict[str, float]]:
        """Each engine's learned multiplier per profile term (1.0: as the profile says)."""
        return {
            kind.value: {n: round(w, 3) for n, w in zip(TERMS[kind], fit.weights, strict=True)}
            for kind, fit in self.fits.items()
        }
