"""Chat completions, summaries and embeddings on a remote lane (`remotes:` in the
configuration).

A chat request is passed on as it came (less Fairlane's own fields), so the remote
renders it with its own model's template and honours tools and structured output itself; its
stream is passed back chunk by chunk under this server's completion id. Admission, class
order, fairness and the window are the lane's (`fairlane.runtime.remote`); the latencies go into the
same per-class figures as local work.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import numpy as np
from aiohttp import web

from fairlane.api.common import ApiError, Services, refused
from fairlane.policy import Kind, Priority, Request
from fairlane.runtime.metrics import RequestRecord
from fairlane.runtime.remote import (
    RemoteCancelled,
    RemoteEngine,
    RemoteError,
    RemoteLane,
    RemoteRefused,
)

# Fields that are this server's, not the remote's (the lane sends the class in the
# X-Fairlane-Class header, which another Fairlane reads and other engines ignore).
OWN_FIELDS = ("fairlane_class", "priority", "deadline_ms", "stream", "stream_options")


def lane_for(svc: Services, priority: Priority, kind: Kind = Kind.LLM) -> RemoteLane | None:
    return next((lane for lane in svc.remotes if lane.serves(priority, kind)), None)


def api_error(err: RemoteError) -> ApiError:
    """A remote's failure as the client hears it (the error middleware uses it too)."""
    headers = {} if err.retry_after_s is None else {
        "Retry-After": str(math.ceil(err.retry_after_s))
    }
    kind = "invalid_request_error" if err.status < 500 else "server_error"
    if err.status == 429:
        kind = "overloaded"  # as this server's own refusals
    return ApiError(err.status, err.message, kind=kind, code=err.code, headers=headers)


def _prompt_tokens(svc: Services, messages: list[dict[str, Any]]) -> int:
    """The prompt's size in this server's tokens: the weight fairness charges up front (the
    remote's own tokenizer may count a little differently)."""
    text = "\n".join(
        m["content"] if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
        for m in messages
    )
    return len(svc.engine.tokenize(text))


async def remote_chat(
    request: web.Request,
    svc: Services,
    lane: RemoteLane,
    body: dict[str, Any],
    priority: Priority,
    client: str,
) -> web.StreamResponse:
    """`/v1/chat/completions` for a class bound to a remote lane. A remote that fails before
    its first chunk (unreachable, 5xx, a stall) is tried no more for this request: it goes to
    another of the lane's remotes, if one is up (failover); the client hears of it only when
    none could serve it."""
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    forward = {k: v for k, v in body.items() if k not in OWN_FIELDS}
    prompt_tokens = await asyncio.to_thread(_prompt_tokens, svc, body["messages"])
    item = Request(completion_id, Kind.LLM, priority, client, 0.0, prompt_tokens=prompt_tokens)
    record: RequestRecord | None = None  # begun with the first remote, kept through a failover
    tried: frozenset[str] = frozenset()
    try:
        while True:
            async with lane.slot(item, tried) as engine:
                if record is None:
                    record = svc.telemetry.begin(
                        Kind.LLM, priority, client, prompt_tokens, item.arrival
                    )
                sent = {**forward, "stream_options": {"include_usage": True}}
                if engine.config.model is not None:
                    sent["model"] = engine.config.model
                chunks = _counted(svc, lane, item, record, engine.chat(sent, item))
                retry = False
                try:
                    # The first chunk before the response starts: a remote that fails now is
                    # another remote's request, or an HTTP error, not a stream that breaks off.
                    try:
                        first = await anext(chunks, None)
                    except RemoteError as err:
                        retry = _fails_over(lane, engine.name, tried, err)
                        if not retry:
                            raise
                        tried |= {engine.name}
                        continue
                    if body["stream"]:
                        response, failed = await _relay(
                            request, completion_id, first, chunks, body
                        )
                        if failed:
                            svc.telemetry.finish(record, svc.device.clock(), outcome="failed")
                        return response
                    return web.json_response(await _assemble(completion_id, first, chunks))
                except RemoteError:
                    svc.telemetry.finish(record, svc.device.clock(), outcome="failed")
                    raise
                finally:
                    await chunks.aclose()
                    if record.finished_at is None and not retry:  # the client went away
                        svc.telemetry.finish(record, svc.device.clock(), outcome="cancelled")
    except RemoteRefused as err:
        svc.telemetry.refuse(priority)
        raise refused(err.admission) from None
    except RemoteError as err:
        if record is not None and record.finished_at is None:
            svc.telemetry.finish(record, svc.device.clock(), outcome="failed")
        raise api_error(err) from None
    except RemoteCancelled:
        return await _cancelled_reply(request, completion_id, body)


def _fails_over(lane: RemoteLane, failed: str, tried: frozenset[str], err: RemoteError) -> bool:
    """Whether a request that `failed` (a remote's fault, before any output) may go to
    another of the lane's remotes: one not tried yet and not down."""
    if err.status < 500:
        return False
    return any(e.name not in tried | {failed} and not e.down() for e in lane.engines)


