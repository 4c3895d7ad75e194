"""Plans (what the device runs next) and results (what came back): frozen, plain data.

`schedule()` returns exactly one plan; the device loop (or the simulator) executes it and hands a
`StepResult` back to `update_from_output()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from fairlane.policy.request import Kind, Priority


class Chunk(NamedTuple):
    """`num_tokens` tokens of one sequence, starting at KV position `start`.

    A decode is a chunk of one token; a prefill chunk is a slice of the prompt. (A named tuple,
    not a dataclass: an iteration builds dozens of these and the decision must take microseconds.)
    """

    request_id: str
    start: int
    num_tokens: int
    samples: bool  # the chunk reaches the end of what is known: the engine samples a token
    decode: bool  # one fed-back token of a sequence that is generating
    priority: Priority


@dataclass(frozen=True)
class LlmPlan:
    """One LLM iteration: one batch over many sequences (one `llama_decode` call)."""

    chunks: tuple[Chunk, ...]
    preempted: tuple[str, ...]  # sequences whose KV must be dropped before this step
    predicted_s: float
    context_tokens: int  # KV positions attended to, for the cost model
    held_tokens: int = 0  # KV cells in use by all sequences while it runs (unified KV)
    # How long the policy let its background work make the step (a slice, an ITL budget, or
    # the arrival wait when nobody is talking); None: no time bound, only batch limits.
    budget_s: float | None = None
    # How long other engines' steps ran on this loop since the last LLM step (an embedding
    # batch, a transcription): they leave the caches cold, and the step costs more.
    after_other_s: float = 0.0

    kind = Kind.LLM

    @property
    def prefill_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks if not c.decode)

    @property
    def decode_seqs(self) -> int:
        return sum(1 for c in self.chunks if c.decode)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def request_ids(self) -> tuple[str, ...]:
        return tuple(c.request_id for c in self.chunks)


@dataclass(frozen=True)
class EmbedPlan:
    """One embedding micro-batch, sorted by length to cut padding."""

    request_ids: tuple[str, ...]
    priority: Priority
    padded_tokens: int  # batch size × longest text: what the device really computes
    predicted_s: float
    budget_s: float | None = None  # as `LlmPlan.budget_s`

    kind = Kind.EMBED


@dataclass(frozen=True)
class SttPlan:
    """One speech-to-text batch: every utterance in it is encoded and decoded together."""

    request_ids: tuple[str, ...]
    priority: Priority
    audio_s: float
    predicted_s: float
    budget_s: float | None = None  # as `LlmPlan.budget_s`

    kind = Kind.STT


@dataclass(frozen=True)
class TtsPlan:
    """One speech-synthesis batch: sentences (of one reply or several) synthesised together."""

    request_ids: tuple[str, ...]
    priority: Priority
    phonemes: int  # batch size × longest sentence, in phonemes: what the voice really computes
    predicted_s: float
    budget_s: float | None = None  # as `LlmPlan.budget_s`

    kind = Kind.TTS


@dataclass(frozen=True)
class IdlePlan:
    """Nothing to run now. `wake_at` is when a held batch window closes, if one is open."""

    wake_at: float | None = None
    reason: str = "no work"


Plan = LlmPlan | EmbedPlan | SttPlan | TtsPlan | IdlePlan
StepPlan = LlmPlan | EmbedPlan | SttPlan | TtsPlan


@dataclass(frozen=True)
class SeqOutput:
    """What one request produced in a step."""

    request_id: str
    new_tokens: int = 0  # LLM: tokens sampled (0 or 1)
    finished: bool = False  # EOS, a stop string, or an embedding/transcript delivered


@dataclass(frozen=True)
class StepResult:
    """The executor's answer for one plan: the measured duration and per-request outputs."""

    elapsed_s: float
    outputs: tuple[SeqOutput, ...] = ()
    # Of elapsed_s, the time inside the device call itself (llama_decode); the rest is the
    # engine's host work (batch filling, sampling). None: all of it was device work.
    device_s: float | None = None


@dataclass(frozen=True)
class Admission:
    """The answer to `add()`: accepted, or refused at once with a reason a person can read.

    `retryable` tells the client whether the same request may succeed later (a full queue, a
    deadline the backlog cannot meet: HTTP 429) or never will (too large: HTTP 400);
    `unavailable`, that no request of its kind can run until the server restarts (its device
    loop stopped on a fault: HTTP 503).
    """

    accepted: bool
    reason: str = ""
    predicted_wait_s: float = 0.0
    retryable: bool = True
    unavailable: bool = False
