"""The lanes Fairlane's policy schedules: a fair queue per engine and class, each class's arrival
rate, and the rules every kind of step shares (which sequence may evict which, a stream's ITL
budget). The steps are built in `batch_steps` (speech, synthesis, embeddings) and `llm_step`
(the LLM iteration); `scheduler` ranks the lanes and runs the step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fairlane.policy.base import DeviceShare, Policy
from fairlane.policy.config import PolicyConfig
from fairlane.policy.cost import CostModel
from fairlane.policy.fairness import FairQueue
from fairlane.policy.request import Kind, Priority, Request

# Within one class the speech lane goes first (the speaker is waiting for the transcript before
# the LLM turn can even start), then speech synthesis (a finished sentence is what the person
# hears next; its text is already there), then the LLM, then embeddings.
LANE_ORDER = {Kind.STT: 0, Kind.TTS: 1, Kind.LLM: 2, Kind.EMBED: 3}
INTERACTIVE = (Priority.VOICE, Priority.CHAT)
# VTC's service unit for speech: Whisper's encoder makes 50 frames per second of audio.
STT_TOKENS_PER_AUDIO_S = 50.0


def as_urgent(request: Request) -> Callable[[Request], bool]:
    """A running sequence may evict a less urgent one, or a newer one of its own class: it never
    takes KV from more urgent work, and within a class the newest yields (so no deadlock)."""
    return lambda other: (
        other.priority > request.priority
        or (other.priority is request.priority and other.order > request.order)
    )


def less_urgent(request: Request) -> Callable[[Request], bool]:
    """A new sequence may evict only strictly less urgent classes: interactive evicts
    background, never the reverse, and equals do not thrash each other."""
    return lambda other: other.priority > request.priority


@dataclass
class ArrivalRate:
    """Arrivals of one lane and class: the smoothed gap inside a burst (what batch windows rely
    on; a gap longer than the class's window is the pause between bursts, not a rate), and the
    smoothed gap between any two arrivals (whether someone is still talking)."""

    window_s: float
    mean_gap: float | None = None
    mean_pause: float | None = None
    last: float | None = None

    def observe(self, now: float) -> None:
        if self.last is not None:
            gap = max(0.0, now - self.last)
            if gap <= self.window_s:
                self.mean_gap = _smooth(self.mean_gap, gap)
            self.mean_pause = _smooth(self.mean_pause, gap)
        self.last = now

    def active(self, now: float) -> bool:
        """Arrivals are still coming: the last one is recent next to the usual pause."""
        if self.last is None or self.mean_pause is None:
            return False
        return now - self.last <= 2 * self.mean_pause

    def expected_next(self, now: float) -> float | None:
        """When the next arrival is due; None without a forecast or when it is overdue (the
        burst is over: waiting for it would hold the device idle for nothing)."""
        if self.mean_gap is None or self.last is None:
            return None
        expected = self.last + self.mean_gap
        return None if expected < now else expected


@dataclass(frozen=True)
class LaneChoice:
    kind: Kind
    priority: Priority
    budget_s: float | None  # a background step's time budget; None: bounded by batch limits
    owed: bool = False  # rule 8: a background slice taken ahead of interactive work

class Lanes(Policy):
    """A fair queue (VTC) and an arrival rate per lane and class, and the background device
    time each lane had."""

    def __init__(self, config: PolicyConfig, cost: CostModel) -> None:
        super().__init__(config, cost)
        self.waiting = {(k, p): FairQueue() for k in Kind for p in Priority}
        self.arrivals = {
            (k, p): ArrivalRate(config.batch_window_ms[p] / 1000.0) for k in Kind for p in Priority
        }
        # Background device time per lane, decayed: it rotates the background lanes (rule 8).
        self.lane_share: DeviceShare[Kind] = DeviceShare(config.share_window_s)
        self.last_interactive_end: float | None = None
        # Rule 2 beside rule 8: whether the last step was a slice owed to background.
        self.owed_last = False

    # --- queues ----------------------------------------------------------------------------

    def _enqueue(self, request: Request, now: float) -> None:
        self.waiting[request.kind, request.priority].push(request)
        self.arrivals[request.kind, request.priority].observe(now)

    def heard(self, kind: Kind, priority: Priority, at: float) -> None:
        self.arrivals[kind, priority].observe(at)

    def _requeue_preempted(self, request: Request) -> None:
        self.waiting[request.kind, request.priority].push_front(request)

    def _dequeue(self, request: Request) -> bool:
        return self.waiting[request.kind, request.priority].remove(request)

    def waiting_count(self, priority: Priority | None = None) -> int:
        return sum(len(q) for (_, p), q in self.waiting.items() if priority in (None, p))

    def _charge(self, request: Request, tokens: float) -> None:
        self.waiting[request.kind, request.priority].charge(request.client, tokens)

    def _dispatch(self, request: Request, now: float) -> None:
        """A waiting request's first step: it leaves its queue (the VTC floor moves to its
        client) and VTC charges its input once, not on recompute."""
        charge = 0.0
        if not request.charged_input:
            request.charged_input = True
            size = max(request.prompt_tokens, request.audio_s * STT_TOKENS_PER_AUDIO_S)
            charge = size * self.config.vtc_input_weight
        self.waiting[request.kind, request.priority].take(request, charge)
        self._start(request, now)

    def capacity_tokens(self, priority: Priority) -> int:
        return self.config.capacity_tokens(priority)

    def queue_limit(self, priority: Priority) -> float:
        return self.config.queue_limit[priority]

    def _itl_budget(self, request: Request) -> float | None:
        """Rule 4: how long after a stream's last token its next may come.

        The class's ITL target (less headroom); for voice also no more than `voice_pace` times
        what the stream's own decode step costs alone: text that is read keeps pace with a
        reader, but text that is spoken waits for whole sentences, so every token's delay
        delays what the person hears.
        """
        budget = self.config.itl_budget_s(request.priority)
        if request.priority is Priority.VOICE and budget is not None:
            alone = self.cost.llm_s(0, 1, request.computed_tokens, request.computed_tokens)
            budget = min(budget, self.config.voice_pace * alone)
        return budget


def _smooth(mean: float | None, value: float) -> float:
    return value if mean is None else 0.7 * mean + 0.3 * value


def tighter(a: float | None, b: float) -> float:
    """The smaller of two limits, where None is no limit."""
    return b if a is None else min(a, b)
