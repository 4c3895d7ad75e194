"""The HTTP server (aiohttp): OpenAI-compatible chat, models, stats, metrics and health.

Handlers validate, render and tokenize, then hand the request to the device loop and await its
tokens; they never block on the device. Every client-visible error has OpenAI's error shape and
a 4xx status with a message a person can act on.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hmac
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import voluptuous as vol
from aiohttp import BodyPartReader, ClientPayloadError, web
from aiohttp.typedefs import Handler
from wyoming.server import AsyncTcpServer

from fairlane import __version__, models, wyoming_server
from fairlane import config as config_mod
from fairlane.chat import ChatTemplate, ChatTemplateError, may_be_tool_call, parse_tool_calls
from fairlane.device import DeviceLoop
from fairlane.documents import DocumentError, DocumentStore, chunk_tokens, extract_text, progress
from fairlane.engines.embed import EmbedConfig as EmbedEngineConfig
from fairlane.engines.embed import EmbeddingEngine
from fairlane.engines.llm import (
    EngineConfig,
    LlamaEngine,
    SamplingParams,
    TokenEvent,
    default_threads,
)
from fairlane.engines.stt import AudioError, SttConfig, Utterance, WhisperEngine, decode_audio
from fairlane.openapi import OPENAPI
from fairlane.policy import CostModel, Kind, Priority, Request, make_policy
from fairlane.profiles import load as load_profile
from fairlane.speech import Cancelled, Refused, transcribe
from fairlane.telemetry import Telemetry
from fairlane.wyoming_server import SpeechService

_LOGGER = logging.getLogger(__name__)

CLASS_HEADER = "X-Fairlane-Class"


class ApiError(Exception):
    """An error for the client: status, OpenAI error type, message, and the offending field."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = (
            status,
            message,
            kind,
            param,
            code,
        )

    def response(self) -> web.Response:
        body = {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }
        return web.json_response(body, status=self.status)


# --- request validation ------------------------------------------------------------------------

_ROLES = vol.In(["system", "developer", "user", "assistant", "tool"])
_CONTENT = vol.Any(
    None,
    str,
    [
        {vol.Required("type"): str, vol.Optional("text"): str},
    ],
)
MESSAGE = vol.Schema(
    {
        vol.Required("role"): _ROLES,
        vol.Optional("content"): _CONTENT,
        vol.Optional("name"): str,
        vol.Optional("tool_calls"): [dict],
        vol.Optional("tool_call_id"): str,
    },
    extra=vol.ALLOW_EXTRA,
)
_PRIORITY_NAMES = [p.label for p in Priority]
CHAT_REQUEST = vol.Schema(
    {
        vol.Required("messages"): vol.All([MESSAGE], vol.Length(min=1, msg="must not be empty")),
        vol.Optional("model"): str,
        vol.Optional("stream", default=False): bool,
        vol.Optional("stream_options"): vol.Any({vol.Optional("include_usage"): bool}, None),
        vol.Optional("max_tokens"): vol.Any(vol.All(int, vol.Range(min=1)), None),
        vol.Optional("max_completion_tokens"): vol.Any(vol.All(int, vol.Range(min=1)), None),
        vol.Optional("temperature"): vol.Any(
            vol.All(vol.Coerce(float), vol.Range(min=0, max=2)), None
        ),
        vol.Optional("top_p"): vol.Any(
            vol.All(vol.Coerce(float), vol.Range(min=0, max=1, min_included=False)), None
        ),
        vol.Optional("top_k"): vol.Any(vol.All(int, vol.Range(min=0)), None),
        vol.Optional("seed"): vol.Any(int, None),
        vol.Optional("stop"): vol.Any(str, vol.All([str], vol.Length(max=4)), None),
        vol.Optional("n"): vol.Any(
            vol.All(int, vol.Range(min=1, max=1, msg="only n=1 is supported")), None
        ),
        vol.Optional("user"): vol.Any(str, None),
        vol.Optional("tools"): vol.Any(
            [
                {
                    vol.Required("type"): "function",
                    vol.Required("function"): {
                        vol.Required("name"): str,
                    },
                }
            ],
            None,
        ),
        vol.Optional("tool_choice"): vol.Any(str, dict, None),
        vol.Optional("fairlane_class"): vol.In(_PRIORITY_NAMES),
    },
    extra=vol.ALLOW_EXTRA,  # other OpenAI fields (penalties, logprobs…) are accepted and ignored
)


