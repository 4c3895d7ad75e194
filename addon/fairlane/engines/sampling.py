"""Sampling: a token for each sequence from its logits, under its output grammar if it has one.

The LLM engine (engines.llm) runs one `llama_decode` a step and hands the logits here. Greedy
sequences take the argmax; a temperature is one `draw` over the row; top-p goes through
llama.cpp's sampler chain. A sequence with a grammar (JSON mode, tool calls, `fairlane_words`)
first chooses as if free, and only when the grammar refuses that token are the forbidden tokens
masked and the choice made again, as llama.cpp's own server does: checking one token is cheap,
masking all 151,936 is not (~20 ms a step on this CPU).

Grammar work is bounded in time. llama.cpp's grammar follows every reading of an ambiguous
grammar at once, so a schema can make one check slow and a mask of the vocabulary slower by
about a thousand times (measured: 28 ms and 28 s). Each sequence's grammar work in a step is
timed (`GrammarWork`); past its budget, or before a mask predicted to pass it, the sequence
ends with finish reason `grammar_budget` and the step goes on for everyone else. The API
refuses the schemas known to do this before they get here (api.response_format).
"""

from __future__ import annotations

import bisect
import ctypes
import re
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from fairlane.engines.native import import_llama_cpp

lc = import_llama_cpp()

# A mask of the vocabulary costs about this many single-token checks (measured on the default
# model's 151,936 tokens: 160-550 times where a mask takes 20 ms to 2 s, 1,000 times past
# that, where the prediction is far over any budget anyway).
MASK_COST = 300
GRAMMAR_OVER_BUDGET = "grammar_budget"  # the finish reason of a sequence past its budget


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    grammar: str | None = None  # GBNF the output must match (JSON mode), rule `root`
    # With triggers the grammar is lazy: the reply is free until its text matches one of these
    # regular expressions (searched in the UTF-8 text so far); from the token where the match
    # (or its first group) starts on, it must follow the grammar (a tool call after a free
    # start). The token that completes the match is the grammar's: refused, it is replaced.
    grammar_triggers: tuple[str, ...] = ()




def greedy(params: SamplingParams) -> bool:
    """Whether the next token is the most likely one the grammar (if any) allows."""
    return params.temperature <= 0


# The draw's head: logits within this many temperatures of the largest. They carry most of
# the weight; the rest of the vocabulary is summed in one pass and walked only when the draw
# lands there.
HEAD_TEMPERATURES = 8.0


def drawn_here(params: SamplingParams) -> bool:
    """Whether `draw` samples for these parameters (a temperature, maybe top-k); the rest
    (top-p) go through llama.cpp's sampler chain."""
    return params.temperature > 0 and params.top_p >= 1.0


def draw(row: Any, params: SamplingParams, rng: np.random.Generator) -> int:
    """One token from a row of logits, with the distribution of llama.cpp's `top_k →
    temperature → seeded draw`: an inverse-CDF draw over the tokens in a fixed order, head
    first. llama.cpp's chain builds and sorts a candidate list of the whole vocabulary, ~1.8 ms
    a sequence on this CPU; this is one exp-and-sum pass over it."""
    if 0 < params.top_k < len(row):
        keep = np.argpartition(row, -params.top_k)[-params.top_k :]
        weights = np.exp((row[keep] - row[keep].max()) / params.temperature, dtype=np.float64)
        cumulative = np.cumsum(weights)
        index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
        return int(keep[min(index, len(keep) - 1)])
    top = float(row.max())
    scaled = (row - top) * np.float32(1.0 / params.temperature)
    head = np.flatnonzero(scaled >= -HEAD_TEMPERATURES)
    weights = np.exp(scaled, out=scaled)  # every token's weight, in place
    target = rng.random() * float(weights.sum(dtype=np.float64))
    head_weights = np.cumsum(weights[head], dtype=np.float64)
    if target < head_weights[-1]:
        index = int(np.searchsorted(head_weights, target, side="right"))
        return int(head[min(index, len(head) - 1)])
    weights[head] = 0.0  # the tail, in vocabulary order
    tail = np.cumsum(weights, dtype=np.float64)
    index = int(np.searchsorted(tail, target - head_weights[-1], side="right"))
    return min(index, len(row) - 1)


