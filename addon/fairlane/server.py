"""The HTTP server (aiohttp): its routes (the handlers live in `fairlane.api`), health, stats,
metrics, the OpenAPI document made from the routes, and `fairlane serve` itself (what it runs
is built in `fairlane.startup`).

Handlers validate, render and tokenize, then hand the request to the device loop and await its
tokens; they never block on the device. Every client-visible error has OpenAI's error shape and
a 4xx status with a message a person can act on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import logging
import math
import os
import sqlite3
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from fairlane import __version__
from fairlane import config as config_mod
from fairlane.api.chat import cancel_completion, chat_completions
from fairlane.api.common import (
    CLIENT_GRANT,
    CLIENT_TOKEN,
    SERVICES,
    WYOMING,
    ApiError,
    Services,
    services_of,
)
from fairlane.api.documents import (
    add_document,
    add_summary,
    delete_document,
    get_document,
    get_summary,
    job,
    jobs,
    list_documents,
    search_documents,
    start_workers,
    stop_workers,
)
from fairlane.api.embeddings import embeddings
from fairlane.api.model_pulls import (
    cancel_pull,
    get_pull,
    list_catalogue,
    list_pulls,
    start_pull,
)
from fairlane.api.openapi import document, operation, operation_of
from fairlane.api.remote import api_error
from fairlane.api.speech import transcriptions
from fairlane.api.voice import speech, voices
from fairlane.documents.store import progress
from fairlane.policy import Kind, Priority
from fairlane.runtime.components import storage_full
from fairlane.runtime.device import DeviceLoop, StepRecord
from fairlane.runtime.overhead import host_overhead
from fairlane.runtime.prediction import WINDOW_S, background_steps, prediction_error
from fairlane.runtime.remote import RemoteError
from fairlane.startup import StartupError, build_services, exposure_warnings
from fairlane.voice import bounds, wyoming

_LOGGER = logging.getLogger(__name__)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as err:
        return err.response()
    except RemoteError as err:  # a remote lane's failure (embeddings; chat maps its own)
        return api_error(err).response()
    except (OSError, sqlite3.OperationalError) as err:
        if not storage_full(err):
            raise
        _LOGGER.error("%s %s: the disk is full", request.method, request.path)
        return ApiError(
            507,
            "the server's disk is full: nothing was stored; free space and try again",
            kind="server_error",
            code="insufficient_storage",
        ).response()
    except web.HTTPRequestEntityTooLarge as err:
        return ApiError(
            413, f"the body is larger than the limit ({err.text})", code="body_too_large"
        ).response()
    except web.HTTPException as err:
        if err.status >= 400:
            response = ApiError(err.status, err.reason, kind="invalid_request_error").response()
            if isinstance(err, web.HTTPMethodNotAllowed):  # say which methods the route takes
                response.headers["Allow"] = ", ".join(sorted(err.allowed_methods))
            return response
        raise


# Open to everyone: liveness, and the dashboard page (it holds no data; it reads /v1/stats).


def auth_middleware(server: config_mod.ServerConfig) -> Any:
    """Bearer tokens: `server.token` may claim every class; each of `server.clients` has its
    own token and class ceiling, which the handlers read from the request (CLIENT_GRANT)."""
    grants: list[tuple[bytes, Priority | None, str]] = []
    if server.token is not None:
        grants.append((server.token.encode(), None, "server"))
    grants += [(c.token.encode(), Priority.parse(c.max_class), c.name) for c in server.clients]

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        public = request.method in ("GET", "HEAD") and request.path in PUBLIC_PATHS
        if not grants or public:
            return await handler(request)
        reading_stats = request.method == "GET" and request.path == "/v1/stats"
        if reading_stats and request.remote in server.stats_readers:
            return await handler(request)
        supplied = request.headers.get("Authorization", "")
        scheme, _, value = supplied.partition(" ")
        # Bytes: compare_digest refuses str with non-ASCII characters (a 500 before).
        given = value.strip().encode("utf-8", "surrogateescape")
        # Every token is compared, so the time taken does not say which one nearly matched.
        matches = [
            (ceiling, name) for token, ceiling, name in grants
            if hmac.compare_digest(given, token)
        ]
        if scheme.lower() != "bearer" or not matches:
            return ApiError(
                401,
                "missing or wrong bearer token",
                kind="authentication_error",
                code="invalid_api_key",
            ).response()
        ceiling, request[CLIENT_TOKEN] = matches[0]
        if ceiling is not None:
            request[CLIENT_GRANT] = ceiling
        return await handler(request)

    return check


def create_app(services: Services) -> web.Application:
    max_bytes = int(services.config.server.max_body_mb * 1024 * 1024)
    app = web.Application(
        client_max_size=max_bytes,
        middlewares=[
            error_middleware,
            auth_middleware(services.config.server),
        ],
    )
    app[SERVICES] = services
    app.add_routes(ROUTES)
    app.on_startup.append(_start_wyoming)
    app.on_startup.append(start_workers)
    app.on_cleanup.append(_stop_wyoming)
    app.on_cleanup.append(stop_workers)
    app.on_cleanup.append(_close_remotes)
    return app


async def _close_remotes(app: web.Application) -> None:
    for lane in app[SERVICES].remotes:
        await lane.close()


@operation(
    "Liveness (no auth), answered from memory: status (failed, with HTTP 503, when a device "
    "loop stopped on a fault: faults says which and why; degraded when an engine did not get the "
    "device asked for, a component is retrying or a remote lane's breaker is not closed), "
    "devices, components (indexer, summariser: state, error, failures), remotes (state, "
    "failures, error), version, instance_id (stable per data directory), models, Wyoming port",
    ok={200: "Running (ok or degraded)", 503: "A device loop stopped on a fault (failed)"},
    errors=(),
    public=True,
)
async def health(request: web.Request) -> web.Response:
    """Liveness and what is wrong: answered from memory (no lock, no database, no device), so
    it stays fast while the device and the event loop are busy."""
    svc = services_of(request)
    devices = {p.engine: p.as_dict() for p in svc.placements}
    components = {name: c.as_dict() for name, c in svc.components.items()}
    remotes = {e.name: e.health() for lane in svc.remotes for e in lane.engines}
    faults = svc.device.faults()
    healthy = (
        all(p.ok for p in svc.placements)
        and all(c.state != "retrying" for c in svc.components.values())
        and all(r["state"] == "closed" for r in remotes.values())
    )
    status = "failed" if faults else "ok" if healthy else "degraded"
    return web.json_response(
        {
            # "failed" (HTTP 503): a device loop stopped on a fault (`faults`); its requests
            # were ended and new ones are refused until a restart, which the add-on's watchdog
            # does on a failing /health.
            # "degraded": an engine runs on another device than the one asked for, a part
            # (the indexer, the summariser) failed and is being retried, or a remote lane's
            # breaker is not closed (`remotes`); the server still answers, so this is a 200
            # (a watchdog's restart would not help).
            "status": status,
            "faults": faults,
            "devices": devices,
            "components": components,
            "remotes": remotes,
            "version": __version__,
            "instance_id": svc.instance_id,
            "policy": svc.policy_name,
            "models": {
                "llm": svc.model_name,
                "stt": svc.speech.model_name if svc.speech else None,
                "tts": svc.voice.voices[0] if svc.voice else None,
            },
            "wyoming_port": svc.wyoming_port,
            # A model the config names, pulled while the default serves: its bytes, rate,
            # ETA, then `restart_needed` (or `failed` with the `error`).
            "pulls": [p.as_dict() for p in svc.pulls.pulls] if svc.pulls else [],
            # Beyond the OpenAI API: `speculative_turns` (`fairlane_speculative` chat turns).
            "features": ["speculative_turns"],
        },
        status=503 if faults else 200,
    )


DASHBOARD = Path(__file__).with_name("web") / "dashboard.html"


@operation(
    "The live lane dashboard (HTML; it reads /v1/stats)", ok={200: "HTML page"}, errors=(),
    public=True,
)
async def dashboard(request: web.Request) -> web.FileResponse:
    """The live lane dashboard (also the add-on's ingress panel); it polls /v1/stats."""
    return web.FileResponse(DASHBOARD, headers={"Cache-Control": "no-cache"})


@operation("Models served")
async def list_models(request: web.Request) -> web.Response:
    svc = services_of(request)
    names = [svc.model_name] + ([svc.speech.model_name] if svc.speech else [])
    names += [svc.embed_name] if svc.embedder else []
    names += svc.voice.voices if svc.voice else []
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "fairlane"} for name in names]
    return web.json_response({"object": "list", "data": data})