def _validate(schema: vol.Schema, data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        return dict(schema(data))
    except vol.MultipleInvalid as err:
        first = err.errors[0]
        path = ".".join(str(p) for p in first.path)
        raise ApiError(400, f"{path or 'body'}: {first.msg}", param=path or None) from err


async def _json_body(request: web.Request) -> Any:
    try:
        return await request.json()
    except json.JSONDecodeError as err:
        raise ApiError(400, f"the body is not valid JSON: {err.msg} at position {err.pos}") from err
    except UnicodeDecodeError as err:
        raise ApiError(400, "the body is not UTF-8 text") from err


def _request_class(request: web.Request, body: dict[str, Any], default: Priority) -> Priority:
    """The class from `X-Fairlane-Class` or the `fairlane_class` field (the field wins)."""
    value = body.get("fairlane_class") or request.headers.get(CLASS_HEADER)
    if value is None:
        return default
    try:
        return Priority.parse(value)
    except ValueError as err:
        raise ApiError(400, str(err), param="fairlane_class") from err


# --- the application -------------------------------------------------------------------------


@dataclass
class Services:
    config: config_mod.Config
    device: DeviceLoop
    engine: LlamaEngine
    template: ChatTemplate | None
    template_error: str | None
    telemetry: Telemetry
    model_name: str
    policy_name: str
    speech: SpeechService | None = None
    wyoming_port: int | None = None
    embedder: EmbeddingEngine | None = None
    embed_name: str = ""
    documents: DocumentStore | None = None
    index_wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    summary_wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    started_at: float = field(default_factory=time.time)


SERVICES = web.AppKey("services", Services)
WYOMING = web.AppKey("wyoming", AsyncTcpServer)
INDEXER = web.AppKey("indexer", asyncio.Task)
SUMMARISER = web.AppKey("summariser", asyncio.Task)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as err:
        return err.response()
    except web.HTTPRequestEntityTooLarge as err:
        return ApiError(
            413, f"the body is larger than the limit ({err.text})", code="body_too_large"
        ).response()
    except web.HTTPException as err:
        if err.status >= 400:
            return ApiError(err.status, err.reason, kind="invalid_request_error").response()
        raise


def auth_middleware(token: str | None) -> Any:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if token is None or request.path == "/health":
            return await handler(request)
        supplied = request.headers.get("Authorization", "")
        scheme, _, value = supplied.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip(), token):
            return ApiError(
                401,
                "missing or wrong bearer token",
                kind="authentication_error",
                code="invalid_api_key",
            ).response()
        return await handler(request)

    return check


def create_app(services: Services) -> web.Application:
    max_bytes = int(services.config.server.max_body_mb * 1024 * 1024)
    app = web.Application(
        client_max_size=max_bytes,
        middlewares=[error_middleware, auth_middleware(services.config.server.token)],
    )
    app[SERVICES] = services
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/chat/completions/{id}/cancel", cancel_completion)
    app.router.add_post("/v1/audio/transcriptions", transcriptions)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_post("/v1/documents", add_document)
    app.router.add_get("/v1/documents", list_documents)
    app.router.add_post("/v1/documents/search", search_documents)
    app.router.add_get("/v1/documents/{id}", get_document)
    app.router.add_delete("/v1/documents/{id}", delete_document)
    app.router.add_get("/v1/jobs", jobs)
    app.router.add_post("/v1/summaries", add_summary)
    app.router.add_get("/v1/summaries/{id}", get_summary)
    app.router.add_get("/v1/jobs/{id}", job)
    app.router.add_get("/v1/stats", stats)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    app.on_startup.append(_start_wyoming)
    app.on_startup.append(_start_indexer)
    app.on_cleanup.append(_stop_wyoming)
    app.on_cleanup.append(_stop_indexer)
    return app


def _services(request: web.Request) -> Services:
    return request.app[SERVICES]


async def health(request: web.Request) -> web.Response:
    svc = _services(request)
    return web.json_response(
        {
            "status": "ok",
            "version": __version__,
            "policy": svc.policy_name,
            "models": {
                "llm": svc.model_name,
                "stt": svc.speech.model_name if svc.speech else None,
            },
            "wyoming_port": svc.wyoming_port,
        }
    )


async def list_models(request: web.Request) -> web.Response:
    svc = _services(request)
    names = [svc.model_name] + ([svc.speech.model_name] if svc.speech else [])
    names += [svc.embed_name] if svc.embedder else []
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "fairlane"} for name in names]
    return web.json_response({"object": "list", "data": data})


async def stats(request: web.Request) -> web.Response:
    svc = _services(request)
    body = svc.telemetry.stats(svc.device.snapshot())
    body["policy"] = svc.policy_name
    body["steps"] = _step_summary(svc.device)
    if svc.documents is not None:
        documents = await asyncio.to_thread(svc.documents.documents)
        body["background"] = {"indexing": progress(documents, svc.started_at)}
    return web.json_response(body)


async def metrics(request: web.Request) -> web.Response:
    svc = _services(request)
    return web.Response(
        body=svc.telemetry.prometheus(svc.device.snapshot()),
        content_type="text/plain",
        charset="utf-8",
    )


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(OPENAPI)