class Grammar:
    """A sequence's output grammar (llama.cpp's sampler, without its lazy mode).

    Lazy grammars wait here, not in llama.cpp: llama.cpp feeds a trigger's text to the grammar
    and aborts the process when the grammar refuses it. Here the tokens since the match's start
    are offered one by one, each checked before it is accepted; if one is refused the grammar
    is dropped and the reply stays free."""

    def __init__(self, sampler: Any, triggers: tuple[str, ...]) -> None:
        self.sampler = sampler
        self.triggers = tuple(re.compile(t.encode()) for t in triggers)
        self.armed = not triggers
        self.text = bytearray()  # the reply so far, while waiting
        self.starts: list[int] = []  # where each of its tokens starts in `text`
        self.tokens: list[int] = []

    def trigger(self, token: int, piece: bytes, work: GrammarWork) -> bool:
        """Note a free token; arm the grammar if a trigger now matches (from its first group,
        or else the whole match). The tokens before this one, from the match on, are offered to
        the grammar; this one is then checked as any armed token is (replaced by the grammar's
        choice if refused). False: the grammar refused one of those before it."""
        self.starts.append(len(self.text))
        self.tokens.append(token)
        self.text += piece
        for pattern in self.triggers:
            if (match := pattern.search(self.text)) is None:
                continue
            start = match.start(1) if pattern.groups else match.start()
            first = bisect.bisect_right(self.starts, start) - 1
            for replayed in self.tokens[first:-1]:
                if not work.allows(self.sampler, replayed):
                    return False
                work.accept(self.sampler, replayed)
            self.armed = True
            self.text.clear()
            return True
        return True

    def close(self) -> None:
        lc.llama_sampler_free(self.sampler)


class Candidates:
    """llama.cpp's candidate arrays for a grammar: one token, or the whole vocabulary."""

    DTYPE = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])

    def __init__(self, n_vocab: int) -> None:
        self.one = np.zeros(1, self.DTYPE)
        self.all = np.zeros(n_vocab, self.DTYPE)
        self.all["id"] = np.arange(n_vocab, dtype=np.int32)
        self._one = self._array(self.one)
        self._all = self._array(self.all)

    @staticmethod
    def _array(data: Any) -> Any:
        return lc.llama_token_data_array(
            data=data.ctypes.data_as(lc.llama_token_data_p),
            size=len(data),
            selected=-1,
            sorted=False,
        )

    def allows(self, grammar: Any, token: int) -> bool:
        """Whether the grammar, in its present state, allows `token` next."""
        self.one[0] = (token, 0.0, 0.0)
        self._one.size, self._one.selected, self._one.sorted = 1, -1, False
        lc.llama_sampler_apply(grammar, ctypes.byref(self._one))
        return bool(np.isfinite(self.one["logit"][0]))

    def mask(self, grammar: Any, row: Any) -> bool:
        """Set the logits of every token the grammar forbids to -inf in `row`; whether any
        token is left."""
        self.all["logit"] = row
        self.all["p"] = 0.0
        self._all.size, self._all.selected, self._all.sorted = len(self.all), -1, False
        lc.llama_sampler_apply(grammar, ctypes.byref(self._all))
        row[:] = self.all["logit"]
        return bool(np.isfinite(row).any())


class Sampled(Protocol):
    """What sampling reads of a sequence (engines.llm.Sequence)."""

    params: SamplingParams
    grammar: Grammar | None
    sampler: Any  # llama.cpp's chain, for top-p
    rng: np.random.Generator


class OverBudget(Exception):
    """A sequence's grammar work in one step passed, or would pass, its budget."""


