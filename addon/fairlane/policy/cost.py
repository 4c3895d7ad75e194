"""The cost model: how long a step of a given shape takes on this device.

Linear in the quantities that dominate each engine (Sarathi-Serve and vLLM's own profiling use the
same shape): an LLM iteration pays a fixed launch/weight-read cost, a cost per prefill token, a
cost per decoding sequence and a cost per KV position attended to. A profile gives each term's
starting value; the real engines feed measured step times back through `observe()`, and a
recursive least-squares fit learns one multiplier per term, so a device whose prefill is slower
but whose decode is faster than the profile says is learned term by term, not as one average.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fairlane.policy.plan import EmbedPlan, LlmPlan, StepPlan, SttPlan
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
class TtsCost:
    base_ms: float
    phoneme_ms: float  # per phoneme synthesised (about 12 per second of speech)


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


@dataclass
class OnlineFit:
    """Recursive least squares for the multipliers of a step's cost terms, with forgetting.

    Each observation is divided by its own size, so the fit minimises relative error: a 2 s
    prefill step and a 20 ms decode step count alike. A term that no recent step exercised keeps
    its value (its variance is capped, so it cannot wind up while unobserved).
    """

    size: int
    forget: float = 0.98
    prior_var: float = 100.0  # of a multiplier, relative to the noise of one relative error
    weights: list[float] = field(default_factory=list)
    cov: list[list[float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.weights = [1.0] * self.size
        self._reset_cov()

    def update(self, terms: tuple[float, ...], measured: float) -> None:
        scale = max(measured, 1e-3)
        x = [t / scale for t in terms]
        y = measured / scale
        px = [sum(row[j] * x[j] for j in range(self.size)) for row in self.cov]
        denom = self.forget + sum(x[i] * px[i] for i in range(self.size))
        if not math.isfinite(denom) or denom < self.forget:  # P lost its shape to rounding
            self._reset_cov()
            return
        gain = [v / denom for v in px]
        error = y - sum(w * v for w, v in zip(self.weights, x, strict=True))
        self.weights = [
            min(max(w + g * error, MIN_WEIGHT), MAX_WEIGHT)
            for w, g in zip(self.weights, gain, strict=True)
        ]
        n = self.size
        cov = [
            [(self.cov[i][j] - gain[i] * px[j]) / self.forget for j in range(n)] for i in range(n)
        ]
        # Keep P symmetric and its variances positive and capped (a congruence scaling keeps
        # it valid): a direction no recent step exercised cannot wind up, and rounding over
        # thousands of identical steps cannot make it indefinite.
        for i in range(n):
            for j in range(i):
                cov[i][j] = cov[j][i] = (cov[i][j] + cov[j][i]) / 2
        for i in range(n):
            if not cov[i][i] > MIN_VAR:
                self._reset_cov()
                return
            if cov[i][i] > self.prior_var:
                shrink = math.sqrt(self.prior_var / cov[i][i])
                for j in range(n):
                    cov[i][j] *= shrink
                    cov[j][i] *= shrink
        self.cov = cov

    def _reset_cov(self) -> None:
        """Forget the fit's confidence, not its weights: the next steps re-learn the shape."""
        self.cov = [
            [self.prior_var if i == j else 0.0 for j in range(self.size)] for i in range(self.size)
        ]


MIN_WEIGHT, MAX_WEIGHT = 0.05, 20.0
MIN_VAR = 1e-12
TERMS: dict[Kind, tuple[str, ...]] = {
    Kind.LLM: ("base", "prefill_token", "decode_seq", "context_token"),
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

    # --- each engine's terms, in milliseconds as the profile states them --------------------

    def _llm_terms(self, prefill: int, decodes: int, context: int) -> tuple[float, ...]:
        c = self.profile.llm
        return (
            c.base_ms,
            c.prefill_token_ms * prefill,
            c.decode_seq_ms * decodes,
            c.context_token_us * context / 1000.0,
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

    def llm_s(self, prefill_tokens: int, decode_seqs: int, context_tokens: int) -> float:
        return self._seconds(Kind.LLM, self._llm_terms(prefill_tokens, decode_seqs, context_tokens))

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
            return self._llm_terms(plan.prefill_tokens, plan.decode_seqs, plan.context_tokens)
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

    def prefill_tokens_within(
        self, budget_s: float, prefill_tokens: int, decode_seqs: int, context_tokens: int
    ) -> int:
        """The most extra prefill tokens an iteration can carry and still finish in `budget_s`."""
        spare_s = budget_s - self.llm_s(prefill_tokens, decode_seqs, context_tokens)
        w = self.fits[Kind.LLM].weights
        c = self.profile.llm
        per_token_s = (w[1] * c.prefill_token_ms + w[3] * c.context_token_us / 1000.0) / 1000.0
        if spare_s <= 0 or per_token_s <= 0:
            return 0
        return math.floor(spare_s / per_token_s)

    def embed_tokens_within(self, budget_s: float) -> int:
        """The most padded tokens one embedding micro-batch can hold within `budget_s`."""
        w = self.fits[Kind.EMBED].weights
        c = self.profile.embed
        spare_ms = budget_s * 1000.0 - w[0] * c.base_ms
        if spare_ms <= 0 or c.token_ms <= 0:
            return 0
        return math.floor(spare_ms / (w[1] * c.token_ms))

    # --- learning ------------------------------------------------------------------------------

    def observe(self, plan: StepPlan, measured_s: float) -> None:
        """Fold a measured step time into the fit of its engine's terms."""
        if measured_s <= 0:
            return
        self.fits[plan.kind].update(self._terms(plan), measured_s * 1000.0)

    def weights(self) -> dict[str, dict[str, float]]:
        """Each engine's learned multiplier per profile term (1.0: as the profile says)."""
        return {
            kind.value: {n: round(w, 3) for n, w in zip(TERMS[kind], fit.weights, strict=True)}
            for kind, fit in self.fits.items()
        }