def _step_summary(device: DeviceLoop, last: int = 50) -> list[dict[str, Any]]:
    records = list(device.records)[-last:]
    return [
        {
            "start": round(r.start, 4),
            "end": round(r.end, 4),
            "kind": r.kind.value,
            "classes": sorted({p.label for p in r.classes}),
            "sequences": len(r.request_ids),
            "prefill_tokens": r.prefill_tokens,
            "decode_seqs": r.decode_seqs,
        }
        for r in records
    ]


async def cancel_completion(request: web.Request) -> web.Response:
    svc = _services(request)
    completion_id = request.match_info["id"]
    if not svc.device.cancel(completion_id):
        raise ApiError(404, f"no running completion {completion_id!r}", code="not_found")
    return web.json_response({"id": completion_id, "cancelled": True})


# --- chat completions --------------------------------------------------------------------------


@dataclass
class _Turn:
    """One chat completion in flight: its id, queue of token events and measurements."""

    id: str
    queue: asyncio.Queue[TokenEvent]
    prompt_tokens: int
    buffer_tools: bool


async def chat_completions(request: web.Request) -> web.StreamResponse:
    svc = _services(request)
    body = _validate(CHAT_REQUEST, await _json_body(request))
    if svc.template is None:
        raise ApiError(
            400, f"this model cannot chat: {svc.template_error}", code="no_chat_template"
        )
    priority = _request_class(request, body, Priority.CHAT)
    tools = body.get("tools") or []
    if body.get("tool_choice") == "none":
        tools = []
    try:
        prompt_text = svc.template.render(body["messages"], tools or None)
    except ChatTemplateError as err:
        raise ApiError(400, str(err), param="messages") from err
    prompt = await asyncio.to_thread(svc.engine.tokenize, prompt_text)
    limit = svc.engine.n_ctx
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    max_tokens = max_tokens or svc.config.llm.max_tokens
    if len(prompt) + 1 > limit:
        raise ApiError(
            400,
            f"the prompt has {len(prompt)} tokens; the context holds {limit}",
            param="messages",
            code="context_length_exceeded",
        )
    max_tokens = min(max_tokens, limit - len(prompt))
    stop = body.get("stop")
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=0.7 if body.get("temperature") is None else body["temperature"],
        top_p=1.0 if body.get("top_p") is None else body["top_p"],
        top_k=body.get("top_k") or 0,
        seed=body.get("seed"),
        stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
    )
    turn = _Turn(f"chatcmpl-{uuid.uuid4().hex}", asyncio.Queue(), len(prompt), bool(tools))
    loop = asyncio.get_running_loop()
    client = body.get("user") or request.headers.get("X-Fairlane-Client") or "anonymous"
    policy_request = Request(
        turn.id, Kind.LLM, priority, client, 0.0, prompt_tokens=len(prompt), max_tokens=max_tokens
    )

    def sink(event: TokenEvent) -> None:
        loop.call_soon_threadsafe(turn.queue.put_nowait, event)

    admission = svc.device.submit(
        policy_request, lambda: svc.engine.add(turn.id, prompt, params), sink
    )
    if not admission.accepted:
        svc.telemetry.refuse(priority)
        raise ApiError(
            429, f"request refused: {admission.reason}", kind="overloaded", code="refused"
        )
    record = svc.telemetry.begin(Kind.LLM, priority, client, len(prompt), policy_request.arrival)
    try:
        if body["stream"]:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            response = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await response.prepare(request)
            # A client that goes away mid-stream: `finally` cancels its sequence.
            with contextlib.suppress(ConnectionResetError):
                await _stream(response, svc, turn, record, tools, include_usage)
            return response
        return await _complete(svc, turn, record, tools)
    finally:
        if record.finished_at is None:  # the client went away or the handler failed
            svc.device.cancel(turn.id)
            svc.telemetry.finish(record, svc.device.clock(), outcome="cancelled")


async def _next_event(turn: _Turn) -> TokenEvent:
    event = await turn.queue.get()
    if event.finish_reason and event.finish_reason.startswith("error"):
        raise ApiError(500, f"the engine failed: {event.finish_reason}", kind="server_error")
    return event


def _finish(svc: Services, record: Any, event: TokenEvent) -> None:
    # A cancelled turn ends its stream cleanly; it is counted as cancelled, not as served.
    outcome = "cancelled" if event.finish_reason == "cancelled" else "finished"
    svc.telemetry.finish(record, svc.device.clock(), outcome=outcome)


