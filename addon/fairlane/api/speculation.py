"""Speculative chat turns: a reply begun on a guess of the request, kept for the request that
is the same turn and discarded otherwise.

A voice client knows the person's words before their turn is over: the transcript at the
speaker's first pause comes before the end of speech is declared. It may send the chat turn it
would send then, with `"fairlane_speculative": true`. The server admits and runs that turn like
any other (same class, same queue, same prefix cache) but holds its tokens, and answers 202 with
the guess's id at once.

The request the client then sends for real *claims* the guess when it is the same turn: the
same client, the prompt as the template renders it, the same sampling and tool choice. It reads
the tokens made so far at once and the rest as they come, as its own reply; its latency is
measured from its own arrival. Any other turn from that client *discards* the guess (the person
said something else), as do a newer guess, the guess's expiry (`ttl_s`) and a cancel of its id.
A discarded guess's sequence is cancelled, so its KV is freed at the device's next iteration
(a guess that already finished is released like any finished turn: its prompt stays in the
prefix cache), and its tokens reach no one.

A guess belongs to the token that made it. Its client is the authenticated one (`Owner`: the
bearer token's client, then the `user` it names within that token), never a name in the body
alone: another token's request with the same `user` neither claims nor discards it, and each
token holds at most `limit` guesses, so no other client's guesses can evict them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fairlane.engines.llm import TokenEvent

GUESS_TTL_S = 5.0  # a voice client sends the real turn well within this of its guess
MAX_GUESSES = 8  # held at once by one token (its oldest goes first)


@dataclass(frozen=True)
class Owner:
    """Who a guess belongs to: the bearer token's client (None: the server needs no token),
    then the household member it names (`user`) within that token."""

    token: str | None
    user: str


@dataclass
class Guess:
    """One speculative turn: its tokens wait in `queue` for the request that claims it."""

    id: str
    key: str  # what a claiming request must match (`Speculation.key`)
    owner: Owner
    queue: asyncio.Queue[TokenEvent] = field(default_factory=asyncio.Queue)
    cached_tokens: int = 0
    failed: bool = False  # it ended in an error, a deadline or a cancel: no one may claim it
    expiry: asyncio.TimerHandle | None = None

    def deliver(self, event: TokenEvent) -> None:
        """The device loop's events for this guess (on the event loop)."""
        reason = event.finish_reason or ""
        if reason.startswith(("error", "deadline", "grammar_budget")) or reason == "cancelled":
            self.failed = True
        self.queue.put_nowait(event)


class Speculation:
    """The guesses held on this server's event loop, and what became of them."""

    def __init__(
        self,
        cancel: Callable[[str], bool],
        ttl_s: float = GUESS_TTL_S,
        limit: int = MAX_GUESSES,
    ) -> None:
        self._cancel = cancel  # the device loop's: the sequence leaves, its KV freed
        self.ttl_s = ttl_s
        self.limit = limit
        self._guesses: dict[str, Guess] = {}  # by id, oldest first
        self.counts = {"started": 0, "claimed": 0, "discarded": 0, "expired": 0}

    @staticmethod
    def key(prompt_text: str, params: Any, priority: str, tool_choice: Any) -> str:
        """The turn a request asks for, as far as its reply depends on it: the rendered
        prompt, the sampling parameters (grammar included), the class and the tool choice
        (which decides whether the reply is read as tool calls)."""
        return repr((prompt_text, params, priority, tool_choice))

    def hold(self, guess: Guess) -> None:
        """Keep a running guess for its claim; it replaces the client's older guess, and the
        token's oldest when the token holds `limit` (never another token's)."""
        for older in self._of(guess.owner):
            self.discard(older.id)
        while len(held := self._of_token(guess.owner.token)) >= self.limit:
            self.discard(held[0].id)
        loop = asyncio.get_running_loop()
        guess.expiry = loop.call_later(self.ttl_s, self._expire, guess.id)
        self._guesses[guess.id] = guess
        self.counts["started"] += 1

    def claim(self, key: str, owner: Owner) -> Guess | None:
        """The client's guess of this turn, now the caller's; the client's other guesses are
        discarded (whatever they guessed, this turn is what was asked)."""
        claimed = None
        for guess in self._of(owner):
            if claimed is None and guess.key == key and not guess.failed:
                claimed = self._guesses.pop(guess.id)
                if claimed.expiry is not None:
                    claimed.expiry.cancel()
                self.counts["claimed"] += 1
            else:
                self.discard(guess.id)
        return claimed

    def holds(self, guess_id: str, token: str | None) -> bool:
        """Whether this token holds the guess (a cancel from another token leaves it)."""
        guess = self._guesses.get(guess_id)
        return guess is not None and guess.owner.token == token

    def discard(self, guess_id: str, reason: str = "discarded") -> bool:
        """Cancel a held guess: its sequence leaves the device, its tokens go nowhere."""
        guess = self._guesses.pop(guess_id, None)
        if guess is None:
            return False
        if guess.expiry is not None:
            guess.expiry.cancel()
        self._cancel(guess.id)
        self.counts[reason] += 1
        return True

    def stats(self) -> dict[str, int]:
        return {"held": len(self._guesses), **self.counts}

    def _of(self, owner: Owner) -> list[Guess]:
        return [g for g in self._guesses.values() if g.owner == owner]

    def _of_token(self, token: str | None) -> list[Guess]:
        return [g for g in self._guesses.values() if g.owner.token == token]

    def _expire(self, guess_id: str) -> None:
        self.discard(guess_id, reason="expired")