class GrammarWork:
    """One sequence's grammar work in one step, timed against its budget."""

    def __init__(
        self, candidates: Candidates, budget_s: float, clock: Callable[[], float]
    ) -> None:
        self.candidates = candidates
        self.budget_s = budget_s
        self.clock = clock
        self.spent = 0.0
        # The fastest single-token check this step: a mask costs MASK_COST times it. (The
        # fastest, not the slowest: a check the OS or another thread delayed says nothing of
        # the grammar, and a slow grammar makes every check slow.)
        self.fastest_check: float | None = None

    def allows(self, grammar: Any, token: int) -> bool:
        start = self.clock()
        allowed = self.candidates.allows(grammar, token)
        took = self.clock() - start
        self.fastest_check = took if self.fastest_check is None else min(self.fastest_check, took)
        self._spend(took)
        return allowed

    def accept(self, grammar: Any, token: int) -> None:
        start = self.clock()
        lc.llama_sampler_accept(grammar, token)
        self._spend(self.clock() - start)

    def best_allowed(self, grammar: Any, row: Any, among: int = 256) -> int | None:
        """The most likely token the grammar allows, if it is among the `among` most likely
        (ties to the lower id, as argmax): then it is the argmax over all allowed tokens, found
        in a few single-token checks instead of a mask over the vocabulary (~12 ms here)."""
        top = np.argpartition(row, -among)[-among:]
        for token in top[np.lexsort((top, -row[top]))]:
            if self.allows(grammar, int(token)):
                return int(token)
        return None

    def mask(self, grammar: Any, row: Any) -> bool:
        """`Candidates.mask`, unless it is predicted to pass the budget (OverBudget)."""
        predicted = (self.fastest_check or 0.0) * MASK_COST
        if self.spent + predicted > self.budget_s:
            raise OverBudget(
                f"its grammar would take ~{predicted * 1000:.0f} ms to mask the vocabulary "
                f"in one step; the budget is {self.budget_s * 1000:.0f} ms"
            )
        start = self.clock()
        any_left = self.candidates.mask(grammar, row)
        self._spend(self.clock() - start)
        return any_left

    def _spend(self, seconds: float) -> None:
        self.spent += seconds
        if self.spent > self.budget_s:
            raise OverBudget(
                f"its grammar took {self.spent * 1000:.0f} ms in one step; the budget is "
                f"{self.budget_s * 1000:.0f} ms"
            )


@dataclass
class Sampler:
    """Chooses each sampling sequence's next token from the last decode's logits."""

    vocab: Any
    ctx: Any
    n_vocab: int
    grammar_budget_s: float
    clock: Callable[[], float] = time.perf_counter

    def __post_init__(self) -> None:
        self._piece = ctypes.create_string_buffer(256)
        self._candidates = Candidates(self.n_vocab)

    def sample(
        self, sampling: Seq[Sampled], positions: list[int], logits: Any
    ) -> list[int | OverBudget]:
        """The next token of each sequence (logits: one row each, in order), or OverBudget for
        a sequence whose grammar passed its budget (its grammar is then closed)."""
        if all(greedy(seq.params) and seq.grammar is None for seq in sampling):
            return logits.argmax(axis=1).tolist()  # type: ignore[no-any-return]
        tokens: list[int | OverBudget] = []
        for i, (seq, position) in enumerate(zip(sampling, positions, strict=True)):
            row = logits[i]
            token = self._choose(seq, row, position)
            if seq.grammar is not None:
                work = GrammarWork(self._candidates, self.grammar_budget_s, self.clock)
                try:
                    token = self._constrain(seq, seq.grammar, token, row, position, work)
                except OverBudget as err:
                    seq.grammar.close()
                    seq.grammar = None
                    tokens.append(err)
                    continue
            tokens.append(token)
        return tokens

    def _constrain(
        self, seq: Sampled, grammar: Grammar, token: int, row: Any, position: int,
        work: GrammarWork,
    ) -> int:
        """The token the grammar allows in place of `token` (itself when it is allowed)."""
        if not grammar.armed:  # a lazy grammar: free text until a trigger matches
            if not grammar.trigger(token, self._token_bytes(token), work):
                seq.grammar = None  # what the trigger caught does not parse: it stays free
                grammar.close()
            if not grammar.armed:
                return token
        if not work.allows(grammar.sampler, token):
            best = None
            if greedy(seq.params):  # the best allowed is likely among the few best: no mask
                best = work.best_allowed(grammar.sampler, row)
            if best is None:
                if not work.mask(grammar.sampler, row):  # in place, in the logits
                    return int(lc.llama_vocab_eos(self.vocab))  # nothing is allowed: the end
                best = self._choose(seq, row, position)
            token = best
        # Never a token the grammar refuses: llama.cpp aborts the process on one.
        work.accept(grammar.sampler, token)
        return token

    def _token_bytes(self, token: int) -> bytes:
        size = lc.llama_token_to_piece(self.vocab, token, self._piece, len(self._piece), 0, False)
        return self._piece.raw[: max(size, 0)]

    def _choose(self, seq: Sampled, row: Any, position: int) -> int:
        if greedy(seq.params):
            return int(row.argmax())
        if drawn_here(seq.params):
            return draw(row, seq.params, seq.rng)
        # top-p: llama.cpp's chain reads this row of the context's logits (masked or not)
        return int(lc.llama_sampler_sample(seq.sampler, self.ctx, position))