async def _complete(svc: Services, turn: _Turn, record: Any, tools: list[Any]) -> web.Response:
    parts: list[str] = []
    while True:
        event = await _next_event(turn)
        if event.finish_reason != "cancelled":
            svc.telemetry.token(record, svc.device.clock())
        parts.append(event.text)
        if event.finish_reason:
            break
    _finish(svc, record, event)
    text = "".join(parts)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    finish = "stop" if event.finish_reason == "cancelled" else event.finish_reason
    calls = parse_tool_calls(text, tools) if tools else None
    if calls:
        message = {"role": "assistant", "content": None, "tool_calls": calls}
        finish = "tool_calls"
    completion = len(record.token_times)
    return web.json_response(
        {
            "id": turn.id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": svc.model_name,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": turn.prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": turn.prompt_tokens + completion,
            },
        }
    )


async def _stream(
    response: web.StreamResponse,
    svc: Services,
    turn: _Turn,
    record: Any,
    tools: list[Any],
    include_usage: bool,
) -> None:
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": turn.id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": svc.model_name,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    async def send(payload: dict[str, Any]) -> None:
        await response.write(f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode())

    # SSE as OpenAI streams it:
    #   data: {"choices":[{"delta":{"role":"assistant","content":""}}]}
    #   data: {"choices":[{"delta":{"content":"The"}}]} …
    #   data: {"choices":[{"delta":{},"finish_reason":"stop"}]}
    #   data: [DONE]
    await send(chunk({"role": "assistant", "content": ""}))
    held = ""  # with tools offered, text that may still turn out to be a tool call
    holding = bool(tools)
    while True:
        event = await _next_event(turn)
        if event.finish_reason != "cancelled":
            svc.telemetry.token(record, svc.device.clock())
        if holding:
            held += event.text
            holding = may_be_tool_call(held)
            if not holding and held:
                await send(chunk({"content": held}))
        elif event.text:
            await send(chunk({"content": event.text}))
        if event.finish_reason:
            break
    finish = event.finish_reason
    if held and holding:
        calls = parse_tool_calls(held, tools)
        if calls:
            for index, call in enumerate(calls):
                await send(chunk({"tool_calls": [{"index": index, **call}]}))
            finish = "tool_calls"
        else:
            await send(chunk({"content": held}))
    _finish(svc, record, event)
    await send(chunk({}, "stop" if finish == "cancelled" else finish))
    if include_usage:
        completion = len(record.token_times)
        usage = {
            "prompt_tokens": turn.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": turn.prompt_tokens + completion,
        }
        await send(
            {
                "id": turn.id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": svc.model_name,
                "choices": [],
                "usage": usage,
            }
        )
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()


# --- speech-to-text ----------------------------------------------------------------------------

RAW_PCM_TYPES = ("audio/pcm", "audio/l16", "audio/x-raw", "audio/raw")
RESPONSE_FORMATS = ("json", "text", "verbose_json")


async def transcriptions(request: web.Request) -> web.StreamResponse:
    """OpenAI's `POST /v1/audio/transcriptions` (multipart), scheduled as `voice` by default."""
    svc = _services(request)
    if svc.speech is None:
        raise ApiError(
            400,
            "speech-to-text is disabled on this server (stt.enabled: false)",
            code="stt_disabled",
        )
    fields, upload = await _read_form(request)
    if upload is None:
        raise ApiError(
            400, "no `file` part: send the audio as multipart form field `file`", param="file"
        )
    data, filename, content_type = upload
    response_format = fields.get("response_format") or "json"
    if response_format not in RESPONSE_FORMATS:
        raise ApiError(
            400,
            f"response_format must be one of {', '.join(RESPONSE_FORMATS)}",
            param="response_format",
        )
    priority = _request_class(request, fields, Priority.VOICE)
    raw_rate = None
    if content_type in RAW_PCM_TYPES or filename.endswith((".pcm", ".raw")):
        try:
            raw_rate = int(fields.get("sample_rate") or 16000)
        except ValueError as err:
            raise ApiError(
                400, "sample_rate must be a whole number of Hz", param="sample_rate"
            ) from err
    try:
        audio = await asyncio.to_thread(decode_audio, data, raw_rate)
        utterance = Utterance(audio, fields.get("language") or None, fields.get("prompt") or None)
        result = await transcribe(
            svc.device,
            svc.speech.engine,
            svc.telemetry,
            utterance,
            priority,
            fields.get("user") or "anonymous",
        )
    except AudioError as err:
        raise ApiError(400, str(err), param="file", code="bad_audio") from err
    except Refused as err:
        raise ApiError(429, f"request refused: {err}", kind="overloaded", code="refused") from err
    except Cancelled as err:
        raise ApiError(409, str(err), code="cancelled") from err
    if response_format == "text":
        return web.Response(text=result.text + "\n")
    if response_format == "json":
        return web.json_response({"text": result.text})
    return web.json_response(
        {
            "task": "transcribe",
            "language": result.language,
            "duration": round(result.duration_s, 3),
            "text": result.text,
            "segments": [
                {"id": 0, "start": 0.0, "end": round(result.duration_s, 3), "text": result.text}
            ],
        }
    )