async def _counted(svc: Services, lane: RemoteLane, item: Request, record: Any,
                   chunks: AsyncGenerator[dict[str, Any], None]
                   ) -> AsyncGenerator[dict[str, Any], None]:
    """The remote's chunks, with each piece of output counted for the latency figures and
    charged to the client's fairness counter; the record is finished at the end. A cancel
    through the API stops the wait for the next chunk at once and ends the reply ("stop")."""
    stop = lane.stops[item.id]
    once = NamedOnce()
    step: asyncio.Future[dict[str, Any] | None] | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(chunks, None))
            halt = asyncio.ensure_future(stop.wait())
            await asyncio.wait({step, halt}, return_when=asyncio.FIRST_COMPLETED)
            halt.cancel()
            if not step.done():  # cancelled: the remote's connection closes now
                svc.telemetry.finish(record, svc.device.clock(), outcome="cancelled")
                yield _final_chunk()
                return
            chunk = step.result()
            if chunk is None:
                break
            if any((c.get("delta") or {}).get("content") or
                   (c.get("delta") or {}).get("tool_calls") for c in chunk.get("choices") or []):
                svc.telemetry.token(record, svc.device.clock())
                lane.charge_output(item, 1)
            yield once(chunk)
        svc.telemetry.finish(record, svc.device.clock())
    finally:
        if step is not None and not step.done():  # the client left, or a cancel
            step.cancel()
            with contextlib.suppress(asyncio.CancelledError, RemoteError):
                await step
        await chunks.aclose()


class NamedOnce:
    """A tool call's id, type and function name in its first delta only, as OpenAI streams
    them. Some engines (llama.cpp's server) repeat them in every delta, beside the legacy
    `function_call`; a client that appends deltas, as OpenAI's own SDK does, then reads the
    name written once per token ("HassTurnOnHassTurnOn…")."""

    def __init__(self) -> None:
        self.named: set[tuple[int, int]] = set()

    def __call__(self, chunk: dict[str, Any]) -> dict[str, Any]:
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("tool_calls"):
                delta.pop("function_call", None)
            for call in delta.get("tool_calls") or []:
                key = (choice.get("index", 0), call.get("index", 0))
                function = call.get("function") or {}
                if key in self.named:
                    call.pop("id", None)
                    call.pop("type", None)
                    function.pop("name", None)
                elif function.get("name"):
                    self.named.add(key)
        return chunk


def _final_chunk() -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "created": int(time.time()),
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}


async def _cancelled_reply(request: web.Request, completion_id: str,
                           body: dict[str, Any]) -> web.StreamResponse:
    """A request cancelled while it waited for the lane: an empty reply, as a local one gets."""
    async def nothing() -> AsyncGenerator[dict[str, Any], None]:
        yield _final_chunk()

    if body["stream"]:
        return (await _relay(request, completion_id, None, nothing(), body))[0]
    return web.json_response(await _assemble(completion_id, None, nothing()))


async def _relay(request: web.Request, completion_id: str, first: dict[str, Any] | None,
                 chunks: Any, body: dict[str, Any]) -> tuple[web.StreamResponse, bool]:
    """Pass the remote's stream on; True with the response when the remote failed mid-way."""
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)

    async def send(chunk: dict[str, Any]) -> None:
        if not chunk.get("choices") and not include_usage:
            return  # the usage chunk this server asked for, not the client
        await response.write(
            f"data: {json.dumps({**chunk, 'id': completion_id}, ensure_ascii=False)}\n\n".encode()
        )

    with contextlib.suppress(ConnectionResetError):
        try:
            if first is not None:
                await send(first)
            async for chunk in chunks:
                await send(chunk)
        except RemoteError as err:
            # Mid-stream: the response has started, so the error is the stream's last event.
            error = {"message": err.message, "type": "server_error", "code": err.code}
            await response.write(f"data: {json.dumps({'error': error})}\n\n".encode())
            await response.write_eof()
            return response, True
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    return response, False


