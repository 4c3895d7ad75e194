"""What every API handler shares: the error type, request validation, the services bundle."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import voluptuous as vol
from aiohttp import BodyPartReader, ClientPayloadError, web
from aiohttp.http_exceptions import HttpProcessingError
from wyoming.server import AsyncTcpServer

from fairlane import config as config_mod
from fairlane.api.openapi import operation_of
from fairlane.api.speculation import Speculation
from fairlane.documents.store import DocumentStore
from fairlane.engines.chat_template import ChatTemplate
from fairlane.engines.embed import EmbeddingEngine
from fairlane.engines.llm import (
    LlamaEngine,
)
from fairlane.engines.placement import Placement
from fairlane.policy import Admission, Kind, Priority
from fairlane.runtime.components import Component
from fairlane.runtime.device import Devices
from fairlane.runtime.remote import RemoteLane
from fairlane.runtime.telemetry import Telemetry
from fairlane.voice.synthesis import VoiceService
from fairlane.voice.wyoming import SpeechService, WyomingServices

if TYPE_CHECKING:  # grammars imports this module
    from fairlane.api.grammars import Grammars
    from fairlane.runtime.pulls import PullJobs

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
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.headers = headers or {}
        self.status, self.message, self.kind, self.param, self.code = (
            status,
            message,
            kind,
            param,
            code,
        )

    def body(self) -> dict[str, Any]:
        """OpenAI's error object."""
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status, headers=self.headers)


PRIORITY_NAMES = [p.label for p in Priority]
# The descriptions of the fields every class-aware request shares (for the OpenAPI document).
PRIORITY_FIELD = "vLLM's and SGLang's field: below 0 is voice, 0 chat, above 0 background, or a "\
    "class name; fairlane_class wins"
DEADLINE_FIELD = "ms until the first output, 1 to 86400000; a request that cannot meet it is "\
    "refused (429)"