async def _read_form(request: web.Request) -> tuple[dict[str, str], tuple[bytes, str, str] | None]:
    """The text fields and the `file` part (bytes, filename, content type) of a multipart body."""
    if not request.content_type.startswith("multipart/"):
        raise ApiError(400, "send multipart/form-data with the audio in a `file` field")
    fields: dict[str, str] = {}
    upload: tuple[bytes, str, str] | None = None
    try:
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader) or part.name is None:
                continue
            if part.name == "file":
                data = await part.read()
                upload = (bytes(data), part.filename or "", part.headers.get("Content-Type", ""))
            else:
                fields[part.name] = (await part.text()).strip()
    except (ValueError, AssertionError, ClientPayloadError) as err:
        raise ApiError(400, f"the multipart body is malformed or truncated: {err}") from err
    return fields, upload


# --- embeddings ----------------------------------------------------------------------------------

EMBED_REQUEST = vol.Schema(
    {
        vol.Required("input"): vol.Any(
            str, [str], msg="input must be a string or a list of strings"
        ),
        vol.Optional("model"): str,
        vol.Optional("encoding_format", default="float"): vol.In(["float", "base64"]),
        vol.Optional("dimensions"): vol.Any(vol.All(int, vol.Range(min=1)), None),
        vol.Optional("user"): vol.Any(str, None),
        vol.Optional("fairlane_class"): vol.In(_PRIORITY_NAMES),
    },
    extra=vol.ALLOW_EXTRA,
)


async def embeddings(request: web.Request) -> web.Response:
    """OpenAI's `POST /v1/embeddings`: each text is one micro-batch item (class `background`)."""
    svc = _services(request)
    if svc.embedder is None:
        raise ApiError(
            400,
            "embeddings are disabled on this server (embed.enabled: false)",
            code="embed_disabled",
        )
    body = _validate(EMBED_REQUEST, await _json_body(request))
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
    if dims is not None and dims != svc.embedder.dimensions:
        raise ApiError(
            400,
            f"dimensions: this model gives {svc.embedder.dimensions}-dimensional "
            "vectors and cannot shorten them",
            param="dimensions",
        )
    priority = _request_class(request, body, Priority.BACKGROUND)
    client = body.get("user") or "anonymous"
    token_ids = await asyncio.to_thread(svc.embedder.tokenize, texts)
    vectors = await _embed_all(svc, token_ids, priority, client)
    used = sum(len(ids) for ids in token_ids)
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": base64.b64encode(v.tobytes()).decode()
            if body["encoding_format"] == "base64"
            else v.tolist(),
        }
        for i, v in enumerate(vectors)
    ]
    return web.json_response(
        {
            "object": "list",
            "data": data,
            "model": svc.embed_name,
            "usage": {"prompt_tokens": used, "total_tokens": used},
        }
    )


async def _embed_all(
    svc: Services, token_ids: list[list[int]], priority: Priority, client: str
) -> list[Any]:
    """Queue every text as one EMBED request; all or nothing."""
    assert svc.embedder is not None
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
                loop.call_soon_threadsafe(_resolve, future, event)

            def register(request_id: str = request_id, tokens: list[int] = tokens) -> None:
                embedder.add(request_id, tokens)

            item = Request(request_id, Kind.EMBED, priority, client, 0.0, prompt_tokens=len(tokens))
            admission = svc.device.submit(item, register, sink)
            if not admission.accepted:
                svc.telemetry.refuse(priority)
                raise ApiError(
                    429, f"request refused: {admission.reason}", kind="overloaded", code="refused"
                )
            futures.append(future)
            ids.append(request_id)
        events = await asyncio.gather(*futures)
    except BaseException:
        for request_id in ids:
            svc.device.cancel(request_id)
        raise
    if any(not hasattr(e, "vector") for e in events):
        raise ApiError(409, "the embedding request was cancelled", code="cancelled")
    return [e.vector for e in events]


def _resolve(future: asyncio.Future[Any], event: Any) -> None:
    if not future.done():
        future.set_result(event)


# --- documents ------------------------------------------------------------------------------------

CHUNK_TOKENS, CHUNK_OVERLAP = 200, 40


def _documents(request: web.Request) -> tuple[Services, DocumentStore]:
    svc = _services(request)
    if svc.documents is None or svc.embedder is None:
        raise ApiError(
            400,
            "documents need the embedding engine (embed.enabled: false)",
            code="documents_disabled",
        )
    return svc, svc.documents


