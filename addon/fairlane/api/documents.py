"""Household documents and summaries over HTTP, and the start of the workers that index and
summarise them (`fairlane.documents.workers`), given the device through this API's own calls."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Any

import numpy as np
import voluptuous as vol
from aiohttp import web

from fairlane.api.chat import capacity, generate
from fairlane.api.common import (
    INDEXER,
    PRIORITY_NAMES,
    SERVICES,
    SUMMARISER,
    ApiError,
    Services,
    chat_template,
    enabled,
    read_form,
    read_json,
    request_class,
    services_of,
)
from fairlane.api.embeddings import embed_all
from fairlane.api.openapi import WHOLE, operation
from fairlane.api.remote import lane_for
from fairlane.documents.store import DocumentStore, progress
from fairlane.documents.text import DocumentError, chunk, extract_text
from fairlane.documents.workers import Busy, index_forever, summarise_forever
from fairlane.policy import Priority
from fairlane.runtime.components import Component, supervise
from fairlane.runtime.host import give_back_memory

_LOGGER = logging.getLogger(__name__)
LARGE_TEXT_CHARS = 100_000  # a text this long leaves its tokenizer's memory freed, not returned

# --- documents ------------------------------------------------------------------------------------

DOCUMENT_REQUEST = vol.Schema(
    {
        vol.Required("text"): vol.All(str, vol.Length(min=1, msg="must not be empty")),
        vol.Optional("content_type", default="text/plain"): str,
        vol.Optional("title"): vol.Any(str, None),
        vol.Optional("source"): vol.Any(str, None),
        vol.Optional("tags"): vol.Any([str], None),
    },
    extra=vol.PREVENT_EXTRA,
)
SEARCH_REQUEST = vol.Schema(
    {
        vol.Required("query"): vol.All(str, vol.Length(min=1, msg="must not be empty")),
        vol.Optional("top_k", default=5): vol.All(WHOLE, vol.Range(min=1, max=50)),
        vol.Optional("fairlane_class"): vol.In(PRIORITY_NAMES),
    },
    extra=vol.PREVENT_EXTRA,
)


@operation("Every document with its indexing progress")
async def list_documents(request: web.Request) -> web.Response:
    _, store = _documents(request)
    return web.json_response({"data": await asyncio.to_thread(store.documents)})


@operation("One document and its indexing progress", errors=(401, 404))
async def get_document(request: web.Request) -> web.Response:
    _, store = _documents(request)
    found = await asyncio.to_thread(store.documents, request.match_info["id"])
    if not found:
        raise ApiError(404, f"no document {request.match_info['id']!r}", code="not_found")
    return web.json_response(found[0])


@operation("Forget a document and its passages", errors=(401, 404))
async def delete_document(request: web.Request) -> web.Response:
    _, store = _documents(request)
    if not await asyncio.to_thread(store.delete, request.match_info["id"]):
        raise ApiError(404, f"no document {request.match_info['id']!r}", code="not_found")
    return web.json_response({"id": request.match_info["id"], "deleted": True})


@operation(
    "The passages nearest in meaning to a query (class chat by default)",
    errors=(400, 401, 429, 503),
    json=SEARCH_REQUEST,
    class_header=True,
)
async def search_documents(request: web.Request) -> web.Response:
    """Query → the top-k chunks, embedded at `chat` class (someone is waiting for it)."""
    svc, store = _documents(request)
    body = await read_json(request)
    assert svc.embedder is not None
    tokens = svc.embedder.tokenize([body["query"]])
    priority = request_class(request, body, Priority.CHAT)
    [vector] = await embed_all(svc, tokens, priority, "search")
    hits = await asyncio.to_thread(store.search, vector, body["top_k"])
    return web.json_response({"data": [hit.__dict__ for hit in hits]})


@operation("Background jobs (indexing, summaries) and their progress")
async def jobs(request: web.Request) -> web.Response:
    svc, store = _documents(request)
    documents = await asyncio.to_thread(store.documents)
    summaries = await asyncio.to_thread(store.summaries)
    return web.json_response(
        {
            "indexing": progress(documents, svc.started_at),
            "data": [
                {
                    "id": d["id"],
                    "kind": "index",
                    "status": d["status"],
                    "chunks_done": d["chunks_done"],
                    "chunks_total": d["chunks_total"],
                }
                for d in documents
            ]
            + [{"id": s["id"], "kind": "summary", "status": s["status"]} for s in summaries],
        }
    )


@operation("One background job", errors=(401, 404))
async def job(request: web.Request) -> web.Response:
    """One job: a document's indexing (with progress) or a summary (with its result)."""
    svc, store = _documents(request)
    job_id = request.match_info["id"]
    found = await asyncio.to_thread(store.documents, job_id)
    if found:
        return web.json_response(
            {
                **progress(found, svc.started_at),
                "id": job_id,
                "kind": "index",
                "status": found[0]["status"],
            }
        )
    summary = await asyncio.to_thread(store.summaries, job_id)
    if summary:
        return web.json_response({**summary[0], "kind": "summary"})
    raise ApiError(404, f"no job {job_id!r}", code="not_found")
DOCUMENT_FORM = vol.Schema(
    {
        vol.Optional("title"): str,
        vol.Optional("source"): str,
        vol.Optional("tags", description="comma-separated"): str,
        vol.Optional("content_type", description="the file part's own type when absent"): str,
    },
    extra=vol.ALLOW_EXTRA,
)


