"""The document workers: the indexer embeds every stored chunk that has no vector yet, the
summariser runs every pending summary job.

Both read their work from the store, so a restart resumes it, and ask the device for it through
the functions the server hands them (`Embed`, `Generate`): this package knows the store and the
order of the work, not how the device is reached. Each runs until cancelled; a failure ends it,
and its supervisor (`fairlane.runtime.components`) reports it and starts it again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from fairlane.documents.store import DocumentStore
from fairlane.runtime.components import Component

_LOGGER = logging.getLogger(__name__)

# A text that one background turn can hold is summarised in that turn. A longer one in pieces
# (map), then the pieces' summaries together (reduce). Each piece beyond the first costs its
# fixed part on top of its tokens: its own instruction, a reply decoded for it, and the reduce
# turn over the replies. The cost model prices a 2,500-token text at 20 s in one turn and 27 s
# as two pieces and their reduction on this CPU's profile (cpu-2core), 0.7 s and 1.4 s on
# h200's, where the reduction's decode is most of a summary's time. So the fewest pieces that
# fit are the cheapest, and they are as large as the turn allows: the policy's capacity for a
# background request.
SUMMARY_PIECE_WORDS = 80
# A piece's text where the turn's capacity is not known (a remote lane serves the summaries).
SUMMARY_PIECE_TOKENS = 1500
# Beside its text a summary turn holds its system prompt, its instruction and the chat
# template's markers (48 tokens with Qwen2.5's template): twice that is kept for them.
TURN_OVERHEAD_TOKENS = 96

# Background work on the device: embed chunks' token ids; answer a chat turn in at most n tokens.
Embed = Callable[[list[list[int]]], Awaitable[list[np.ndarray]]]
Generate = Callable[[list[dict[str, Any]], int], Awaitable[str]]


class Busy(Exception):
    """The device refused the work for now (its queue is full): try again shortly."""


async def index_forever(
    store: DocumentStore, embed: Embed, wakeup: asyncio.Event, health: Component
) -> None:
    """Embed chunks that have no vector yet, oldest documents first, until cancelled."""
    while True:
        # Cleared before the read, never after: a document stored while the read runs sets
        # the event again, so its wake-up is not lost.
        wakeup.clear()
        batch = await asyncio.to_thread(store.pending, 256)
        # Well only when the work is done: all indexed, or a batch stored. (Reading what is
        # pending works on a full disk too; said then, /health said ok between every retry.)
        if not batch:
            health.ok()
            await wakeup.wait()
            continue
        try:
            vectors = await embed([tokens for _, _, tokens in batch])
        except Busy as err:
            _LOGGER.warning("indexing paused: %s", err)
            await asyncio.sleep(1.0)
            continue
        items = [
            (chunk_id, vector) for (chunk_id, _, _), vector in zip(batch, vectors, strict=True)
        ]
        await asyncio.to_thread(store.store_vectors, items)
        health.ok()


def summary_pieces(text_tokens: int, reply_tokens: int, capacity: int | None) -> int:
    """How many pieces a text of `text_tokens` is summarised in (1: one turn, no map-reduce):
    the fewest whose turns fit `capacity` tokens each (prompt and reply), or pieces of
    `SUMMARY_PIECE_TOKENS` where the capacity is not known."""
    if capacity is None:
        return 1 if text_tokens <= SUMMARY_PIECE_TOKENS else -(-text_tokens // SUMMARY_PIECE_TOKENS)
    if text_tokens <= capacity - TURN_OVERHEAD_TOKENS - reply_tokens:
        return 1
    # Pieces are cut by characters, and a text's tokens per character vary along it: each
    # piece is planned a tenth under its room so that none overflows its turn.
    room = int(0.9 * (capacity - TURN_OVERHEAD_TOKENS - 2 * SUMMARY_PIECE_WORDS))
    return max(2, -(-text_tokens // max(room, 1)))


async def summarize(
    generate: Generate,
    tokenize: Callable[[str], list[int]],
    text: str,
    style: str,
    max_words: int,
    capacity: int | None = None,
) -> str:
    """One turn for a text that fits a turn of `capacity` tokens; longer text map-reduce: in
    the fewest pieces that fit (their turns batch together), then the pieces' summaries."""
    tokens = await asyncio.to_thread(tokenize, text)
    pieces = summary_pieces(len(tokens), 2 * max_words, capacity)
    if pieces > 1:
        size = -(-len(text) // pieces)
        parts = await asyncio.gather(
            *(
                _summary_turn(generate, text[i : i + size], "short", SUMMARY_PIECE_WORDS)
                for i in range(0, len(text), size)
            )
        )
        text = "\n".join(parts)
    return await _summary_turn(generate, text, style, max_words)


async def _summary_turn(generate: Generate, text: str, style: str, max_words: int) -> str:
    shape = "as a few bullet points" if style == "bullets" else "in plain sentences"
    messages = [
        {
            "role": "system",
            "content": "You summarise household documents accurately and "
            "briefly. Keep dates, amounts and names.",
        },
        {
            "role": "user",
            "content": f"Summarise this in at most {max_words} words, {shape}:\n\n{text}",
        },
    ]
    return await generate(messages, max_words * 2)


async def summarise_forever(
    store: DocumentStore,
    generate: Generate,
    tokenize: Callable[[str], list[int]],
    wakeup: asyncio.Event,
    health: Component,
    capacity: Callable[[], int | None] = lambda: None,
) -> None:
    """Run pending summary jobs (after a restart too: a job is done only once it is stored);
    `capacity`: the tokens one summary turn may hold (None: not known)."""
    while True:
        wakeup.clear()  # before the read, as the indexer does
        pending = await asyncio.to_thread(store.pending_summaries)
        if not pending:  # well once all is done or a job is stored, as the indexer
            health.ok()
            await wakeup.wait()
            continue
        for job in pending:
            try:
                result = await summarize(
                    generate, tokenize, job["text"], job["style"], job["max_words"], capacity()
                )
                error = None
            except (RuntimeError, ValueError) as err:
                result, error = None, str(err)
            await asyncio.to_thread(store.finish_summary, job["id"], result, error)
            health.ok()