async def _assemble(completion_id: str, first: dict[str, Any] | None,
                    chunks: Any) -> dict[str, Any]:
    """A non-streamed completion from the remote's stream (the stream is what the lane
    measures and times out)."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish: str | None = None
    usage: dict[str, Any] | None = None
    model = ""

    async def each() -> Any:
        if first is not None:
            yield first
        async for chunk in chunks:
            yield chunk

    async for chunk in each():
        model = chunk.get("model") or model
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            content.append(delta.get("content") or "")
            for call in delta.get("tool_calls") or []:
                into = calls.setdefault(call.get("index", len(calls)), {
                    "id": call.get("id"), "type": "function",
                    "function": {"name": "", "arguments": ""}})
                into["id"] = call.get("id") or into["id"]
                function = call.get("function") or {}
                into["function"]["name"] += function.get("name") or ""
                into["function"]["arguments"] += function.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if calls:
        message = {"role": "assistant", "content": message["content"] or None,
                   "tool_calls": [calls[i] for i in sorted(calls)]}
    reply: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish or "stop"}],
    }
    if usage is not None:
        reply["usage"] = usage
    return reply


async def remote_generate(
    svc: Services, lane: RemoteLane, messages: list[dict[str, Any]], max_tokens: int,
    priority: Priority, client: str,
) -> str:
    """One LLM turn on the lane, collected (summaries). A remote that fails hands the turn to
    another of the lane's remotes that is up (nobody reads it as it comes, so it starts again
    there); with none, RemoteError: the job stays pending and its worker retries with back-off."""
    body: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens,
                            "temperature": 0.2, "seed": 0}
    prompt_tokens = await asyncio.to_thread(_prompt_tokens, svc, messages)
    item = Request(f"gen-{uuid.uuid4().hex}", Kind.LLM, priority, client, 0.0,
                   prompt_tokens=prompt_tokens)
    tried: frozenset[str] = frozenset()
    try:
        while True:
            async with lane.slot(item, tried) as engine:
                body["model"] = engine.config.model or svc.model_name
                record = svc.telemetry.begin(
                    Kind.LLM, priority, client, prompt_tokens, item.arrival
                )
                try:
                    reply = await _assemble(item.id, None, _counted(
                        svc, lane, item, record, engine.chat(body, item)))
                    return str(reply["choices"][0]["message"]["content"] or "").strip()
                except RemoteError as err:
                    svc.telemetry.finish(record, svc.device.clock(), outcome="failed")
                    if not _fails_over(lane, engine.name, tried, err):
                        raise
                    tried |= {engine.name}
                finally:
                    if record.finished_at is None:
                        svc.telemetry.finish(record, svc.device.clock(), outcome="cancelled")
    except RemoteRefused as err:
        raise RemoteError(429, f"refused: {err.admission.reason}", "refused") from err


# --- embeddings ---------------------------------------------------------------------------------

# A text both sides embed before the first vectors are used: a remote on another model would
# fill the index with vectors that this server's searches (embedded here) never match.
PROBE = "The boiler is serviced every October; the pressure should read 1.5 bar."
SAME_VECTORS = 0.98  # cosine: ONNX int8 against torch on one model is above 0.98


async def remote_embed(
    svc: Services, lane: RemoteLane, token_ids: list[list[int]], priority: Priority,
    client: str, embed_here: Callable[[list[list[int]]], Awaitable[list[Any]]],
) -> list[np.ndarray]:
    """Embeddings of a class bound to an `embed` lane: the texts (from their tokens) sent to
    the remote as one request. `embed_here` embeds on this server (for the probe). Raises
    RemoteError when the remote fails (a handler answers it; the indexer is retried)."""
    assert svc.embedder is not None
    texts = await asyncio.to_thread(svc.embedder.tokenizer.decode_batch, token_ids)
    item = Request(f"emb-{uuid.uuid4().hex}", Kind.EMBED, priority, client, 0.0,
                   prompt_tokens=sum(len(ids) for ids in token_ids))
    try:
        async with lane.slot(item) as engine:
            model = engine.config.model or svc.embed_name
            if not engine.same_vectors:
                await _check_same_vectors(svc, lane, engine, model, item, embed_here)
            vectors = await engine.embed(texts, model, item)
    except RemoteRefused as err:
        svc.telemetry.refuse(priority)
        raise refused(err.admission) from None
    return [np.asarray(v, dtype=np.float32) for v in vectors]


async def _check_same_vectors(
    svc: Services, lane: RemoteLane, engine: RemoteEngine, model: str, item: Request,
    embed_here: Callable[[list[list[int]]], Awaitable[list[Any]]],
) -> None:
    assert svc.embedder is not None
    tokens = await asyncio.to_thread(svc.embedder.tokenize, [PROBE])
    [here] = await embed_here(tokens)
    [there] = await engine.embed([PROBE], model, item)
    there_v = np.asarray(there, dtype=np.float32)
    if here.shape != there_v.shape:
        cosine = 0.0
    else:
        cosine = float(np.dot(here, there_v) /
                       max(float(np.linalg.norm(here) * np.linalg.norm(there_v)), 1e-12))
    if cosine < SAME_VECTORS:
        # Counted against the breaker: the lane is misconfigured until its model is fixed.
        raise lane.count_failure(engine, RemoteError(
            502, f"the remote engine {engine.name!r} embeds differently from this server "
                 f"(cosine {cosine:.2f} on a probe text, {there_v.shape[0]} against "
                 f"{here.shape[0]} dimensions): its vectors would not match the searches, "
                 "so none are used", "remote_mismatch"))
    engine.same_vectors = True