async def add_document(request: web.Request) -> web.Response:
    """Store a document durably, then answer; indexing runs in the background lane."""
    svc, store = _documents(request)
    if request.content_type.startswith("multipart/"):
        fields, upload = await _read_form(request)
        if upload is None:
            raise ApiError(400, "no `file` part in the multipart body", param="file")
        data, filename, content_type = upload
        content_type = fields.get("content_type") or content_type or "text/plain"
        meta: dict[str, Any] = {
            "title": fields.get("title") or filename,
            "source": fields.get("source"),
            "tags": [t for t in (fields.get("tags") or "").split(",") if t],
        }
    else:
        body = _validate(DOCUMENT_REQUEST, await _json_body(request))
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
    chunks = await asyncio.to_thread(_chunk, embedder, text)
    title = meta["title"] or text.splitlines()[0][:80]
    document_id, created = await asyncio.to_thread(
        store.add, text, chunks, title, meta["source"], meta["tags"], content_type
    )
    svc.index_wakeup.set()
    document = store.documents(document_id)[0]
    return web.json_response({**document, "unchanged": not created}, status=202 if created else 200)


def _chunk(embedder: EmbeddingEngine, text: str) -> list[tuple[str, list[int]]]:
    """Token-aware overlapping chunks of `text`, each with the token ids it will embed."""
    encoding = embedder.tokenizer_full.encode(text, add_special_tokens=False)
    chunks = []
    for start, end in chunk_tokens(encoding.ids, CHUNK_TOKENS, CHUNK_OVERLAP):
        piece = text[encoding.offsets[start][0] : encoding.offsets[end - 1][1]]
        chunks.append((piece, embedder.tokenize([piece])[0]))
    return chunks


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
        vol.Optional("top_k", default=5): vol.All(int, vol.Range(min=1, max=50)),
    },
    extra=vol.PREVENT_EXTRA,
)


async def list_documents(request: web.Request) -> web.Response:
    _, store = _documents(request)
    return web.json_response({"data": await asyncio.to_thread(store.documents)})


async def get_document(request: web.Request) -> web.Response:
    _, store = _documents(request)
    found = await asyncio.to_thread(store.documents, request.match_info["id"])
    if not found:
        raise ApiError(404, f"no document {request.match_info['id']!r}", code="not_found")
    return web.json_response(found[0])


async def delete_document(request: web.Request) -> web.Response:
    _, store = _documents(request)
    if not await asyncio.to_thread(store.delete, request.match_info["id"]):
        raise ApiError(404, f"no document {request.match_info['id']!r}", code="not_found")
    return web.json_response({"id": request.match_info["id"], "deleted": True})


async def search_documents(request: web.Request) -> web.Response:
    """Query → the top-k chunks, embedded at `chat` class (someone is waiting for it)."""
    svc, store = _documents(request)
    body = _validate(SEARCH_REQUEST, await _json_body(request))
    assert svc.embedder is not None
    tokens = svc.embedder.tokenize([body["query"]])
    priority = _request_class(request, body, Priority.CHAT)
    [vector] = await _embed_all(svc, tokens, priority, "search")
    hits = await asyncio.to_thread(store.search, vector, body["top_k"])
    return web.json_response({"data": [hit.__dict__ for hit in hits]})


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


async def _index_forever(svc: Services) -> None:
    """Embed chunks that have no vector yet, oldest documents first, until cancelled."""
    assert svc.documents is not None and svc.embedder is not None
    while True:
        batch = await asyncio.to_thread(svc.documents.pending, 256)
        if not batch:
            svc.index_wakeup.clear()
            await svc.index_wakeup.wait()
            continue
        try:
            vectors = await _embed_all(
                svc, [tokens for _, _, tokens in batch], Priority.BACKGROUND, "documents"
            )
        except ApiError as err:  # refused (queue full): try again shortly
            _LOGGER.warning("indexing paused: %s", err.message)
            await asyncio.sleep(1.0)
            continue
        items = [
            (chunk_id, vector) for (chunk_id, _, _), vector in zip(batch, vectors, strict=True)
        ]
        await asyncio.to_thread(svc.documents.store_vectors, items)


# --- summaries --------------------------------------------------------------------------------

SUMMARY_REQUEST = vol.Schema(
    {
        vol.Optional("document_id"): str,
        vol.Optional("text"): vol.All(str, vol.Length(min=1, msg="must not be empty")),
        vol.Optional("style", default="short"): vol.In(["short", "bullets"]),
        vol.Optional("max_words", default=80): vol.All(int, vol.Range(min=10, max=400)),
    },
    extra=vol.PREVENT_EXTRA,
)
SUMMARY_PIECE_TOKENS = 1500


