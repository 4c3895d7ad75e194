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

# A longer text is summarised in pieces of at most this many tokens (map), then the pieces'
# summaries together (reduce): every turn fits the context, and the pieces batch together.
SUMMARY_PIECE_TOKENS = 1500
SUMMARY_PIECE_WORDS = 80

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


async def summarize(
    generate: Generate,
    tokenize: Callable[[str], list[int]],
    text: str,
    style: str,
    max_words: int,
) -> str:
    """Map-reduce: long text is summarised in pieces (batched together), then the pieces."""
    tokens = await asyncio.to_thread(tokenize, text)
    if len(tokens) > SUMMARY_PIECE_TOKENS:
        pieces = max(2, -(-len(tokens) // SUMMARY_PIECE_TOKENS))
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
) -> None:
    """Run pending summary jobs (after a restart too: a job is done only once it is stored)."""
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
                    generate, tokenize, job["text"], job["style"], job["max_words"]
                )
                error = None
            except (RuntimeError, ValueError) as err:
                result, error = None, str(err)
            await asyncio.to_thread(store.finish_summary, job["id"], result, error)
            health.ok()