SUMMARY_REQUEST = vol.Schema(
    {
        vol.Optional("document_id"): str,
        vol.Optional("text"): vol.All(str, vol.Length(min=1, msg="must not be empty")),
        vol.Optional("style", default="short"): vol.In(["short", "bullets"]),
        vol.Optional("max_words", default=80): vol.All(WHOLE, vol.Range(min=10, max=400)),
    },
    extra=vol.PREVENT_EXTRA,
)


def _documents(request: web.Request) -> tuple[Services, DocumentStore]:
    svc = services_of(request)
    enabled(svc.embedder, "documents need the embedding engine (embed.enabled: false)",
            "documents_disabled")
    return svc, enabled(svc.documents, "documents are disabled on this server",
                        "documents_disabled")


@operation(
    "Add a household document (text, Markdown, HTML, PDF): stored before it is acknowledged, "
    "then chunked and indexed in the background lane",
    ok={200: "Already stored (unchanged: true)", 202: "Stored; indexing"},
    errors=(400, 401, 413, 415, 507),
    json=DOCUMENT_REQUEST,
    form=DOCUMENT_FORM,
    file="the document",
)
async def add_document(request: web.Request) -> web.Response:
    """Store a document durably, then answer; indexing runs in the background lane."""
    svc, store = _documents(request)
    if request.content_type.startswith("multipart/"):
        fields, (data, filename, content_type) = await read_form(request)
        content_type = fields.get("content_type") or content_type or "text/plain"
        meta: dict[str, Any] = {
            "title": fields.get("title") or filename,
            "source": fields.get("source"),
            "tags": [t for t in (fields.get("tags") or "").split(",") if t],
        }
    else:
        body = await read_json(request)
        data, content_type = body["text"].encode(), body["content_type"]
        meta = {
            "title": body.get("title"),
            "source": body.get("source"),
            "tags": body.get("tags") or [],
        }
    embedder = svc.embedder
    assert embedder is not None
    try:
        text = await asyncio.to_thread(extract_text, data, content_type)
    except DocumentError as err:
        raise ApiError(err.status, str(err), param="file", code="bad_document") from err
    chunks = await asyncio.to_thread(chunk, embedder, text)
    if len(text) >= LARGE_TEXT_CHARS:  # the tokenizer's working memory, back to the system
        await asyncio.to_thread(give_back_memory)
    title = meta["title"] or text.splitlines()[0][:80]
    document_id, created = await asyncio.to_thread(
        store.add, text, chunks, title, meta["source"], meta["tags"], content_type
    )
    svc.index_wakeup.set()
    document = store.documents(document_id)[0]
    return web.json_response({**document, "unchanged": not created}, status=202 if created else 200)


# --- summaries --------------------------------------------------------------------------------

@operation(
    "A summary job (background lane), durable before it is acknowledged: give text or "
    "document_id",
    ok={202: "Stored; pending"},
    errors=(400, 401, 404, 413, 507),
    json=SUMMARY_REQUEST,
)
async def add_summary(request: web.Request) -> web.Response:
    """A summary job, durable before it is acknowledged; its result comes from the job."""
    svc, store = _documents(request)
    chat_template(svc)
    body = await read_json(request)
    if ("text" in body) == ("document_id" in body):
        raise ApiError(400, "give either `text` or `document_id`")
    text: str | None = body.get("text")
    if "document_id" in body:
        text = await asyncio.to_thread(store.document_text, body["document_id"])
    if text is None:
        raise ApiError(404, f"no document {body['document_id']!r}", code="not_found")
    summary_id = await asyncio.to_thread(
        store.add_summary, text, body.get("document_id"), body["style"], body["max_words"]
    )
    svc.summary_wakeup.set()
    return web.json_response({"id": summary_id, "status": "pending"}, status=202)


@operation("A summary job's status and result", errors=(401, 404))
async def get_summary(request: web.Request) -> web.Response:
    _, store = _documents(request)
    found = await asyncio.to_thread(store.summaries, request.match_info["id"])
    if not found:
        raise ApiError(404, f"no summary {request.match_info['id']!r}", code="not_found")
    return web.json_response(found[0])


async def start_workers(app: web.Application) -> None:
    """Start the indexer (with the embedding engine) and the summariser (with a chat model)."""
    svc = app[SERVICES]
    if svc.documents is None or svc.embedder is None:
        return

    async def embed(tokens: list[list[int]]) -> list[np.ndarray]:
        try:
            return await embed_all(svc, tokens, Priority.BACKGROUND, "documents", durable=True)
        except ApiError as err:  # refused (queue full): the indexer tries again shortly
            raise Busy(err.message) from err

    async def summary_turn(messages: list[dict[str, Any]], max_tokens: int) -> str:
        return await generate(svc, messages, max_tokens, Priority.BACKGROUND, "summaries")

    def turn_capacity() -> int | None:  # a remote lane's is its own, not known here
        if lane_for(svc, Priority.BACKGROUND) is not None:
            return None
        return capacity(svc, Priority.BACKGROUND)

    indexer = svc.components["indexer"] = Component("indexer")
    app[INDEXER] = asyncio.create_task(
        supervise(
            indexer, functools.partial(index_forever, svc.documents, embed, svc.index_wakeup)
        )
    )
    if svc.template is not None:
        summariser = svc.components["summariser"] = Component("summariser")
        work = functools.partial(
            summarise_forever,
            svc.documents,
            summary_turn,
            svc.engine.tokenize,
            svc.summary_wakeup,
            capacity=turn_capacity,
        )
        app[SUMMARISER] = asyncio.create_task(supervise(summariser, work))


async def stop_workers(app: web.Application) -> None:
    for key in (INDEXER, SUMMARISER):
        if key in app:
            app[key].cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await app[key]