@operation(
    "Per-class TTFT/ITL/E2E percentiles, queues, KV, device use (the LLM's loop, and every loop "
    "in `devices`), steps, remote lanes"
)
async def stats(request: web.Request) -> web.Response:
    svc = services_of(request)
    body = svc.telemetry.stats(svc.device.snapshot())
    body["policy"] = svc.policy_name
    # Turns begun on a client's guess: held now, and since start started / claimed / discarded
    # (a different turn came, a newer guess, a cancel) / expired.
    body["speculation"] = svc.speculation.stats() if svc.speculation is not None else None
    # `device`: the LLM's loop (as before there were several); `devices`: each loop's.
    devices = {
        name: {"kinds": [k.value for k in loop.engines], **_device_use(loop, body["window_s"])}
        for name, loop in svc.device.loops.items()
    }
    body["device"] = devices[svc.device.loop_for(Kind.LLM).name]
    body["devices"] = devices
    records = svc.device.records
    now = svc.device.clock()
    window_s = _steps_window(request)
    body["steps"] = _step_summary(records)
    body["steps_window_s"] = window_s
    body["prediction_error"] = prediction_error(records, now, window_s)
    body["host_overhead"] = host_overhead(records, now, window_s)
    # The CPU LLM's threads now, beside the cores other processes hold (engines.cores).
    body["llm_threads"] = svc.engine.thread_use()
    # Background steps beside the slice each loop's policy bounds them by. A copy of each
    # loop's records (one C call, atomic): its thread appends to them while this runs.
    body["background_steps"] = {
        name: figures
        for name, loop in svc.device.loops.items()
        for figures in background_steps(
            list(loop.records), now, loop.policy.config.slice_s, window_s
        ).values()
    }
    if svc.remotes:
        body["remotes"] = {
            e.name: e.stats(lane.waiting()) for lane in svc.remotes for e in lane.engines
        }
    if svc.documents is not None:
        documents = await asyncio.to_thread(svc.documents.documents)
        body["background"] = {"indexing": progress(documents, svc.started_at)}
    return web.json_response(body)