async def add_summary(request: web.Request) -> web.Response:
    """A summary job, durable before it is acknowledged; its result comes from the job."""
    svc, store = _documents(request)
    if svc.template is None:
        raise ApiError(
            400, f"this model cannot chat: {svc.template_error}", code="no_chat_template"
        )
    body = _validate(SUMMARY_REQUEST, await _json_body(request))
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


async def get_summary(request: web.Request) -> web.Response:
    _, store = _documents(request)
    found = await asyncio.to_thread(store.summaries, request.match_info["id"])
    if not found:
        raise ApiError(404, f"no summary {request.match_info['id']!r}", code="not_found")
    return web.json_response(found[0])


async def generate(
    svc: Services, messages: list[dict[str, Any]], max_tokens: int, priority: Priority, client: str
) -> str:
    """One LLM turn through the device loop, collected (summaries, and other server jobs)."""
    assert svc.template is not None
    prompt = await asyncio.to_thread(svc.engine.tokenize, svc.template.render(messages))
    if len(prompt) + max_tokens > svc.engine.n_ctx:
        raise ValueError(f"{len(prompt)} prompt tokens do not fit the context")
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
    request_id = f"gen-{uuid.uuid4().hex}"
    params = SamplingParams(max_tokens=max_tokens, temperature=0.2, seed=0)
    item = Request(
        request_id,
        Kind.LLM,
        priority,
        client,
        0.0,
        prompt_tokens=len(prompt),
        max_tokens=max_tokens,
    )

    def sink(event: TokenEvent) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, event)

    admission = svc.device.submit(item, lambda: svc.engine.add(request_id, prompt, params), sink)
    if not admission.accepted:
        raise RuntimeError(f"refused: {admission.reason}")
    parts: list[str] = []
    finished = False
    try:
        while not finished:
            event = await queue.get()
            parts.append(event.text)
            finished = event.finish_reason is not None
    finally:
        if not finished:
            svc.device.cancel(request_id)
    if event.finish_reason in ("cancelled",) or str(event.finish_reason).startswith("error"):
        raise RuntimeError(f"generation {event.finish_reason}")
    return "".join(parts).strip()


