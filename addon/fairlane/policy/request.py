"""Request state as the policy sees it: counts of tokens and seconds, never the tokens themselves.

The engines own the real data (token ids, audio, text); the policy owns the bookkeeping that
decides what runs next. A request is one unit of schedulable work: one LLM turn, one text to
embed, one utterance to transcribe, or one sentence to speak.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, IntEnum


class Priority(IntEnum):
    """Classes of work, most urgent first: a smaller value always wins (DESIGN §2, rule 1)."""

    VOICE = 0
    CHAT = 1
    BACKGROUND = 2

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, value: str) -> Priority:
        try:
            return cls[value.upper()]
        except KeyError as err:
            names = ", ".join(p.label for p in cls)
            raise ValueError(f"unknown class {value!r}; expected one of {names}") from err

    @property
    def interactive(self) -> bool:
        return self is not Priority.BACKGROUND


class Kind(Enum):
    """Which engine (lane) a request runs on."""

    LLM = "llm"
    EMBED = "embed"
    STT = "stt"
    TTS = "tts"


NO_WAIT_LIMIT = float("inf")  # max_wait_s of a durable job: it waits its turn however long


class Status(Enum):
    WAITING = "waiting"  # queued, nothing computed (or preempted and reset)
    RUNNING = "running"  # holds KV (LLM) and is in the running batch
    FINISHED = "finished"
    CANCELLED = "cancelled"


@dataclass(slots=True, eq=False)
class Request:
    """One schedulable unit of work and its progress (compared by identity: queues find and
    drop a request without comparing its fields)."""

    id: str
    kind: Kind
    priority: Priority
    client: str
    arrival: float
    # LLM: prompt length and output cap. EMBED: text length. TTS: the sentence's phonemes.
    # STT: unused (audio_s instead).
    prompt_tokens: int = 0
    max_tokens: int = 0
    audio_s: float = 0.0
    # Interactive requests may carry a hard deadline for their first output (rule 9).
    deadline_s: float | None = None
    # The longest it may wait before its first step (the policy's max_wait_ms when None;
    # NO_WAIT_LIMIT for the server's own durable jobs).
    max_wait_s: float | None = None

    status: Status = Status.WAITING
    # Admission order, set by the policy: "newer" among requests that arrived together.
    order: int = 0
    # Tokens whose KV is in the cache. Preemption resets it to 0 (resume by recomputation).
    computed_tokens: int = 0
    # Leading prompt tokens whose KV the engine shares from its prefix cache: they live in the
    # cache's own budget (the engine keeps the entry while this request uses it), so this
    # request's KV blocks hold only the positions after them. Preemption resets it to 0.
    cached_tokens: int = 0
    output_tokens: int = 0
    preemptions: int = 0
    first_scheduled: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    charged_input: bool = field(default=False, repr=False)

    @property
    def target_tokens(self) -> int:
        """Tokens that must be in the KV cache before the next token can be sampled.

        The last sampled token is fed back in the next step, so a decoding sequence is one
        token short of its target; after a preemption the prompt and every generated token
        are recomputed together (vLLM's recompute mode).
        """
        return self.prompt_tokens + self.output_tokens

    @property
    def remaining_prefill(self) -> int:
        return self.target_tokens - self.computed_tokens

    @property
    def is_decode(self) -> bool:
        """One token to feed: the step is a decode, not a prefill chunk."""
        return self.output_tokens > 0 and self.remaining_prefill == 1

    def kv_tokens(self, positions: int) -> int:
        """KV positions this request must hold itself to have `positions` in the cache."""
        return max(0, positions - self.cached_tokens)

    @property
    def done(self) -> bool:
        return self.status in (Status.FINISHED, Status.CANCELLED)