@operation("Prometheus metrics", ok={200: "Prometheus text format"})
async def metrics(request: web.Request) -> web.Response:
    svc = services_of(request)
    svc.telemetry.prediction_error(prediction_error(svc.device.records, svc.device.clock()))
    return web.Response(
        body=svc.telemetry.prometheus(svc.device.snapshot()),
        content_type="text/plain",
        charset="utf-8",
    )


@operation("This document (OpenAPI 3.1)", errors=())
async def openapi(request: web.Request) -> web.Response:
    return web.json_response(OPENAPI)


# Every route: the app serves these, and the OpenAPI document is made from their handlers.
ROUTES = [
    web.get("/health", health),
    web.get("/", dashboard),
    web.get("/dashboard", dashboard),
    web.get("/v1/models", list_models),
    web.get("/v1/models/catalogue", list_catalogue),
    web.post("/v1/models/pull", start_pull),
    web.get("/v1/models/pull", list_pulls),
    web.get("/v1/models/pull/{id}", get_pull),
    web.delete("/v1/models/pull/{id}", cancel_pull),
    web.post("/v1/chat/completions", chat_completions),
    web.post("/v1/chat/completions/{id}/cancel", cancel_completion),
    web.post("/v1/audio/transcriptions", transcriptions),
    web.post("/v1/audio/speech", speech),
    web.get("/v1/audio/voices", voices),
    web.post("/v1/embeddings", embeddings),
    web.post("/v1/documents", add_document),
    web.get("/v1/documents", list_documents),
    web.post("/v1/documents/search", search_documents),
    web.get("/v1/documents/{id}", get_document),
    web.delete("/v1/documents/{id}", delete_document),
    web.get("/v1/jobs", jobs),
    web.get("/v1/jobs/{id}", job),
    web.post("/v1/summaries", add_summary),
    web.get("/v1/summaries/{id}", get_summary),
    web.get("/v1/stats", stats),
    web.get("/metrics", metrics),
    web.get("/openapi.json", openapi),
]
OPENAPI = document(ROUTES)
# Answered without a bearer token: the operations declared public.
PUBLIC_PATHS = frozenset(route.path for route in ROUTES if operation_of(route.handler).public)


def _steps_window(request: web.Request) -> float:
    """`?steps_window_s=`: the seconds the step figures look back over (a benchmark reads one
    phase's); 5 minutes unless given."""
    raw = request.query.get("steps_window_s")
    if raw is None:
        return WINDOW_S
    try:
        window_s = float(raw)
    except ValueError:
        window_s = math.nan
    if not 0 < window_s <= 86_400:
        raise ApiError(
            400, "steps_window_s: seconds, above 0 and at most 86400", param="steps_window_s"
        )
    return window_s