def validate(schema: vol.Schema, data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        return dict(schema(data))
    except vol.MultipleInvalid as err:
        first = err.errors[0]
        path = ".".join(str(p) for p in first.path)
        raise ApiError(400, f"{path or 'body'}: {first.msg}", param=path or None) from err


# A JSON string escape of a UTF-16 surrogate (`\\ud800`): JSON allows one alone, Unicode does not.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


async def json_body(request: web.Request) -> Any:
    """The body parsed as JSON, or a 400 that says what is wrong with it."""
    try:
        text = (await request.read()).decode("utf-8")
        body = json.loads(text)
        # A lone surrogate (`\ud800`) is valid JSON but not text: every later step that
        # encodes the string (tokenizers, SQLite, the response) would fail on it. Only a body
        # with such an escape is checked (encoding every body again doubled the work).
        if _SURROGATE_ESCAPE.search(text):
            json.dumps(body, ensure_ascii=False).encode("utf-8")
    except json.JSONDecodeError as err:
        raise ApiError(400, f"the body is not valid JSON: {err.msg} at position {err.pos}") from err
    except UnicodeDecodeError as err:
        raise ApiError(400, "the body is not UTF-8 text") from err
    except UnicodeEncodeError as err:
        raise ApiError(
            400, f"the body holds a lone surrogate ({err.object[err.start:err.end]!a}): "
            "not Unicode text"
        ) from err
    except RecursionError as err:
        raise ApiError(400, "the body's JSON is nested too deeply") from err
    return body


async def read_json(request: web.Request) -> dict[str, Any]:
    """The JSON body, validated with the schema its handler declares (`@operation(json=…)`)."""
    schema = operation_of(request.match_info.handler).json
    assert schema is not None, "the handler declares no JSON body"
    return validate(schema, await json_body(request))


# The most urgent class the request's token may claim (None: any), set by the auth middleware.
CLIENT_GRANT = web.RequestKey("fairlane_client_grant", Priority)
# Whose token the request carries: "server" for `server.token`, a client's name for one of
# `server.clients`; unset when the server needs no token. Set by the auth middleware.
CLIENT_TOKEN = web.RequestKey("fairlane_client_token", str)


def request_class(request: web.Request, body: dict[str, Any], default: Priority) -> Priority:
    """The class from the `fairlane_class` field, the `X-Fairlane-Class` header or the
    `priority` field, in that order; none of them: `default`. A class above the token's
    ceiling (`server.clients`) runs at the ceiling."""
    value = body.get("fairlane_class") or request.headers.get(CLASS_HEADER)
    if value is None and body.get("priority") is not None:
        asked = priority_field(body["priority"])
    elif value is None:
        asked = default
    else:
        try:
            asked = Priority.parse(value)
        except ValueError as err:
            raise ApiError(400, str(err), param="fairlane_class") from err
    ceiling = request.get(CLIENT_GRANT)
    return asked if ceiling is None else max(asked, ceiling)


def priority_field(value: Any) -> Priority:
    """The `priority` request field that vLLM and SGLang take, mapped to a class.

    A number as vLLM reads it (lower is served first, 0 is the default): below 0 is `voice`,
    0 is `chat`, above 0 is `background`. A class name is taken as it is.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ApiError(400, "priority must be an integer or a class name", param="priority")
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():  # a form field
        value = int(value)
    if isinstance(value, int):
        if value < 0:
            return Priority.VOICE
        return Priority.CHAT if value == 0 else Priority.BACKGROUND
    try:
        return Priority.parse(value)
    except ValueError as err:
        raise ApiError(400, f"priority: {err}", param="priority") from err


DEADLINE_HEADER = "X-Fairlane-Deadline-Ms"


def request_deadline(request: web.Request, body: dict[str, Any]) -> float | None:
    """Seconds from arrival by which the first output must come (rule 9), from the
    `deadline_ms` field or the `X-Fairlane-Deadline-Ms` header (the field wins); none: the
    class's configured default."""
    value = body.get("deadline_ms")
    if value is None:
        value = request.headers.get(DEADLINE_HEADER)
    if value is None or value == "":
        return None
    try:
        milliseconds = float(value)
    except (TypeError, ValueError) as err:
        raise ApiError(
            400, "deadline_ms must be a number of milliseconds", param="deadline_ms"
        ) from err
    if not 1 <= milliseconds <= 86_400_000:
        raise ApiError(400, "deadline_ms must be between 1 and 86400000", param="deadline_ms")
    return milliseconds / 1000.0


def refused(admission: Admission) -> ApiError:
    """Admission control's answer for the client: 429 when a retry may succeed (a full queue,
    a deadline the backlog cannot meet), 400 when it never will (too large), 503 when nothing
    of its kind can run until the server restarts (its device loop stopped on a fault)."""
    if admission.unavailable:
        return ApiError(
            503, f"request refused: {admission.reason}", kind="server_error", code="device_failed"
        )
    if admission.retryable:
        # When to try again: after the predicted wait, or in a second for a full queue.
        retry_s = max(1, math.ceil(admission.predicted_wait_s))
        return ApiError(
            429,
            f"request refused: {admission.reason}",
            kind="overloaded",
            code="refused",
            headers={"Retry-After": str(retry_s)},
        )
    return ApiError(400, f"request refused: {admission.reason}", code="does_not_fit")


def refuse_early(svc: Services, priority: Priority, kind: Kind) -> None:
    """Rule 9, before any work on the request: a class whose queue is full is refused at once
    (an overloaded server answers 429s fast instead of rendering and tokenizing each one)."""
    admission = svc.device.quick_refusal(priority, kind)
    if admission is not None:
        svc.telemetry.refuse(priority)
        raise refused(admission)


def deadline_passed(reason: str) -> ApiError:
    """A waiting request dropped when its deadline passed (rule 9)."""
    return ApiError(
        429,
        f"request expired: {reason}",
        kind="overloaded",
        code="deadline_exceeded",
        headers={"Retry-After": "1"},
    )


# --- the application -------------------------------------------------------------------------


@dataclass
class Services:
    config: config_mod.Config
    device: Devices
    engine: LlamaEngine
    template: ChatTemplate | None
    template_error: str | None
    telemetry: Telemetry
    model_name: str
    policy_name: str
    speech: SpeechService | None = None
    voice: VoiceService | None = None
    wyoming_port: int | None = None
    wyoming: WyomingServices | None = None  # the Wyoming server's, once it is started
    embedder: EmbeddingEngine | None = None
    embed_name: str = ""
    documents: DocumentStore | None = None
    index_wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    summary_wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    started_at: float = field(default_factory=time.time)
    instance_id: str = ""  # this server's stable id (`fairlane.runtime.identity`)
    placements: list[Placement] = field(default_factory=list)  # where each engine runs
    data_lock: Any = None  # the data directory's lock file, held while the server runs
    # The long-running parts (indexer, summariser) and their health, for /health.
    components: dict[str, Component] = field(default_factory=dict)
    # Lanes on other machines (`remotes:`), each serving some classes' LLM or embedding work.
    remotes: list[RemoteLane] = field(default_factory=list)
    # Chat turns begun on a client's guess, held for the request that claims them.
    speculation: Speculation | None = None
    # Chat requests' grammars, built off the event loop (made at the first that needs one).
    grammars: Grammars | None = None
    # Models being pulled: the config's, and those asked for (runtime.pulls).
    pulls: PullJobs | None = None


SERVICES = web.AppKey("services", Services)
WYOMING = web.AppKey("wyoming", AsyncTcpServer)
INDEXER = web.AppKey("indexer", asyncio.Task)
SUMMARISER = web.AppKey("summariser", asyncio.Task)


def services_of(request: web.Request) -> Services:
    return request.app[SERVICES]


Engine = TypeVar("Engine")


def enabled(engine: Engine | None, disabled: str, code: str) -> Engine:
    """`engine`, or the 400 that says why this server runs without it."""
    if engine is None:
        raise ApiError(400, disabled, code=code)
    return engine


def chat_template(svc: Services) -> ChatTemplate:
    """The model's chat template, or the 400 that says why this model cannot chat."""
    if svc.template is None:
        raise ApiError(
            400, f"this model cannot chat: {svc.template_error}", code="no_chat_template"
        )
    return svc.template


async def read_form(request: web.Request) -> tuple[dict[str, Any], tuple[bytes, str, str]]:
    """A multipart body: its text fields, validated with the schema its handler declares
    (`@operation(form=…)`), and its `file` part (bytes, filename, content type)."""
    op = operation_of(request.match_info.handler)
    if not request.content_type.startswith("multipart/"):
        raise ApiError(400, "send multipart/form-data with the file in a `file` field")
    fields: dict[str, str] = {}
    upload: tuple[bytes, str, str] | None = None
    try:
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader) or part.name is None:
                continue
            if part.name == "file":
                data = await part.read()
                # aiohttp's client percent-encodes the file name (quote_fields); browsers do not.
                filename = urllib.parse.unquote(part.filename or "")
                upload = (bytes(data), filename, part.headers.get("Content-Type", ""))
            else:
                fields[part.name] = (await part.text()).strip()
    except (ValueError, AssertionError, ClientPayloadError, HttpProcessingError) as err:
        raise ApiError(400, f"the multipart body is malformed or truncated: {err}") from err
    if upload is None:
        raise ApiError(
            400, "no `file` part: send the file as multipart form field `file`", param="file"
        )
    # An empty field is an absent one (HTML forms send every field).
    given = {name: value for name, value in fields.items() if value != ""}
    return (validate(op.form, given) if op.form is not None else given), upload


def resolve_future(future: asyncio.Future[Any], event: Any) -> None:
    if not future.done():
        future.set_result(event)