async def summarize(svc: Services, text: str, style: str, max_words: int) -> str:
    """Map-reduce: long text is summarised in pieces (batched together), then the pieces."""
    tokens = await asyncio.to_thread(svc.engine.tokenize, text)
    if len(tokens) > SUMMARY_PIECE_TOKENS:
        pieces = max(2, -(-len(tokens) // SUMMARY_PIECE_TOKENS))
        size = -(-len(text) // pieces)
        parts = await asyncio.gather(
            *(
                _summary_turn(svc, text[i : i + size], "short", 80)
                for i in range(0, len(text), size)
            )
        )
        text = "\n".join(parts)
    return await _summary_turn(svc, text, style, max_words)


async def _summary_turn(svc: Services, text: str, style: str, max_words: int) -> str:
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
    return await generate(svc, messages, max_words * 2, Priority.BACKGROUND, "summaries")


async def _summarise_forever(svc: Services) -> None:
    """Run pending summary jobs (after a restart too: a job is done only once it is stored)."""
    assert svc.documents is not None
    while True:
        pending = await asyncio.to_thread(svc.documents.pending_summaries)
        if not pending:
            svc.summary_wakeup.clear()
            await svc.summary_wakeup.wait()
            continue
        for job in pending:
            try:
                result = await summarize(svc, job["text"], job["style"], job["max_words"])
                error = None
            except (RuntimeError, ValueError) as err:
                result, error = None, str(err)
            await asyncio.to_thread(svc.documents.finish_summary, job["id"], result, error)


async def _start_indexer(app: web.Application) -> None:
    svc = app[SERVICES]
    if svc.documents is not None and svc.embedder is not None:
        app[INDEXER] = asyncio.create_task(_index_forever(svc))
        if svc.template is not None:
            app[SUMMARISER] = asyncio.create_task(_summarise_forever(svc))


async def _stop_indexer(app: web.Application) -> None:
    for key in (INDEXER, SUMMARISER):
        if key in app:
            app[key].cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await app[key]


# --- start-up ----------------------------------------------------------------------------------


def build_services(cfg: config_mod.Config) -> Services:
    """Load the model, start the device loop: everything `serve` needs, ready to use."""
    profile, device_type = load_profile(cfg.profile)
    policy_config = cfg.serving_policy(device_type)
    model_path = models.resolve_llm(cfg.llm.model)
    engine = LlamaEngine(
        EngineConfig(
            model_path=model_path,
            n_ctx=cfg.llm.n_ctx,
            n_seq_max=cfg.llm.n_seq_max,
            n_batch=cfg.llm.n_batch,
            n_threads=cfg.llm.threads,
            n_gpu_layers=cfg.llm.gpu_layers,
        )
    )
    template: ChatTemplate | None = None
    template_error: str | None = None
    try:
        template = ChatTemplate(
            engine.metadata("tokenizer.chat_template"), engine.bos_text, engine.eos_text
        )
    except ChatTemplateError as err:
        template_error = str(err)
        _LOGGER.warning("%s: %s", model_path.name, err)
    engines: dict[Kind, Any] = {Kind.LLM: engine}
    stt: WhisperEngine | None = None
    if cfg.stt.enabled:
        stt = WhisperEngine(
            SttConfig(
                model_path=Path(models.resolve_stt(cfg.stt.model)),
                device=cfg.stt.device,
                compute_type=cfg.stt.compute_type,
                threads=cfg.stt.threads or default_threads(),
                beam_size=cfg.stt.beam_size,
                vad=cfg.stt.vad,
            )
        )
        engines[Kind.STT] = stt
    embedder: EmbeddingEngine | None = None
    if cfg.embed.enabled:
        embedder = EmbeddingEngine(
            EmbedEngineConfig(
                model_path=models.resolve_embedder(cfg.embed.model),
                backend=cfg.embed.backend,
                device=cfg.embed.device,
                threads=cfg.embed.threads or default_threads(),
            )
        )
        engines[Kind.EMBED] = embedder
    policy = make_policy(cfg.policy_name, policy_config, CostModel(profile))
    device = DeviceLoop(policy, engines)
    device.start()
    telemetry = Telemetry(policy_config)
    name = cfg.llm.model if cfg.llm.model in models.PACKAGED else model_path.stem
    speech = SpeechService(device, stt, telemetry, cfg.stt.model) if stt is not None else None
    return Services(
        cfg,
        device,
        engine,
        template,
        template_error,
        telemetry,
        name,
        cfg.policy_name,
        speech,
        embedder=embedder,
        embed_name=cfg.embed.model,
        documents=DocumentStore(Path(cfg.server.data_dir).expanduser() / "fairlane.sqlite")
        if embedder is not None
        else None,
    )


async def _start_wyoming(app: web.Application) -> None:
    svc = app[SERVICES]
    if svc.speech is None or not svc.config.wyoming.enabled:
        return
    host = svc.config.wyoming.host or svc.config.server.host
    server = await wyoming_server.start(svc.speech, host, svc.config.wyoming.port)
    svc.wyoming_port = wyoming_server.bound_port(server)
    app[WYOMING] = server
    _LOGGER.info("Wyoming ASR on tcp://%s:%d (no authentication)", host, svc.wyoming_port)


async def _stop_wyoming(app: web.Application) -> None:
    if WYOMING in app:
        await app[WYOMING].stop()


def serve(args: argparse.Namespace) -> int:
    """`fairlane serve`: flags override the config file; the token may come from FAIRLANE_TOKEN."""
    log_format = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.INFO, format=log_format)
    cfg = config_mod.load(args.config)
    server = cfg.server
    server = replace(
        server,
        host=args.host or server.host,
        port=args.port if args.port is not None else server.port,
        token=args.token or os.environ.get("FAIRLANE_TOKEN") or server.token,
    )
    cfg = replace(cfg, server=server, policy_name=args.policy or cfg.policy_name)
    services = build_services(cfg)
    if cfg.server.token is None and cfg.server.host not in ("127.0.0.1", "localhost", "::1"):
        _LOGGER.warning(
            "serving on %s without a token: anyone on the network can use it", cfg.server.host
        )
    app = create_app(services)
    app.on_cleanup.append(lambda _app: _shutdown(services))
    print(
        f"fairlane {__version__}: {services.model_name} with the {cfg.policy_name} policy on "
        f"http://{cfg.server.host}:{cfg.server.port}",
        flush=True,
    )
    web.run_app(app, host=cfg.server.host, port=cfg.server.port, print=None, handle_signals=True)
    return 0


async def _shutdown(services: Services) -> None:
    await asyncio.to_thread(services.device.stop)
    with contextlib.suppress(Exception):
        services.engine.close()


class BackgroundServer:
    """The real server on 127.0.0.1 in a thread of this process (tests and benchmarks).

    Same app, same device loop, same engine as `fairlane serve`; only the event loop runs in a
    thread so the caller can use blocking clients and read the device's step records.
    """

    def __init__(self, cfg: config_mod.Config) -> None:
        self.services = build_services(cfg)
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(create_app(self.services))
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", cfg.server.port)
        self.loop.run_until_complete(site.start())
        sockets: Any = getattr(site._server, "sockets", None)  # the port the OS picked
        self.port = int(sockets[0].getsockname()[1]) if sockets else cfg.server.port
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="fairlane-http", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()
        self.services.device.stop()
        self.services.engine.close()

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