def _device_use(device: DeviceLoop, window_s: float) -> dict[str, Any]:
    """How busy the device was over the window, and each class's share of that busy time.

    A step that carried several classes counts for each of them, so shares may sum past 1.
    """
    since = device.clock() - window_s
    busy = 0.0
    by_class = dict.fromkeys((p.label for p in Priority), 0.0)
    for record in list(device.records):
        seconds = record.end - max(record.start, since)
        if seconds <= 0:
            continue
        busy += seconds
        for label in {p.label for p in record.classes}:
            by_class[label] += seconds
    return {
        "busy": round(min(busy / max(window_s, 1e-6), 1.0), 4),
        "share": {label: round(s / busy, 4) if busy else 0.0 for label, s in by_class.items()},
        # Since start (counters): seconds in steps, and in steps that carried each class.
        "busy_s_total": round(device.busy_s, 3),
        "class_busy_s_total": {label: round(s, 3) for label, s in device.class_busy_s.items()},
        "interactive_busy_s_total": round(device.interactive_busy_s, 3),
        "background_busy_s_total": {
            kind: round(s, 3) for kind, s in device.background_busy_s.items()
        },
        # LLM tokens computed per class (prompt and output, each position once; a prompt
        # half done counts what is done): two reads give a period's work.
        "class_llm_tokens_total": dict(device.class_llm_tokens),
    }


def _step_summary(records: list[StepRecord], last: int = 50) -> list[dict[str, Any]]:
    return [
        {
            "device": r.device,
            "start": round(r.start, 4),
            "end": round(r.end, 4),
            "kind": r.kind.value,
            "classes": sorted({p.label for p in r.classes}),
            "sequences": len(r.request_ids),
            "prefill_tokens": r.prefill_tokens,
            "decode_seqs": r.decode_seqs,
            "predicted_ms": round(r.predicted_s * 1000, 2),  # the cost model's, when planned
        }
        for r in records[-last:]
    ]


# --- start-up ----------------------------------------------------------------------------------


async def _start_wyoming(app: web.Application) -> None:
    svc = app[SERVICES]
    if (svc.speech is None and svc.voice is None) or not svc.config.wyoming.enabled:
        return
    host = svc.config.wyoming.host or svc.config.server.host
    services = wyoming.WyomingServices(
        svc.speech,
        svc.voice,
        early=svc.config.wyoming.early_transcript,
        max_connections=svc.config.wyoming.max_connections,
        priority=Priority.parse(svc.config.wyoming.max_class),
        idle_timeout_s=svc.config.wyoming.idle_timeout_s,
        clients=bounds.networks(svc.config.wyoming.clients),
    )
    svc.wyoming = services
    server = await wyoming.start(services, host, svc.config.wyoming.port)
    svc.wyoming_port = wyoming.bound_port(server)
    app[WYOMING] = server
    if services.clients:
        _LOGGER.info("Wyoming on tcp://%s:%d for %s", host, svc.wyoming_port,
                     ", ".join(svc.config.wyoming.clients))
    elif bounds.beyond_loopback(host):
        _LOGGER.warning(
            "Wyoming on tcp://%s:%d has no credentials and takes any client: list the ones "
            "that may connect in wyoming.clients", host, svc.wyoming_port)
    else:
        _LOGGER.info("Wyoming on tcp://%s:%d (loopback only)", host, svc.wyoming_port)


async def _stop_wyoming(app: web.Application) -> None:
    if WYOMING in app:
        await app[WYOMING].stop()


def serve(args: argparse.Namespace) -> int:
    """`fairlane serve`: flags override the config file; the token may come from FAIRLANE_TOKEN."""
    log_format = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.INFO, format=log_format)
    cfg = config_mod.load(args.config, args.set or ())
    server = cfg.server
    server = replace(
        server,
        host=args.host or server.host,
        port=args.port if args.port is not None else server.port,
        token=args.token or os.environ.get("FAIRLANE_TOKEN") or server.token,
    )
    if server.token is None and server.token_file:
        server = replace(server, token=config_mod.token_from_file(server.token_file))
    cfg = replace(cfg, server=server, policy_name=args.policy or cfg.policy_name)
    services = build_services(cfg)
    for warning in exposure_warnings(cfg):
        _LOGGER.warning("%s", warning)
    app = create_app(services)
    app.on_cleanup.append(lambda _app: _shutdown(services))
    print(
        f"fairlane {__version__}: {services.model_name} with the {cfg.policy_name} policy on "
        f"http://{cfg.server.host}:{cfg.server.port}",
        flush=True,
    )
    try:
        web.run_app(
            app,
            host=cfg.server.host,
            port=cfg.server.port,
            backlog=cfg.server.backlog,
            print=None,
            handle_signals=True,
            # A client that goes away cancels its handler: a non-streaming completion stops
            # generating, as a stream does (documents are stored before they are acknowledged).
            handler_cancellation=True,
        )
    except OSError as err:  # a port taken, an address not here: one line, not a traceback
        raise StartupError(f"cannot listen: {err.strerror or err}") from err
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
        self.runner = web.AppRunner(create_app(self.services), handler_cancellation=True)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", cfg.server.port, backlog=cfg.server.backlog)
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
        if self.services.data_lock is not None:
            self.services.data_lock.close()  # the data directory is free again

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
