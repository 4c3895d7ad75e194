"""OpenAI embeddings: each text one item of the policy's micro-batches."""

from __future__ import annotations

import asyncio
import base64
import functools
import uuid
from typing import Any

import numpy as np
import orjson
import voluptuous as vol
from aiohttp import web

from fairlane.api.common import (
    DEADLINE_FIELD,
    PRIORITY_FIELD,
    PRIORITY_NAMES,
    ApiError,
    Services,
    deadline_passed,
    enabled,
    read_json,
    refuse_early,
    refused,
    request_class,
    request_deadline,
    resolve_future,
    services_of,
)
from fairlane.api.openapi import WHOLE, operation
from fairlane.api.remote import lane_for, remote_embed
from fairlane.policy import NO_WAIT_LIMIT, Kind, Priority, Request

# --- embeddings ----------------------------------------------------------------------------------

EMBED_REQUEST = vol.Schema(
    {
        vol.Required("input"): vol.Any(
            str, [str], msg="input must be a string or a list of strings"
        ),
        vol.Optional("model"): str,
        vol.Optional("encoding_format", default="float"): vol.In(["float", "base64"]),
        vol.Optional("dimensions"): vol.Any(vol.All(WHOLE, vol.Range(min=1)), None),
        vol.Optional("user"): vol.Any(str, None),
        vol.Optional("fairlane_class"): vol.In(PRIORITY_NAMES),
        vol.Optional("priority", description=PRIORITY_FIELD): vol.Any(None, WHOLE, str),
        vol.Optional("deadline_ms", description=DEADLINE_FIELD): vol.Any(None, vol.Coerce(float)),
    },
    extra=vol.ALLOW_EXTRA,
)


@operation(
    "Embed texts (class background by default); each text waits as one request of its class",
    ok={200: "list of embedding"},
    errors=(400, 401, 413, 429, 502, 503, 504),
    json=EMBED_REQUEST,
    class_header=True,
)
async def embeddings(request: web.Request) -> web.Response:
    """OpenAI's `POST /v1/embeddings`: each text is one micro-batch item (class `background`)."""
    svc = services_of(request)
    disabled = "embeddings are disabled on this server (embed.enabled: false)"
    embedder = enabled(svc.embedder, disabled, "embed_disabled")
    body = await read_json(request)
    texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
    if not texts:
        raise ApiError(400, "input: must not be empty", param="input")
    if len(texts) > svc.config.embed.max_inputs:
        raise ApiError(
            400, f"input: at most {svc.config.embed.max_inputs} texts a request", param="input"
        )
    if blank := [i for i, text in enumerate(texts) if not text.strip()]:
        raise ApiError(400, f"input.{blank[0]}: empty text", param="input")
    dims = body.get("dimensions")
    if dims is not None and dims != embedder.dimensions:
        raise ApiError(
            400,
            f"dimensions: this model gives {embedder.dimensions}-dimensional "
            "vectors and cannot shorten them",
            param="dimensions",
        )
    priority = request_class(request, body, Priority.BACKGROUND)
    if lane_for(svc, priority, Kind.EMBED) is None:  # a remote lane takes them as one request
        # Each text waits as one request of its class: more texts than the class's queue
        # holds could never be admitted, so that is a 400 that says why, not a 429 to retry
        # forever.
        limit = svc.device.policy_for(Kind.EMBED).queue_limit(priority)
        if len(texts) > limit:
            raise ApiError(
                400,
                f"input: a {priority.label} request may hold at most {int(limit)} texts (its "
                "queue's length); send more at class background, or in smaller requests",
                param="input",
                code="does_not_fit",
            )
        refuse_early(svc, priority, Kind.EMBED)
    client = body.get("user") or "anonymous"
    token_ids = await asyncio.to_thread(embedder.tokenize, texts)
    deadline_s = request_deadline(request, body)
    vectors = await embed_all(svc, token_ids, priority, client, deadline_s)
    used = sum(len(ids) for ids in token_ids)
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": base64.b64encode(v.tobytes()).decode()
            if body["encoding_format"] == "base64"
            else np.ascontiguousarray(v, dtype=np.float32),
        }
        for i, v in enumerate(vectors)
    ]
    # orjson writes the arrays itself (float32's shortest form): 6-7 ms for 500 vectors, where
    # the standard library held the event loop, and every stream's tokens, for 130-170 ms.
    payload = {
        "object": "list",
        "data": data,
        "model": svc.embed_name,
        "usage": {"prompt_tokens": used, "total_tokens": used},
    }
    return web.Response(
        body=orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY),
        content_type="application/json",
    )


async def embed_all(
    svc: Services,
    token_ids: list[list[int]],
    priority: Priority,
    client: str,
    deadline_s: float | None = None,
    local: bool = False,
    durable: bool = False,
) -> list[Any]:
    """Queue every text as one EMBED request; all or nothing. A class bound to an `embed`
    remote lane is embedded there (`local`: here, whatever the binding). `durable`: the
    server's own job (the indexer), which waits its turn without a waiting limit."""
    assert svc.embedder is not None
    if not local and (lane := lane_for(svc, priority, Kind.EMBED)) is not None:
        here = functools.partial(embed_all, svc, priority=Priority.CHAT, client="probe",
                                 local=True)
        return await remote_embed(svc, lane, token_ids, priority, client, here)
    embedder = svc.embedder
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future[Any]] = []
    ids: list[str] = []
    batch = uuid.uuid4().hex
    try:
        for index, tokens in enumerate(token_ids):
            request_id = f"emb-{batch}-{index}"
            future: asyncio.Future[Any] = loop.create_future()

            def sink(event: Any, future: asyncio.Future[Any] = future) -> None:
                loop.call_soon_threadsafe(resolve_future, future, event)

            def register(request_id: str = request_id, tokens: list[int] = tokens) -> None:
                embedder.add(request_id, tokens)

            item = Request(
                request_id,
                Kind.EMBED,
                priority,
                client,
                0.0,
                prompt_tokens=len(tokens),
                deadline_s=deadline_s,
                max_wait_s=NO_WAIT_LIMIT if durable else None,
            )
            admission = svc.device.submit(item, register, sink)
            if not admission.accepted:
                svc.telemetry.refuse(priority)
                raise refused(admission)
            futures.append(future)
            ids.append(request_id)
        events = await asyncio.gather(*futures)
    except BaseException:
        for request_id in ids:
            svc.device.cancel(request_id)
        raise
    for event in events:
        if not hasattr(event, "vector"):
            reason = str(getattr(event, "finish_reason", ""))
            if reason.startswith("deadline"):
                raise deadline_passed(reason)
            raise ApiError(409, "the embedding request was cancelled", code="cancelled")
    return [e.vector for e in events]
