"""The prefix cache: KV cells of finished sequences kept for later prompts that start the same
way (Home Assistant's system prompt and tools, the second call of a tool turn).

llama.cpp's unified KV cache holds them under sequence ids of their own; a prompt that starts
the same way shares those cells (a copy of the ids, not of the data) and prefills only the rest.
Which entries stay when room is short is this module's one decision (`PrefixCache.store`);
the engine (engines.llm) keeps the cells moving with two calls it passes in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from fairlane.policy import Priority

# A shorter common prefix is not worth a cache lookup's bookkeeping.
MIN_PREFIX_REUSE = 16


@dataclass
class CachedPrefix:
    """The KV cells of a finished sequence's tokens, kept under a sequence id of their own."""

    seq_id: int
    tokens: list[int]
    used_at: float
    pins: int = 0  # sequences admitted to start from it, until they are released
    hits: int = 0  # prompts that started from it (Home Assistant's system prompt: many)
    # The most leading tokens a prompt took from it: Home Assistant's system prompt and
    # tools, where the rest is the turn that stored it. Making room trims an entry to this.
    shared: int = 0
    priority: Priority = Priority.CHAT  # the class of the turn that stored it
    # The text of its first `spelt[0]` tokens and where each ends, once a prompt was compared
    # with it (see LlamaEngine.tokenize_prompt).
    spelt: tuple[int, bytes, list[int]] = (0, b"", [])


class PrefixCache:
    """The entries, their sequence ids and their budget of cells.

    `copy(source, target, n)` gives sequence `target` the first `n` cells of `source`;
    `remove(seq_id, start)` drops a sequence's cells from `start` on. `add` runs on the HTTP
    side, the rest on the device loop's thread: `lock` guards the entries and their pins.
    """

    def __init__(
        self,
        budget: int,
        ids: list[int],
        copy: Callable[[int, int, int], None],
        remove: Callable[[int, int], None],
    ) -> None:
        self.budget = budget
        self.ids = ids
        self.copy = copy
        self.remove = remove
        self.entries: list[CachedPrefix] = []
        self.lock = threading.RLock()

    def longest(self, prompt: list[int]) -> tuple[CachedPrefix | None, int]:
        """The cached prefix sharing the most leading tokens with `prompt`, and how many.

        The prompt's last token is always computed: its logits give the first output.
        """
        best: tuple[CachedPrefix | None, int] = (None, 0)
        for entry in self.entries:
            shared = min(common_prefix(entry.tokens, prompt), len(prompt) - 1)
            if shared >= MIN_PREFIX_REUSE and shared > best[1]:
                best = (entry, shared)
        return best

    def store(
        self,
        tokens: list[int],
        source_id: int,
        priority: Priority,
        started_from: CachedPrefix | None = None,
        reused: int = 0,
    ) -> None:
        """Keep the cells of `tokens` (sequence `source_id`'s, a turn of class `priority` that
        started from `started_from`'s first `reused` tokens) if room can be made; call with
        `lock` held.

        An entry they extend is superseded, and so is the entry the sequence started from when
        it reused most of it (Home Assistant's system prompt and an earlier turn's unique words:
        the new entry holds the same system prompt, and the latest turn); their hits carry
        over. Room is then made in this order:
        1. entries not worth keeping go: a background turn's, then one no prompt has reused,
           or whose reused part another entry (or the new one) holds too;
        2. the entries left are each the only copy of something prompts reuse: their turns'
           own words are trimmed (the shared part stays);
        3. only then does one of those go, the least urgent class first, then the least
           recently used, and only for a turn of the same or a more urgent class: a chat
           turn never pushes out the system prompt every spoken command starts from.
        A background turn (a summary of a unique document) may only replace a background
        entry not worth keeping. Entries that sequences are about to start from (pinned)
        always stay. With no room left, the new tokens are not kept.
        """
        hits = shared = 0
        budget = self.budget
        superseded = [e for e in self.entries if common_prefix(e.tokens, tokens) == len(e.tokens)]
        if (
            started_from is not None
            and started_from in self.entries
            and 2 * reused >= len(started_from.tokens)
        ):
            superseded.append(started_from)
        for entry in superseded:
            if entry.pins == 0 and entry in self.entries:
                hits = max(hits, entry.hits)
                shared = max(shared, min(entry.shared, common_prefix(entry.tokens, tokens)))
                self.evict(entry)

        def has_room() -> bool:
            return bool(self.ids) and (
                sum(len(e.tokens) for e in self.entries) + len(tokens) <= budget
            )

        def kept(entry: CachedPrefix) -> bool:
            """Reused, and the only holder of what prompts took from it (Home Assistant's
            system prompt); a chat prompt that another entry, or the new one, holds too is
            worth one of them."""
            return entry.hits > 0 and not any(
                common_prefix(entry.tokens, other) >= entry.shared
                for other in [tokens, *(e.tokens for e in self.entries if e is not entry)]
            )

        def may_evict(entry: CachedPrefix) -> bool:
            if entry.pins:
                return False
            if priority is Priority.BACKGROUND:
                return entry.priority is Priority.BACKGROUND and not kept(entry)
            return not kept(entry) or priority <= entry.priority

        def may_trim(entry: CachedPrefix) -> bool:
            return (
                not entry.pins
                and entry.shared < len(entry.tokens)
                and (priority.interactive or entry.priority is Priority.BACKGROUND)
                and kept(entry)
            )

        while not has_room():
            # Least valuable first: background, not kept, the less urgent class, the oldest.
            order = sorted(
                self.entries,
                key=lambda e: (e.priority.interactive, kept(e), -e.priority, e.used_at),
            )
            spare = [e for e in order if may_evict(e) and not kept(e)]
            trims = [e for e in order if may_trim(e)] if self.ids else []
            valued = [e for e in order if may_evict(e)]
            if spare:
                victim = spare[0]
                if victim.hits and common_prefix(victim.tokens, tokens) >= victim.shared:
                    # The new entry holds all that prompts took from it: its hits carry over.
                    hits, shared = max(hits, victim.hits), max(shared, victim.shared)
                self.evict(victim)
            elif trims:  # short of cells, not of entries: the turns' own words go first
                self.trim(trims[0])
            elif valued:
                self.evict(valued[0])
            else:
                return  # what is cached is worth more than this sequence's tokens: keep it
        cache_id = self.ids.pop()
        self.copy(source_id, cache_id, len(tokens))
        entry = CachedPrefix(
            cache_id, tokens, time.monotonic(), hits=hits, shared=shared, priority=priority
        )
        self.entries.append(entry)

    def trim(self, entry: CachedPrefix) -> None:
        """Keep only the leading tokens that prompts took from the entry (its cells past them
        go): the system prompt stays, the words of the turn that stored it do not."""
        self.remove(entry.seq_id, entry.shared)
        del entry.tokens[entry.shared :]

    def evict(self, entry: CachedPrefix) -> None:
        self.remove(entry.seq_id, 0)
        self.entries.remove(entry)
        self.ids.append(entry.seq_id)

    def close(self) -> None:
        with self.lock:
            for entry in list(self.entries):
                self.evict(entry)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
